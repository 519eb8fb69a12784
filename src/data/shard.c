/*
 * shard.c — the byte tokenizer and llm.c's version-1 .bin shard writer.
 * Why a writer in C as well as scripts/prepare_corpus.py: tests make shards without Python,
 * and the format is small enough that one definition of the header lives in data.h.
 */
#include "memwall/data.h"
#include "memwall/common.h"
#include "memwall/fsutil.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

void mw_tok_encode_bytes(const uint8_t *text, size_t n, uint16_t *out)
{
    for (size_t i = 0; i < n; i++) out[i] = text[i];
}

size_t mw_tok_decode(int token, char *buf, size_t n)
{
    if (n < 24) { if (n) buf[0] = 0; return 0; }
    if (token >= 0 && token < 256) { buf[0] = (char)token; buf[1] = 0; return 1; }
    int w = token == MW_TOK_EOT ? snprintf(buf, n, "\n<|endoftext|>\n") : snprintf(buf, n, "<%d>", token);
    return w > 0 ? (size_t)w : 0;
}

int mw_shard_write(const char *path, const uint16_t *tokens, size_t n)
{
    if (n > INT32_MAX)
        return mw_error_set(-EINVAL, "shard %s: %zu tokens do not fit the int32 count of the header", path, n);
    int32_t hdr[MW_SHARD_HEADER_INTS];
    memset(hdr, 0, sizeof hdr);
    hdr[0] = MW_SHARD_MAGIC;
    hdr[1] = MW_SHARD_VERSION;
    hdr[2] = (int32_t)n;
    struct mw_atomic_file af;
    int rc = mw_atomic_open(&af, path);
    if (rc) return rc;
    if (fwrite(hdr, sizeof hdr, 1, af.f) != 1 || (n && fwrite(tokens, 2, n, af.f) != n)) {
        int e = errno ? errno : EIO;
        rc = mw_error_set(-e, "writing shard %s failed: %s", af.tmp, strerror(e));
        mw_atomic_abort(&af);
        return rc;
    }
    return mw_atomic_commit(&af);
}
