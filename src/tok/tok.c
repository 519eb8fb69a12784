/*
 * tok.c — loading a Hugging Face tokenizer.json into an mw_tok_t, and the encode/decode entry
 * points (tok.h has the contract; pretok.c and bpe.c do the work).
 *
 * The file is hostile input: every field is type-checked, every id is a whole number below
 * MW_TOK_MAX_VOCAB (so that the id-indexed tables cannot be made huge), every merge must name
 * vocabulary entries, and every part of the pipeline memwall does not implement is refused by
 * name (a tokenizer that loads and then silently gives other ids than HF would be worse than one
 * that does not load). What is accepted: see tok.h and docs/tokenizer.md.
 *
 * Order of loading, and why: vocabulary first (ids, byte-level spellings mapped back to bytes),
 * then merges (they look up the vocabulary only, as HF's BPE does), then added tokens (which may
 * share an id with a vocabulary entry: for decoding, the added token's content wins, as in HF),
 * then the normalizer (added tokens marked "normalized" are matched in normalized form), the
 * pre-tokenizer and the post-processor.
 */
#include "tok/tok_impl.h"
#include "memwall/common.h"
#include "memwall/fsutil.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- the byte-to-unicode map (GPT-2's bytes_to_unicode) ----
 * Bytes that are printable Latin-1 ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves; the other
 * 68 bytes, in increasing order, take U+0100, U+0101, ... (so ' ' is U+0120 'Ġ'). */
static uint32_t b2u[256];
static int16_t u2b[0x200]; /* code point < 0x200 -> byte, -1 if none */

static void byte_map_init(void)
{
    if (b2u['A']) return; /* idempotent: the same values every time, so a race is harmless */
    uint32_t next = 0x100;
    for (int i = 0; i < 0x200; i++) u2b[i] = -1;
    for (int b = 0; b < 256; b++) {
        int self = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
        uint32_t u = self ? (uint32_t)b : next++;
        u2b[u] = (int16_t)b;
        b2u[b] = u;
    }
}

/* ---- small helpers ---- */

static int arena_add(char **arena, size_t *len, size_t *cap, const void *p, size_t n, size_t *off)
{
    if (*len + n > *cap) {
        size_t c = *cap ? *cap : 1 << 16;
        while (c < *len + n) c *= 2;
        char *a = realloc(*arena, c);
        if (!a) return mw_error_set(-ENOMEM, "no memory for %zu bytes of token strings", c);
        *arena = a;
        *cap = c;
    }
    memcpy(*arena + *len, p, n);
    *off = *len;
    *len += n;
    return 0;
}

/* A JSON field that must be a boolean when present. */
static int jbool(const mw_tok_t *t, const cJSON *o, const char *key, int def, int *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) { *out = def; return 0; }
    if (!cJSON_IsBool(v)) return mw_error_set(MW_EFORMAT, "%s: \"%s\" must be true or false", t->what, key);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* A JSON field that must be a string when present; NULL when absent or null. */
static int jstr(const mw_tok_t *t, const cJSON *o, const char *key, const char **out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = NULL;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsString(v)) return mw_error_set(MW_EFORMAT, "%s: \"%s\" must be a string", t->what, key);
    *out = v->valuestring;
    return 0;
}

static int jid(const mw_tok_t *t, const cJSON *v, const char *what, int32_t *out)
{
    int64_t x;
    if (!cJSON_IsNumber(v) || mw_f64_to_i64(v->valuedouble, 0, MW_TOK_MAX_VOCAB - 1, 1, &x))
        return mw_error_set(MW_EFORMAT, "%s: %s must be a whole number in [0, %d)", t->what, what, MW_TOK_MAX_VOCAB);
    *out = (int32_t)x;
    return 0;
}

static int valid_utf8(const char *s, size_t n)
{
    uint32_t cp;
    for (size_t i = 0, cl; i < n; i += cl)
        if (!(cl = tok_utf8_next((const unsigned char *)s + i, n - i, &cp))) return 0;
    return 1;
}

/* A short printable rendering of a token string for messages. */
static const char *shown(const char *s, char *buf, size_t n)
{
    size_t o = 0;
    for (; *s && o + 8 < n; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 0x20 && c != 0x7f && c != '\'') buf[o++] = (char)c;
        else o += (size_t)snprintf(buf + o, n - o, "\\x%02x", c);
    }
    if (*s) snprintf(buf + o, n - o, "...");
    else buf[o] = 0;
    return buf;
}

/* ---- model ---- */

/* The bytes a vocabulary string stands for when every character is a byte-level one; 0 when it
 * is not (then the string's own UTF-8 is what it decodes to). */
