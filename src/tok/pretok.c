/*
 * pretok.c — everything between the input bytes and the BPE model, in HF tokenizers' order:
 *
 *   bytes --(UTF-8 runs)--> run --(added tokens, raw)--> piece --(normalizer)--> piece
 *         --(added tokens, normalized)--> piece --(Split steps ... ByteLevel)--> word --> BPE
 *
 * Why depth-first: each stage cuts its piece into smaller pieces in order, and the ids must come
 * out in text order, so every stage hands each piece to the next stage as soon as it is cut
 * (a recursion as deep as the number of stages) instead of building lists of pieces. Only a
 * Split step with a behaviour other than Isolated needs its piece's segments together (to merge
 * neighbours), kept in a per-depth scratch array.
 *
 * Invalid UTF-8: Oniguruma, NFC and HF's added-token rules all assume valid UTF-8, and HF can
 * only ever see valid UTF-8 (a Python str). So the input is first cut into maximal valid runs
 * and single invalid bytes; a run is encoded as HF encodes that string, an invalid byte becomes
 * its own byte token (tok.h). Added-token contents are refused at load unless valid UTF-8, so a
 * match never ends inside a character.
 *
 * Regexes are HF's: Oniguruma with its default syntax and UTF-8, each piece searched on its own
 * (so ^, $ and look-behind see only the piece, as in HF where each split is its own string).
 * A backtracking limit per search (retry limit) turns a catastrophic pattern from a hostile
 * tokenizer.json into an error instead of a hang.
 */
#include "tok/tok_impl.h"
#include "memwall/common.h"

#include <errno.h>
#include <oniguruma.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

const char tok_gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* Backtracking steps one search may take (Oniguruma's retry limit in search). A real
 * pre-tokenizer pattern matches at the very position the search starts from in a few dozen
 * steps; this bound only stops a pathological one. */
#define TOK_RETRY_LIMIT 50000000ul

/* ---- UTF-8 ---- */

size_t tok_utf8_next(const unsigned char *s, size_t n, uint32_t *cp)
{
    unsigned char c = s[0];
    if (c < 0x80) { *cp = c; return 1; }
    size_t len;
    uint32_t v, min;
    if (c >= 0xc2 && c <= 0xdf) { len = 2; v = c & 0x1f; min = 0x80; }
    else if (c >= 0xe0 && c <= 0xef) { len = 3; v = c & 0x0f; min = 0x800; }
    else if (c >= 0xf0 && c <= 0xf4) { len = 4; v = c & 0x07; min = 0x10000; }
    else return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        v = v << 6 | (s[i] & 0x3f);
    }
    if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
    *cp = v;
    return len;
}

/* The code point that ends at s[n) (s valid UTF-8, n > 0). */
static uint32_t utf8_last(const unsigned char *s, size_t n)
{
    size_t i = n - 1;
    while (i > 0 && (s[i] & 0xc0) == 0x80) i--;
    uint32_t cp = 0;
    tok_utf8_next(s + i, n - i, &cp);
    return cp;
}

/* ---- Oniguruma, and the character classes of added tokens ----
 * HF decides single_word, lstrip and rstrip with Rust's regex \w and \s. Rust's \w is
 * Alphabetic | Mark | Decimal_Number | Connector_Punctuation | Join_Control (UTS #18), which is
 * not Oniguruma's \w (that one takes every Number, e.g. '²', and no Join_Control, e.g. U+200D),
 * so the same properties are looked up here one by one; \s is White_Space in both. */

static pthread_once_t onig_once = PTHREAD_ONCE_INIT;
static int onig_init_rc;
enum { CT_ALPHA, CT_MARK, CT_ND, CT_PC, CT_JOIN, CT_SPACE, CT_N };
static int ctype[CT_N];

static void tok_onig_init(void)
{
    OnigEncoding use[] = {ONIG_ENCODING_UTF8};
    onig_init_rc = onig_initialize(use, 1);
    static const char *const names[CT_N] = {"Alphabetic", "M", "Nd", "Pc", "Join_Control", "White_Space"};
    for (int i = 0; i < CT_N && onig_init_rc == ONIG_NORMAL; i++) {
        UChar *p = (UChar *)(uintptr_t)names[i];
        ctype[i] = ONIGENC_PROPERTY_NAME_TO_CTYPE(ONIG_ENCODING_UTF8, p, p + strlen(names[i]));
        if (ctype[i] < 0) onig_init_rc = ctype[i];
    }
}

