/*
 * shard.c — the byte tokenizer and llm.c's .bin shard writer (version 1: uint16 tokens,
 * version 7: uint32 tokens).
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

/* One writer for both widths: tokens16 or tokens32 (the other NULL); wide picks the format. */
static int shard_write(const char *path, const uint16_t *tokens16, const uint32_t *tokens32, size_t n, int wide)
{
    if (n > INT32_MAX)
        return mw_error_set(-EINVAL, "shard %s: %zu tokens do not fit the int32 count of the header", path, n);
    if (!wide && tokens32)
        for (size_t i = 0; i < n; i++)
            if (tokens32[i] > UINT16_MAX)
                return mw_error_set(-ERANGE, "shard %s: token %u (at %zu) does not fit a uint16 shard", path,
                                    tokens32[i], i);
    int32_t hdr[MW_SHARD_HEADER_INTS];
    memset(hdr, 0, sizeof hdr);
    hdr[0] = wide ? MW_SHARD32_MAGIC : MW_SHARD_MAGIC;
    hdr[1] = wide ? MW_SHARD32_VERSION : MW_SHARD_VERSION;
    hdr[2] = (int32_t)n;
    struct mw_atomic_file af;
    int rc = mw_atomic_open(&af, path);
    if (rc) return rc;
    int ok = fwrite(hdr, sizeof hdr, 1, af.f) == 1;
    if (ok && tokens16) ok = !n || fwrite(tokens16, 2, n, af.f) == n;
    else if (ok && wide) ok = !n || fwrite(tokens32, 4, n, af.f) == n;
    else {
        uint16_t buf[4096];
        for (size_t i = 0; ok && i < n; i += 4096) {
            size_t k = MW_MIN(n - i, (size_t)4096);
            for (size_t j = 0; j < k; j++) buf[j] = (uint16_t)tokens32[i + j];
            ok = fwrite(buf, 2, k, af.f) == k;
        }
    }
    if (!ok) {
        int e = errno ? errno : EIO;
        char note[256];
        rc = mw_error_set(-e, "writing shard %s failed: %s%s", af.tmp, strerror(e),
                          mw_fs_full_note(-e, path, note, sizeof note));
        mw_atomic_abort(&af);
        return rc;
    }
    return mw_atomic_commit(&af);
}

int mw_shard_write(const char *path, const uint16_t *tokens, size_t n)
{
    return shard_write(path, tokens, NULL, n, 0);
}

int mw_shard_write_ids(const char *path, const uint32_t *tokens, size_t n, int wide)
{
    return shard_write(path, NULL, tokens, n, wide);
}