static int byte_level_bytes(const char *s, size_t n, char *out, size_t *out_len)
{
    size_t k = 0;
    uint32_t cp;
    for (size_t i = 0, cl; i < n; i += cl) {
        cl = tok_utf8_next((const unsigned char *)s + i, n - i, &cp);
        if (!cl || cp >= 0x200 || u2b[cp] < 0) return 0;
        out[k++] = (char)u2b[cp];
    }
    *out_len = k;
    return 1;
}

static int set_span(mw_tok_t *t, int32_t id, const char *bytes, size_t n)
{
    size_t off;
    if (n >= (1u << 24)) return mw_error_set(MW_EFORMAT, "%s: token %d is %zu bytes long", t->what, id, n);
    int err = arena_add(&t->arena, &t->arena_len, &t->arena_cap, bytes, n, &off);
    if (err) return err;
    t->id_span[id] = (uint64_t)off << 24 | n;
    return 0;
}

static int load_vocab(mw_tok_t *t, const cJSON *vocab, int32_t max_added)
{
    if (!cJSON_IsObject(vocab))
        return mw_error_set(MW_EFORMAT, "%s: model.vocab must be an object of token -> id", t->what);
    int32_t max_id = max_added;
    size_t count = 0;
    int err;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        int32_t id;
        char b[120];
        if (!e->string) return mw_error_set(MW_EFORMAT, "%s: model.vocab has an entry without a name", t->what);
        if (jid(t, e, "a vocabulary id", &id))
            return mw_error_set(MW_EFORMAT, "%s: model.vocab['%s'] must be a whole number in [0, %d)", t->what,
                                shown(e->string, b, sizeof b), MW_TOK_MAX_VOCAB);
        max_id = MW_MAX(max_id, id);
        count++;
    }
    t->n_ids = max_id + 1;
    t->id_span = malloc((size_t)t->n_ids * sizeof *t->id_span);
    t->is_special = calloc((size_t)t->n_ids, 1);
    if (!t->id_span || !t->is_special)
        return mw_error_set(-ENOMEM, "no memory for a vocabulary of %d ids", t->n_ids);
    memset(t->id_span, 0xff, (size_t)t->n_ids * sizeof *t->id_span);
    if ((err = tok_strmap_init(&t->by_text, count + 64)) || (err = tok_strmap_init(&t->by_bytes, count + 64))) return err;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        int32_t id;
        jid(t, e, "", &id); /* checked above */
        size_t n = strlen(e->string), off, bl;
        char *bytes = malloc(n + 1);
        if (!bytes) return mw_error_set(-ENOMEM, "no memory");
        int bytelevel = byte_level_bytes(e->string, n, bytes, &bl);
        if (!bytelevel) { memcpy(bytes, e->string, n); bl = n; }
        err = arena_add(&t->text_arena, &t->text_len, &t->text_cap, e->string, n, &off);
        if (!err) err = tok_strmap_put(&t->by_text, t->text_arena, off, n, id);
        if (!err) err = set_span(t, id, bytes, bl);
        if (!err && bytelevel) err = tok_strmap_put(&t->by_bytes, t->arena, (size_t)(t->id_span[id] >> 24), bl, id);
        free(bytes);
        if (err) return err;
    }
    return 0;
}

static int vocab_id(const mw_tok_t *t, const char *s, size_t n)
{
    return tok_strmap_get(&t->by_text, t->text_arena, s, n);
}