static int has(int ct, uint32_t cp) { return ONIGENC_IS_CODE_CTYPE(ONIG_ENCODING_UTF8, cp, (unsigned)ctype[ct]) != 0; }

int tok_is_word_cp(uint32_t cp)
{
    pthread_once(&onig_once, tok_onig_init);
    return has(CT_ALPHA, cp) || has(CT_MARK, cp) || has(CT_ND, cp) || has(CT_PC, cp) || has(CT_JOIN, cp);
}

int tok_is_space_cp(uint32_t cp)
{
    pthread_once(&onig_once, tok_onig_init);
    return has(CT_SPACE, cp);
}

/* ---- regexes ---- */

int tok_regex_compile(void **re, const char *pattern, size_t len, const char *what)
{
    pthread_once(&onig_once, tok_onig_init);
    if (onig_init_rc != ONIG_NORMAL) return mw_error_set(-EINVAL, "cannot initialise Oniguruma (code %d)", onig_init_rc);
    regex_t *r = NULL;
    OnigErrorInfo ei;
    memset(&ei, 0, sizeof ei);
    int rc = onig_new(&r, (const UChar *)pattern, (const UChar *)pattern + len, ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                      ONIG_SYNTAX_DEFAULT, &ei);
    if (rc != ONIG_NORMAL) {
        UChar msg[ONIG_MAX_ERROR_MESSAGE_LEN];
        onig_error_code_to_str(msg, rc, &ei);
        return mw_error_set(MW_EFORMAT, "%s: the pre-tokenizer's regex does not compile: %s (pattern %.*s%s)", what,
                            (const char *)msg, (int)MW_MIN(len, (size_t)200), pattern, len > 200 ? "..." : "");
    }
    *re = r;
    return 0;
}

void tok_regex_free(void *re)
{
    if (re) onig_free((regex_t *)re);
}

/* ---- scratch ---- */

struct seg {
    size_t off, len;
    int match;
};

struct tok_scratch {
    OnigRegion *region;
    OnigMatchParam *mp;
    struct seg *segs[TOK_MAX_STEPS];
    size_t segs_cap[TOK_MAX_STEPS];
    char *pfx;               /* ByteLevel add_prefix_space: " " + piece */
    size_t pfx_cap;
};

void tok_scratch_free(struct tok_scratch *s)
{
    if (!s) return;
    if (s->region) onig_region_free(s->region, 1);
    if (s->mp) onig_free_match_param(s->mp);
    for (int i = 0; i < TOK_MAX_STEPS; i++) free(s->segs[i]);
    free(s->pfx);
    free(s);
}

static int scratch_get(mw_tok_t *t, struct tok_scratch **out)
{
    if (!t->scratch) {
        struct tok_scratch *s = calloc(1, sizeof *s);
        if (!s) return mw_error_set(-ENOMEM, "no memory for the tokenizer's scratch");
        s->region = onig_region_new();
        s->mp = onig_new_match_param();
        if (!s->region || !s->mp) {
            tok_scratch_free(s);
            return mw_error_set(-ENOMEM, "no memory for the tokenizer's regex state");
        }
        onig_initialize_match_param(s->mp);
        onig_set_retry_limit_in_search_of_match_param(s->mp, TOK_RETRY_LIMIT);
        t->scratch = s;
    }
    *out = t->scratch;
    return 0;
}

/* The next non-empty match of re in s[0..n) at or after *pos: 1 with [*b, *e), 0 when none, or
 * an error. Empty matches are stepped over one character at a time (they split nothing). */
static int regex_next(mw_tok_t *t, void *re, const char *s, size_t n, size_t *pos, size_t *b, size_t *e)
{
    struct tok_scratch *sc = t->scratch;
    const UChar *str = (const UChar *)s, *end = str + n;
    while (*pos < n) {
        int r = onig_search_with_param((regex_t *)re, str, end, str + *pos, end, sc->region, ONIG_OPTION_NONE, sc->mp);
        if (r == ONIG_MISMATCH) return 0;
        if (r < 0) {
            UChar msg[ONIG_MAX_ERROR_MESSAGE_LEN];
            onig_error_code_to_str(msg, r);
            return mw_error_set(-EINVAL, "%s: the pre-tokenizer's regex failed on a piece of %zu bytes: %s", t->what, n,
                                (const char *)msg);
        }
        size_t mb = (size_t)sc->region->beg[0], me = (size_t)sc->region->end[0];
        if (me > mb) {
            *b = mb;
            *e = me;
            *pos = me;
            return 1;
        }
        uint32_t cp;
        size_t cl = mb < n ? tok_utf8_next((const unsigned char *)s + mb, n - mb, &cp) : 1;
        *pos = mb + (cl ? cl : 1);
    }
    return 0;
}

/* ---- pre-tokenizer steps ---- */

static int run_steps(mw_tok_t *t, int step, const char *s, size_t n, struct mw_tok_ids *out);

/* The last step: ByteLevel. Words go to the model. */
static int byte_level(mw_tok_t *t, const struct tok_step *st, const char *s, size_t n, struct mw_tok_ids *out)
{
    if (st->add_prefix_space && s[0] != ' ') {
        struct tok_scratch *sc = t->scratch;
        if (n + 1 > sc->pfx_cap) {
            char *p = realloc(sc->pfx, n + 1);
            if (!p) return mw_error_set(-ENOMEM, "no memory for a piece of %zu bytes", n + 1);
            sc->pfx = p;
            sc->pfx_cap = n + 1;
        }
        sc->pfx[0] = ' ';
        memcpy(sc->pfx + 1, s, n);
        s = sc->pfx;
        n++;
    }
    if (!st->re) return tok_bpe_word(t, (const unsigned char *)s, n, out);
    size_t pos = 0, b, e, prev = 0;
    int r, err;
    while ((r = regex_next(t, st->re, s, n, &pos, &b, &e)) == 1) {
        if (b > prev && (err = tok_bpe_word(t, (const unsigned char *)s + prev, b - prev, out))) return err;
        if ((err = tok_bpe_word(t, (const unsigned char *)s + b, e - b, out))) return err;
        prev = e;
    }
    if (r < 0) return r;
    return n > prev ? tok_bpe_word(t, (const unsigned char *)s + prev, n - prev, out) : 0;
}

static int seg_push(mw_tok_t *t, int step, size_t *k, size_t off, size_t len, int match)
{
    struct tok_scratch *sc = t->scratch;
    if (*k == sc->segs_cap[step]) {
        size_t cap = sc->segs_cap[step] ? 2 * sc->segs_cap[step] : 64;
        struct seg *v = realloc(sc->segs[step], cap * sizeof *v);
        if (!v) return mw_error_set(-ENOMEM, "no memory for %zu pre-token splits", cap);
        sc->segs[step] = v;
        sc->segs_cap[step] = cap;
    }
    sc->segs[step][(*k)++] = (struct seg){off, len, match};
    return 0;
}

/* A Split step: cut s into matches and the gaps between them, then apply the behaviour (HF's
 * SplitDelimiterBehavior) and pass every resulting piece to the next step. */