static int load_merges(mw_tok_t *t, const cJSON *merges)
{
    if (!merges || cJSON_IsNull(merges)) return tok_pairmap_init(&t->merges, 16);
    if (!cJSON_IsArray(merges))
        return mw_error_set(MW_EFORMAT, "%s: model.merges must be an array of \"a b\" strings or [\"a\", \"b\"] pairs",
                            t->what);
    int n = cJSON_GetArraySize(merges), err;
    if ((err = tok_pairmap_init(&t->merges, (size_t)n))) return err;
    char *buf = NULL;
    size_t cap = 0;
    uint32_t rank = 0;
    for (const cJSON *m = merges->child; m; m = m->next, rank++) {
        const char *a, *b;
        size_t la, lb;
        if (cJSON_IsString(m)) {
            /* HF: exactly one space (byte-level tokens never hold one: ' ' is spelled 'Ġ'). */
            const char *sp = strchr(m->valuestring, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                char sb[120];
                err = mw_error_set(MW_EFORMAT, "%s: merge %u '%s' is not two tokens separated by one space", t->what,
                                   rank + 1, shown(m->valuestring, sb, sizeof sb));
                goto out;
            }
            a = m->valuestring;
            la = (size_t)(sp - a);
            b = sp + 1;
            lb = strlen(b);
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
                   cJSON_IsString(m->child->next)) {
            a = m->child->valuestring;
            la = strlen(a);
            b = m->child->next->valuestring;
            lb = strlen(b);
        } else {
            err = mw_error_set(MW_EFORMAT, "%s: merge %u is neither an \"a b\" string nor an [\"a\", \"b\"] pair", t->what,
                               rank + 1);
            goto out;
        }
        if (la + lb + 1 > cap) {
            cap = 2 * (la + lb + 1);
            char *nb = realloc(buf, cap);
            if (!nb) { err = mw_error_set(-ENOMEM, "no memory"); goto out; }
            buf = nb;
        }
        memcpy(buf, a, la);
        memcpy(buf + la, b, lb);
        buf[la + lb] = 0;
        int32_t ia = vocab_id(t, a, la), ib = vocab_id(t, b, lb), im = vocab_id(t, buf, la + lb);
        if (ia < 0 || ib < 0 || im < 0) {
            char sa[80], sb[80], sm[80];
            char ca[200], cb[200];
            snprintf(ca, sizeof ca, "%.*s", (int)MW_MIN(la, sizeof ca - 1), a);
            snprintf(cb, sizeof cb, "%.*s", (int)MW_MIN(lb, sizeof cb - 1), b);
            err = mw_error_set(MW_EFORMAT, "%s: merge %u ('%s' + '%s') names a token that is not in the vocabulary: '%s'",
                               t->what, rank + 1, shown(ca, sa, sizeof sa), shown(cb, sb, sizeof sb),
                               ia < 0 ? sa : ib < 0 ? sb : shown(buf, sm, sizeof sm));
            goto out;
        }
        if ((err = tok_pairmap_put(&t->merges, ia, ib, rank, im))) goto out;
    }
out:
    free(buf);
    return err;
}

static int load_model(mw_tok_t *t, const cJSON *model, int32_t max_added)
{
    if (!cJSON_IsObject(model))
        return mw_error_set(MW_EFORMAT, "%s: no \"model\" object: not a Hugging Face tokenizer.json", t->what);
    const char *type, *unk, *pfx, *sfx;
    int err;
    if ((err = jstr(t, model, "type", &type))) return err;
    if (type ? strcmp(type, "BPE") : !cJSON_GetObjectItemCaseSensitive(model, "merges")) {
        char b[80];
        return mw_error_set(MW_EFORMAT, "%s: unknown model type '%s': memwall reads byte-level BPE tokenizers only "
                            "(GPT-2, Llama-3, Qwen2 and the like), not WordPiece, Unigram or WordLevel", t->what,
                            type ? shown(type, b, sizeof b) : "(none)");
    }
    if ((err = jstr(t, model, "unk_token", &unk)) || (err = jstr(t, model, "continuing_subword_prefix", &pfx)) ||
        (err = jstr(t, model, "end_of_word_suffix", &sfx)))
        return err;
    if ((pfx && *pfx) || (sfx && *sfx))
        return mw_error_set(MW_EFORMAT, "%s: a BPE model with a continuing_subword_prefix or end_of_word_suffix is not "
                            "byte-level; memwall does not read it", t->what);
    if ((err = jbool(t, model, "fuse_unk", 0, &t->fuse_unk)) ||
        (err = jbool(t, model, "byte_fallback", 0, &t->byte_fallback)) ||
        (err = jbool(t, model, "ignore_merges", 0, &t->ignore_merges)))
        return err;
    /* dropout: a training-time option; HF applies it at encode time when set, which makes ids
     * random. memwall always encodes deterministically (as with dropout null). */
    if ((err = load_vocab(t, cJSON_GetObjectItemCaseSensitive(model, "vocab"), max_added))) return err;
    if ((err = load_merges(t, cJSON_GetObjectItemCaseSensitive(model, "merges")))) return err;
    t->unk_id = -1;
    if (unk) {
        t->unk_id = vocab_id(t, unk, strlen(unk));
        if (t->unk_id < 0) {
            char b[80];
            return mw_error_set(MW_EFORMAT, "%s: unk_token '%s' is not in the vocabulary", t->what, shown(unk, b, sizeof b));
        }
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_id[b] = tok_strmap_get(&t->by_bytes, t->arena, &c, 1);
        t->fallback_n[b] = 0;
        if (t->byte_id[b] >= 0 || !t->byte_fallback) continue;
        /* HF's byte fallback: "<0xXX>" for each byte of the (byte-level) character's UTF-8. */
        uint32_t u = b2u[b];
        unsigned char utf[2] = {(unsigned char)(u < 0x80 ? u : 0xc0 | u >> 6), (unsigned char)(0x80 | (u & 0x3f))};
        int n = u < 0x80 ? 1 : 2, ok = 1;
        for (int j = 0; j < n; j++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", utf[j]);
            t->fallback_ids[b][j] = vocab_id(t, name, 6);
            ok &= t->fallback_ids[b][j] >= 0;
        }
        if (ok) t->fallback_n[b] = (unsigned char)n;
    }
    return 0;
}