static int split_step(mw_tok_t *t, int step, const char *s, size_t n, struct mw_tok_ids *out)
{
    const struct tok_step *st = &t->steps[step];
    int err;
    /* The common case, streamed: Isolated, not inverted. */
    if (st->behavior == TOK_SPLIT_ISOLATED && st->kind == TOK_STEP_REGEX) {
        size_t pos = 0, b, e, prev = 0;
        int r;
        while ((r = regex_next(t, st->re, s, n, &pos, &b, &e)) == 1) {
            if (b > prev && (err = run_steps(t, step + 1, s + prev, b - prev, out))) return err;
            if ((err = run_steps(t, step + 1, s + b, e - b, out))) return err;
            prev = e;
        }
        if (r < 0) return r;
        return n > prev ? run_steps(t, step + 1, s + prev, n - prev, out) : 0;
    }
    size_t k = 0, prev = 0;
    if (st->kind == TOK_STEP_REGEX) {
        size_t pos = 0, b, e;
        int r;
        while ((r = regex_next(t, st->re, s, n, &pos, &b, &e)) == 1) {
            if (b > prev && (err = seg_push(t, step, &k, prev, b - prev, 0))) return err;
            if ((err = seg_push(t, step, &k, b, e - b, 1))) return err;
            prev = e;
        }
        if (r < 0) return r;
    } else if (st->lit_len) {
        for (size_t i = 0; i + st->lit_len <= n;) {
            const char *f = memmem(s + i, n - i, st->lit, st->lit_len);
            if (!f) break;
            size_t b = (size_t)(f - s);
            if (b > prev && (err = seg_push(t, step, &k, prev, b - prev, 0))) return err;
            if ((err = seg_push(t, step, &k, b, st->lit_len, 1))) return err;
            i = prev = b + st->lit_len;
        }
    }
    if (n > prev && (err = seg_push(t, step, &k, prev, n - prev, 0))) return err;
    struct seg *v = t->scratch->segs[step];
    if (st->invert)
        for (size_t i = 0; i < k; i++) v[i].match = !v[i].match;
    /* Behaviours, written over v in place (w <= i always); the rules are HF's. */
    size_t w = 0;
    int prev_match = 0;
    switch (st->behavior) {
    case TOK_SPLIT_REMOVED:
        for (size_t i = 0; i < k; i++)
            if (!v[i].match) v[w++] = v[i];
        break;
    case TOK_SPLIT_ISOLATED: w = k; break;
    case TOK_SPLIT_MERGED_PREV: /* a match joins the piece before it, unless that was a match */
        for (size_t i = 0; i < k; i++) {
            if (v[i].match && !prev_match && w > 0) v[w - 1].len = v[i].off + v[i].len - v[w - 1].off;
            else v[w++] = v[i];
            prev_match = v[i].match;
        }
        break;
    case TOK_SPLIT_MERGED_NEXT: { /* a match joins the piece after it, unless that is a match */
        size_t r = k; /* walk from the right, building the result at the end of v */
        for (size_t i = k; i-- > 0;) {
            if (v[i].match && !prev_match && r < k) {
                v[r].len += v[r].off - v[i].off;
                v[r].off = v[i].off;
            } else v[--r] = v[i];
            prev_match = v[i].match;
        }
        memmove(v, v + r, (k - r) * sizeof *v);
        w = k - r;
        break;
    }
    case TOK_SPLIT_CONTIGUOUS: /* runs of matches become one piece */
        for (size_t i = 0; i < k; i++) {
            if (v[i].match == prev_match && w > 0) v[w - 1].len = v[i].off + v[i].len - v[w - 1].off;
            else v[w++] = v[i];
            prev_match = v[i].match;
        }
        break;
    }
    /* The next step may reuse deeper scratch arrays, never this one: copy out as we go. */
    for (size_t i = 0; i < w; i++) {
        struct seg g = t->scratch->segs[step][i];
        if (g.len && (err = run_steps(t, step + 1, s + g.off, g.len, out))) return err;
    }
    return 0;
}

static int run_steps(mw_tok_t *t, int step, const char *s, size_t n, struct mw_tok_ids *out)
{
    if (n == 0) return 0;
    const struct tok_step *st = &t->steps[step];
    if (st->kind == TOK_STEP_BYTELEVEL) return byte_level(t, st, s, n, out);
    return split_step(t, step, s, n, out);
}

/* ---- added tokens ---- */

/* The longest added token of pass p (0: matched on content, 1: on normalized content) that
 * starts at s[0..n), or -1. Candidates are indexed by first byte, longest first. */