/* ---- added tokens ---- */

static int max_added_id(const mw_tok_t *t, const cJSON *added, int32_t *max)
{
    *max = -1;
    if (!added || cJSON_IsNull(added)) return 0;
    if (!cJSON_IsArray(added)) return mw_error_set(MW_EFORMAT, "%s: \"added_tokens\" must be an array", t->what);
    int i = 0;
    for (const cJSON *a = added->child; a; a = a->next, i++) {
        int32_t id;
        char what[64];
        snprintf(what, sizeof what, "added_tokens[%d].id", i);
        if (!cJSON_IsObject(a)) return mw_error_set(MW_EFORMAT, "%s: added_tokens[%d] must be an object", t->what, i);
        int err = jid(t, cJSON_GetObjectItemCaseSensitive(a, "id"), what, &id);
        if (err) return err;
        *max = MW_MAX(*max, id);
    }
    return 0;
}

struct order_ctx { const mw_tok_t *t; int pass; };

static int added_cmp(const void *x, const void *y, void *ctx)
{
    const struct order_ctx *c = ctx;
    const struct tok_added *a = &c->t->added[*(const int32_t *)x], *b = &c->t->added[*(const int32_t *)y];
    const char *sa = c->pass ? a->norm : a->content, *sb = c->pass ? b->norm : b->content;
    size_t la = c->pass ? a->norm_len : a->len, lb = c->pass ? b->norm_len : b->len;
    if ((unsigned char)sa[0] != (unsigned char)sb[0]) return (unsigned char)sa[0] < (unsigned char)sb[0] ? -1 : 1;
    if (la != lb) return la > lb ? -1 : 1; /* longest first */
    return *(const int32_t *)x - *(const int32_t *)y;
}

static int load_added(mw_tok_t *t, const cJSON *added)
{
    int n = added && cJSON_IsArray(added) ? cJSON_GetArraySize(added) : 0, err;
    t->added = calloc((size_t)MW_MAX(n, 1), sizeof *t->added);
    if (!t->added) return mw_error_set(-ENOMEM, "no memory");
    int i = 0;
    for (const cJSON *a = n ? added->child : NULL; a; a = a->next, i++) {
        const char *content;
        int32_t id;
        int special, lstrip, rstrip, single, normalized;
        if ((err = jstr(t, a, "content", &content))) return err;
        jid(t, cJSON_GetObjectItemCaseSensitive(a, "id"), "", &id); /* checked by max_added_id */
        if ((err = jbool(t, a, "special", 0, &special)) || (err = jbool(t, a, "lstrip", 0, &lstrip)) ||
            (err = jbool(t, a, "rstrip", 0, &rstrip)) || (err = jbool(t, a, "single_word", 0, &single)) ||
            (err = jbool(t, a, "normalized", !special, &normalized)))
            return err;
        if (!content) return mw_error_set(MW_EFORMAT, "%s: added_tokens[%d] has no \"content\" string", t->what, i);
        size_t len = strlen(content);
        if (!valid_utf8(content, len))
            return mw_error_set(MW_EFORMAT, "%s: added_tokens[%d] (id %d) is not valid UTF-8", t->what, i, id);
        /* Every added token is known by its text and decodes to it. */
        size_t off;
        if ((err = arena_add(&t->text_arena, &t->text_len, &t->text_cap, content, len, &off)) ||
            (err = tok_strmap_put(&t->by_text, t->text_arena, off, len, id)) || (err = set_span(t, id, content, len)))
            return err;
        t->is_special[id] = (unsigned char)special;
        if (!len) continue; /* HF ignores an empty added token when splitting */
        struct tok_added *ad = &t->added[t->n_added];
        ad->content = strdup(content);
        if (!ad->content) return mw_error_set(-ENOMEM, "no memory");
        ad->len = len;
        ad->id = id;
        ad->special = (unsigned char)special;
        ad->lstrip = (unsigned char)lstrip;
        ad->rstrip = (unsigned char)rstrip;
        ad->single_word = (unsigned char)single;
        ad->normalized = (unsigned char)normalized;
        char *norm = NULL;
        size_t nl = 0;
        if (normalized && t->nfc && (err = tok_nfc(content, len, &norm, &nl))) return err;
        ad->norm = norm ? norm : ad->content;
        ad->norm_len = norm ? nl : len;
        t->n_added++;
    }
    /* The two matching sets, each indexed by first byte, longest first. */
    for (int p = 0; p < 2; p++) {
        t->added_order[p] = malloc((size_t)MW_MAX(t->n_added, 1) * sizeof *t->added_order[p]);
        if (!t->added_order[p]) return mw_error_set(-ENOMEM, "no memory");
        uint32_t k = 0;
        for (int j = 0; j < t->n_added; j++)
            if (t->added[j].normalized == p) t->added_order[p][k++] = j;
        struct order_ctx ctx = {t, p};
        qsort_r(t->added_order[p], k, sizeof *t->added_order[p], added_cmp, &ctx);
        memset(t->added_first[p], 0, sizeof t->added_first[p]);
        for (uint32_t j = 0; j < k; j++) {
            const struct tok_added *ad = &t->added[t->added_order[p][j]];
            t->added_first[p][(unsigned char)(p ? ad->norm : ad->content)[0] + 1]++;
        }
        for (int c = 0; c < 256; c++) t->added_first[p][c + 1] += t->added_first[p][c];
    }
    return 0;
}

/* ---- normalizer, pre-tokenizer, post-processor ---- */

static int load_normalizer(mw_tok_t *t, const cJSON *n, int depth)
{
    if (!n || cJSON_IsNull(n)) return 0;
    const char *type = NULL;
    int err;
    if (!cJSON_IsObject(n) || (err = jstr(t, n, "type", &type)) || !type)
        return mw_error_set(MW_EFORMAT, "%s: the normalizer must be null or an object with a \"type\"", t->what);
    if (!strcmp(type, "NFC")) { t->nfc = 1; return 0; }
    if (!strcmp(type, "Sequence") && depth < 4) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        if (!cJSON_IsArray(list)) return mw_error_set(MW_EFORMAT, "%s: a Sequence normalizer needs \"normalizers\"", t->what);
        for (const cJSON *c = list->child; c; c = c->next)
            if ((err = load_normalizer(t, c, depth + 1))) return err;
        return 0;
    }
    char b[80];
    return mw_error_set(MW_EFORMAT, "%s: normalizer '%s' is not supported (memwall applies none or NFC, as GPT-2, "
                        "Llama-3 and Qwen2 do)", t->what, shown(type, b, sizeof b));
}

static int add_step(mw_tok_t *t, struct tok_step **out)
{
    if (t->nsteps == TOK_MAX_STEPS)
        return mw_error_set(MW_EFORMAT, "%s: more than %d pre-tokenizer steps", t->what, TOK_MAX_STEPS);
    *out = &t->steps[t->nsteps++];
    memset(*out, 0, sizeof **out);
    return 0;
}