static int added_at(const mw_tok_t *t, int p, const char *s, size_t n)
{
    unsigned char c = (unsigned char)s[0];
    for (uint32_t j = t->added_first[p][c]; j < t->added_first[p][c + 1]; j++) {
        const struct tok_added *a = &t->added[t->added_order[p][j]];
        const char *txt = p ? a->norm : a->content;
        size_t len = p ? a->norm_len : a->len;
        if (len <= n && !memcmp(s, txt, len)) return (int)t->added_order[p][j];
    }
    return -1;
}

static int normalize_piece(mw_tok_t *t, const char *s, size_t n, unsigned flags, struct mw_tok_ids *out);

/* Pass p over the piece s[0..n): split out added tokens (HF's AddedVocabulary::find_matches:
 * leftmost-longest, non-overlapping; a special token under MW_TOK_SPLIT_SPECIAL and a
 * single_word token inside a word are skipped over whole, not searched inside). The pieces
 * between go on: after pass 0 to the normalizer, after pass 1 to the pre-tokenizer. */
static int added_split(mw_tok_t *t, int p, const char *s, size_t n, unsigned flags, struct mw_tok_ids *out)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t pos = 0, start_off = 0;
    int err;
    if (t->added_first[p][256] > 0) {
        while (pos < n) {
            int a = added_at(t, p, s + pos, n - pos);
            uint32_t cp;
            if (a < 0) {
                size_t cl = tok_utf8_next(u + pos, n - pos, &cp);
                pos += cl ? cl : 1;
                continue;
            }
            const struct tok_added *ad = &t->added[a];
            size_t start = pos, stop = pos + (p ? ad->norm_len : ad->len);
            pos = stop;
            if ((flags & MW_TOK_SPLIT_SPECIAL) && ad->special) continue;
            if (ad->single_word) {
                int before = start > 0 && tok_is_word_cp(utf8_last(u, start));
                int after = stop < n && tok_utf8_next(u + stop, n - stop, &cp) && tok_is_word_cp(cp);
                if (before || after) continue;
            }
            if (ad->lstrip)
                while (start > start_off) {
                    uint32_t c = utf8_last(u, start);
                    if (!tok_is_space_cp(c)) break;
                    size_t i = start - 1;
                    while (i > 0 && (u[i] & 0xc0) == 0x80) i--;
                    start = MW_MAX(i, start_off);
                }
            if (ad->rstrip)
                while (stop < n) {
                    size_t cl = tok_utf8_next(u + stop, n - stop, &cp);
                    if (!cl || !tok_is_space_cp(cp)) break;
                    stop += cl;
                }
            pos = stop;
            if (start > start_off) {
                err = p ? run_steps(t, 0, s + start_off, start - start_off, out)
                        : normalize_piece(t, s + start_off, start - start_off, flags, out);
                if (err) return err;
            }
            if ((err = tok_ids_push(out, ad->id))) return err;
            start_off = stop;
        }
    }
    if (n > start_off)
        return p ? run_steps(t, 0, s + start_off, n - start_off, out)
                 : normalize_piece(t, s + start_off, n - start_off, flags, out);
    return 0;
}

static int normalize_piece(mw_tok_t *t, const char *s, size_t n, unsigned flags, struct mw_tok_ids *out)
{
    char *norm = NULL;
    size_t nn = 0;
    int err;
    if (t->nfc && (err = tok_nfc(s, n, &norm, &nn))) return err;
    err = norm ? added_split(t, 1, norm, nn, flags, out) : added_split(t, 1, s, n, flags, out);
    free(norm);
    return err;
}

int tok_encode_text(mw_tok_t *t, const char *text, size_t len, unsigned flags, struct mw_tok_ids *out)
{
    struct tok_scratch *sc;
    int err = scratch_get(t, &sc);
    if (err) return err;
    const unsigned char *u = (const unsigned char *)text;
    size_t i = 0;
    while (i < len) {
        size_t j = i;
        uint32_t cp;
        for (size_t cl; j < len && (cl = tok_utf8_next(u + j, len - j, &cp)); j += cl) {}
        if (j > i && (err = added_split(t, 0, text + i, j - i, flags, out))) return err;
        if (j < len) { /* one invalid byte: its own word */
            if ((err = tok_bpe_word(t, u + j, 1, out))) return err;
            j++;
        }
        i = j;
    }
    return 0;
}