static int load_pretok(mw_tok_t *t, const cJSON *p, int depth)
{
    const char *type = NULL;
    int err;
    if (!cJSON_IsObject(p) || (err = jstr(t, p, "type", &type)) || !type)
        return mw_error_set(MW_EFORMAT, "%s: the pre-tokenizer must be an object with a \"type\"", t->what);
    struct tok_step *st = NULL;
    if (!strcmp(type, "Sequence") && depth < 4) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        if (!cJSON_IsArray(list))
            return mw_error_set(MW_EFORMAT, "%s: a Sequence pre-tokenizer needs \"pretokenizers\"", t->what);
        for (const cJSON *c = list->child; c; c = c->next)
            if ((err = load_pretok(t, c, depth + 1))) return err;
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) {
        int use_regex;
        if ((err = add_step(t, &st))) return err;
        st->kind = TOK_STEP_BYTELEVEL;
        st->behavior = TOK_SPLIT_ISOLATED;
        /* HF's defaults when a field is missing: add_prefix_space and use_regex true. */
        if ((err = jbool(t, p, "add_prefix_space", 1, &st->add_prefix_space)) ||
            (err = jbool(t, p, "use_regex", 1, &use_regex)))
            return err;
        if (use_regex && (err = tok_regex_compile(&st->re, tok_gpt2_pattern, strlen(tok_gpt2_pattern), t->what)))
            return err;
        return 0;
    }
    if (!strcmp(type, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const char *re = NULL, *lit = NULL, *beh = NULL;
        if (!cJSON_IsObject(pat) || (err = jstr(t, pat, "Regex", &re)) || (err = jstr(t, pat, "String", &lit)) ||
            (!re && !lit))
            return mw_error_set(MW_EFORMAT, "%s: a Split pre-tokenizer needs \"pattern\": {\"Regex\": ...} or "
                                "{\"String\": ...}", t->what);
        if ((err = add_step(t, &st))) return err;
        if (re) {
            st->kind = TOK_STEP_REGEX;
            if ((err = tok_regex_compile(&st->re, re, strlen(re), t->what))) return err;
        } else {
            st->kind = TOK_STEP_STRING;
            st->lit_len = strlen(lit);
            if (!(st->lit = strdup(lit))) return mw_error_set(-ENOMEM, "no memory");
        }
        static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        if ((err = jstr(t, p, "behavior", &beh))) return err;
        int k = 0;
        while (k < 5 && !(beh && !strcmp(beh, names[k]))) k++;
        if (k == 5)
            return mw_error_set(MW_EFORMAT, "%s: Split behavior must be one of Removed, Isolated, MergedWithPrevious, "
                                "MergedWithNext, Contiguous", t->what);
        st->behavior = (enum tok_split_behavior)k;
        return jbool(t, p, "invert", 0, &st->invert);
    }
    char b[80];
    return mw_error_set(MW_EFORMAT, "%s: pre-tokenizer '%s' is not supported: memwall reads byte-level BPE (Split steps "
                        "with a regex or string, then ByteLevel)", t->what, shown(type, b, sizeof b));
}

static int post_add(mw_tok_t *t, int32_t *v, int *n, int32_t id)
{
    if (*n == 8) {
        snprintf(t->post_unsupported, sizeof t->post_unsupported, "the post-processor adds more than 8 tokens");
        return 0;
    }
    if (id < 0 || id >= t->n_ids || t->id_span[id] == UINT64_MAX)
        return mw_error_set(MW_EFORMAT, "%s: the post-processor's token id %d is not in the vocabulary", t->what, id);
    v[(*n)++] = id;
    return 0;
}

static int load_post(mw_tok_t *t, const cJSON *p, int depth)
{
    if (!p || cJSON_IsNull(p)) return 0;
    const char *type = NULL;
    int err;
    if (!cJSON_IsObject(p) || (err = jstr(t, p, "type", &type)) || !type)
        return mw_error_set(MW_EFORMAT, "%s: the post-processor must be null or an object with a \"type\"", t->what);
    if (!strcmp(type, "ByteLevel")) return 0; /* offsets only */
    if (!strcmp(type, "Sequence") && depth < 4) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "processors");
        if (!cJSON_IsArray(list)) return mw_error_set(MW_EFORMAT, "%s: a Sequence post-processor needs \"processors\"",
                                                      t->what);
        for (const cJSON *c = list->child; c; c = c->next)
            if ((err = load_post(t, c, depth + 1))) return err;
        return 0;
    }
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        const cJSON *cls = cJSON_GetObjectItemCaseSensitive(p, "cls"), *sep = cJSON_GetObjectItemCaseSensitive(p, "sep");
        int32_t ci, si;
        if (!cJSON_IsArray(cls) || cJSON_GetArraySize(cls) != 2 || !cJSON_IsArray(sep) || cJSON_GetArraySize(sep) != 2 ||
            (err = jid(t, cls->child->next, "cls id", &ci)) || (err = jid(t, sep->child->next, "sep id", &si)))
            return mw_error_set(MW_EFORMAT, "%s: %s needs \"cls\" and \"sep\" as [token, id]", t->what, type);
        if ((err = post_add(t, t->post_prefix, &t->n_prefix, ci))) return err;
        return post_add(t, t->post_suffix, &t->n_suffix, si);
    }
    if (!strcmp(type, "TemplateProcessing")) {
        const cJSON *single = cJSON_GetObjectItemCaseSensitive(p, "single");
        const cJSON *specials = cJSON_GetObjectItemCaseSensitive(p, "special_tokens");
        if (!cJSON_IsArray(single))
            return mw_error_set(MW_EFORMAT, "%s: TemplateProcessing needs a \"single\" template", t->what);
        int seen_seq = 0;
        int32_t pre[8], suf[8];
        int np = 0, ns = 0;
        for (const cJSON *it = single->child; it; it = it->next) {
            const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
            const cJSON *sq = cJSON_GetObjectItemCaseSensitive(it, "Sequence");
            if (sq) {
                const char *which = NULL;
                if (!cJSON_IsObject(sq) || (err = jstr(t, sq, "id", &which)) || !which || strcmp(which, "A") || seen_seq)
                    return mw_error_set(MW_EFORMAT, "%s: the \"single\" template must hold the sequence A once", t->what);
                seen_seq = 1;
                continue;
            }
            const char *name = NULL;
            if (!cJSON_IsObject(sp) || (err = jstr(t, sp, "id", &name)) || !name)
                return mw_error_set(MW_EFORMAT, "%s: a template item must be a SpecialToken or a Sequence", t->what);
            const cJSON *def = cJSON_IsObject(specials) ? cJSON_GetObjectItemCaseSensitive(specials, name) : NULL;
            const cJSON *ids = def ? cJSON_GetObjectItemCaseSensitive(def, "ids") : NULL;
            if (!cJSON_IsArray(ids)) {
                char b[80];
                return mw_error_set(MW_EFORMAT, "%s: the template's special token '%s' has no \"ids\" in special_tokens",
                                    t->what, shown(name, b, sizeof b));
            }
            for (const cJSON *x = ids->child; x; x = x->next) {
                int32_t id;
                if ((err = jid(t, x, "a template token id", &id))) return err;
                if ((seen_seq ? ns : np) == 8) {
                    snprintf(t->post_unsupported, sizeof t->post_unsupported, "the post-processor adds more than 8 tokens");
                    continue;
                }
                if (seen_seq) suf[ns++] = id;
                else pre[np++] = id;
            }
        }
        if (!seen_seq) return mw_error_set(MW_EFORMAT, "%s: the \"single\" template has no sequence $A", t->what);
        for (int i = 0; i < np; i++)
            if ((err = post_add(t, t->post_prefix, &t->n_prefix, pre[i]))) return err;
        for (int i = 0; i < ns; i++)
            if ((err = post_add(t, t->post_suffix, &t->n_suffix, suf[i]))) return err;
        return 0;
    }
    char b[80];
    snprintf(t->post_unsupported, sizeof t->post_unsupported, "post-processor '%s' is not supported",
             shown(type, b, sizeof b));
    return 0;
}

/* ---- load / free ---- */

void mw_tok_free(mw_tok_t *t)
{
    if (!t) return;
    free(t->arena);
    free(t->id_span);
    free(t->text_arena);
    tok_strmap_free(&t->by_text);
    tok_strmap_free(&t->by_bytes);
    tok_pairmap_free(&t->merges);
    for (int i = 0; i < t->n_added; i++) {
        if (t->added[i].norm != t->added[i].content) free(t->added[i].norm);
        free(t->added[i].content);
    }
    free(t->added);
    free(t->added_order[0]);
    free(t->added_order[1]);
    free(t->is_special);
    for (int i = 0; i < t->nsteps; i++) {
        tok_regex_free(t->steps[i].re);
        free(t->steps[i].lit);
    }
    tok_cache_free(t->cache);
    tok_scratch_free(t->scratch);
    free(t);
}

int mw_tok_load_json(mw_tok_t **out, const char *json, size_t len, const char *what)
{
    *out = NULL;
    byte_map_init();
    mw_tok_t *t = calloc(1, sizeof *t);
    if (!t) return mw_error_set(-ENOMEM, "no memory for a tokenizer");
    snprintf(t->what, sizeof t->what, "%s", what && *what ? what : "tokenizer.json");
    /* Both arenas exist from the start, so that even an empty token has an address. */
    t->arena_cap = t->text_cap = 1 << 12;
    t->arena = malloc(t->arena_cap);
    t->text_arena = malloc(t->text_cap);
    if (!t->arena || !t->text_arena) {
        mw_tok_free(t);
        return mw_error_set(-ENOMEM, "no memory for a tokenizer");
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    int err = 0;
    if (!root) {
        size_t at = end && end >= json && end <= json + len ? (size_t)(end - json) : 0;
        err = mw_error_set(MW_EFORMAT, "%s is not valid JSON (error near byte %zu of %zu)", t->what, at, len);
        goto fail;
    }
    if (!cJSON_IsObject(root)) {
        err = mw_error_set(MW_EFORMAT, "%s is not a JSON object: not a Hugging Face tokenizer.json", t->what);
        goto fail;
    }
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    int32_t max_added;
    if ((err = max_added_id(t, added, &max_added))) goto fail;
    if ((err = load_model(t, cJSON_GetObjectItemCaseSensitive(root, "model"), max_added))) goto fail;
    if ((err = load_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), 0))) goto fail;
    if ((err = load_added(t, added))) goto fail;
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    if (!pre || cJSON_IsNull(pre)) {
        err = mw_error_set(MW_EFORMAT, "%s has no pre-tokenizer: not a byte-level BPE tokenizer (memwall needs a "
                           "ByteLevel pre-tokenizer)", t->what);
        goto fail;
    }
    if ((err = load_pretok(t, pre, 0))) goto fail;
    for (int i = 0; i < t->nsteps; i++)
        if ((t->steps[i].kind == TOK_STEP_BYTELEVEL) != (i == t->nsteps - 1)) {
            err = mw_error_set(MW_EFORMAT, "%s: the pre-tokenizer must end with ByteLevel, once, after any Split steps "
                               "(this one has %s); memwall reads byte-level BPE only", t->what,
                               t->steps[t->nsteps - 1].kind == TOK_STEP_BYTELEVEL ? "ByteLevel twice" : "no ByteLevel last");
            goto fail;
        }
    if ((err = load_post(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), 0))) goto fail;
    if ((err = tok_cache_new(&t->cache))) goto fail;
    cJSON_Delete(root);
    *out = t;
    return 0;
fail:
    cJSON_Delete(root);
    mw_tok_free(t);
    return err;
}

int mw_tok_load(mw_tok_t **out, const char *path, const char *what)
{
    *out = NULL;
    struct stat st;
    char *file = NULL;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        size_t n = strlen(path) + sizeof "/tokenizer.json";
        if (!(file = malloc(n))) return mw_error_set(-ENOMEM, "no memory");
        snprintf(file, n, "%s/tokenizer.json", path);
    }
    const char *p = file ? file : path;
    char *buf = NULL;
    size_t len = 0;
    int err = mw_read_small_file(p, "tokenizer", MW_TOK_MAX_FILE, &buf, &len);
    if (!err) err = mw_tok_load_json(out, buf, len, what ? what : p);
    free(buf);
    free(file);
    return err;
}

/* ---- queries ---- */

int32_t mw_tok_vocab_size(const mw_tok_t *t) { return t->n_ids; }

int32_t mw_tok_token_id(const mw_tok_t *t, const char *token)
{
    return tok_strmap_get(&t->by_text, t->text_arena, token, strlen(token));
}

int mw_tok_is_special(const mw_tok_t *t, int32_t id) { return id >= 0 && id < t->n_ids && t->is_special[id]; }

int32_t mw_tok_doc_token(const mw_tok_t *t)
{
    if (t->n_prefix > 0) return t->post_prefix[0];
    return mw_tok_token_id(t, "<|endoftext|>");
}

/* ---- encode / decode ---- */

int mw_tok_encode(mw_tok_t *t, const char *text, size_t len, unsigned flags, struct mw_tok_ids *out)
{
    int err;
    if ((flags & MW_TOK_ADD_SPECIAL) && t->post_unsupported[0])
        return mw_error_set(-ENOTSUP, "%s: cannot add special tokens: %s", t->what, t->post_unsupported);
    if (flags & MW_TOK_ADD_SPECIAL)
        for (int i = 0; i < t->n_prefix; i++)
            if ((err = tok_ids_push(out, t->post_prefix[i]))) return err;
    if ((err = tok_encode_text(t, text, len, flags, out))) return err;
    if (flags & MW_TOK_ADD_SPECIAL)
        for (int i = 0; i < t->n_suffix; i++)
            if ((err = tok_ids_push(out, t->post_suffix[i]))) return err;
    return 0;
}

int mw_tok_decode_ids(const mw_tok_t *t, const int32_t *ids, size_t n, unsigned flags, char **buf, size_t *len,
                      size_t *cap)
{
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || t->id_span[id] == UINT64_MAX)
            return mw_error_set(-EINVAL, "%s: token id %d (at %zu) is not in the vocabulary (ids 0..%d)", t->what, id, i,
                                t->n_ids - 1);
        if ((flags & MW_TOK_SKIP_SPECIAL) && t->is_special[id]) continue;
        size_t off = (size_t)(t->id_span[id] >> 24), k = (size_t)(t->id_span[id] & 0xffffff);
        if (!k) continue;
        if (*len + k > *cap) {
            size_t c = *cap ? *cap : 4096;
            while (c < *len + k) c *= 2;
            char *b = realloc(*buf, c);
            if (!b) return mw_error_set(-ENOMEM, "no memory for %zu decoded bytes", c);
            *buf = b;
            *cap = c;
        }
        memcpy(*buf + *len, t->arena + off, k);
        *len += k;
    }
    return 0;
}
