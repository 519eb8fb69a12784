/*
 * nfc.c — Unicode Normalization Form C, the normalizer of Qwen2's tokenizer.json ("NFC").
 *
 * The textbook algorithm (UAX #15): decompose every code point canonically (tables from
 * nfc_table.h, Hangul syllables arithmetically), put each run of combining marks in canonical
 * order (a stable sort by combining class), then compose: a mark joins the last starter when it
 * is not blocked (no mark of the same or a higher class, and no starter, in between) and the
 * pair is a primary composite.
 *
 * Why a quick check first: nearly all text is NFC already, and a code point can only change, or
 * change its neighbour, if it has a combining class, a decomposition, composes as a second
 * element, or is a Hangul jamo. Those are marked in a bitmap built once; a piece without any of
 * them is returned as it is, without a copy (the normal case for ASCII, CJK, most scripts).
 *
 * The data is Python's unicodedata (scripts/gen_nfc_table.py; the version is in the table).
 * HF tokenizers uses the Rust unicode-normalization tables; the two agree on every character
 * both versions know (composition is frozen by Unicode's stability policy).
 */
#include "tok/tok_impl.h"
#include "tok/nfc_table.h"
#include "memwall/common.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { S_BASE = 0xac00, L_BASE = 0x1100, V_BASE = 0x1161, T_BASE = 0x11a7, L_COUNT = 19, V_COUNT = 21,
       T_COUNT = 28, N_COUNT = V_COUNT * T_COUNT, S_COUNT = L_COUNT * N_COUNT };

#define N_CCC (sizeof mw_nfc_ccc / sizeof mw_nfc_ccc[0])
#define N_DECOMP (sizeof mw_nfc_decomp / sizeof mw_nfc_decomp[0])

static uint8_t maybe[0x110000 / 8];     /* code points that may make a piece change */
static uint32_t comp_pair[N_DECOMP][3]; /* composing pairs (a, b, composite), sorted by (a, b) */
static size_t n_comp;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void mark(uint32_t cp) { maybe[cp >> 3] |= (uint8_t)(1u << (cp & 7)); }

static int cmp_pair(const void *x, const void *y)
{
    const uint32_t *a = x, *b = y;
    if (a[0] != b[0]) return a[0] < b[0] ? -1 : 1;
    return a[1] < b[1] ? -1 : a[1] > b[1];
}

static void init(void)
{
    for (size_t i = 0; i < N_CCC; i++)
        for (uint32_t c = mw_nfc_ccc[i].first; c <= mw_nfc_ccc[i].last; c++) mark(c);
    for (size_t i = 0; i < N_DECOMP; i++) {
        mark(mw_nfc_decomp[i].cp);
        if (mw_nfc_decomp[i].comp) {
            mark(mw_nfc_decomp[i].b);
            comp_pair[n_comp][0] = mw_nfc_decomp[i].a;
            comp_pair[n_comp][1] = mw_nfc_decomp[i].b;
            comp_pair[n_comp][2] = mw_nfc_decomp[i].cp;
            n_comp++;
        }
    }
    for (uint32_t c = L_BASE; c < L_BASE + L_COUNT; c++) mark(c);
    for (uint32_t c = V_BASE; c < V_BASE + V_COUNT; c++) mark(c);
    for (uint32_t c = T_BASE + 1; c < T_BASE + T_COUNT; c++) mark(c);
    qsort(comp_pair, n_comp, sizeof comp_pair[0], cmp_pair);
}

static int is_maybe(uint32_t cp) { return (maybe[cp >> 3] >> (cp & 7)) & 1; }

static unsigned ccc(uint32_t cp)
{
    size_t lo = 0, hi = N_CCC;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < mw_nfc_ccc[mid].first) hi = mid;
        else if (cp > mw_nfc_ccc[mid].last) lo = mid + 1;
        else return mw_nfc_ccc[mid].ccc;
    }
    return 0;
}

static long decomp_index(uint32_t cp)
{
    size_t lo = 0, hi = N_DECOMP;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < mw_nfc_decomp[mid].cp) hi = mid;
        else if (cp > mw_nfc_decomp[mid].cp) lo = mid + 1;
        else return (long)mid;
    }
    return -1;
}

static uint32_t compose(uint32_t a, uint32_t b)
{
    if (a >= L_BASE && a < L_BASE + L_COUNT && b >= V_BASE && b < V_BASE + V_COUNT)
        return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
    if (a >= S_BASE && a < S_BASE + S_COUNT && (a - S_BASE) % T_COUNT == 0 && b > T_BASE && b < T_BASE + T_COUNT)
        return a + (b - T_BASE);
    uint32_t key[2] = {a, b};
    const uint32_t *f = bsearch(key, comp_pair, n_comp, sizeof comp_pair[0], cmp_pair);
    return f ? f[2] : 0;
}

/* Writes the full canonical decomposition of cp to v and returns its length: at most 4 code
 * points with these tables (the recursion is bounded too, against a broken table). */
static size_t decompose(uint32_t cp, uint32_t *v, int depth)
{
    if (cp >= S_BASE && cp < S_BASE + S_COUNT) {
        uint32_t s = cp - S_BASE, t = s % T_COUNT;
        v[0] = L_BASE + s / N_COUNT;
        v[1] = V_BASE + (s % N_COUNT) / T_COUNT;
        if (t) { v[2] = T_BASE + t; return 3; }
        return 2;
    }
    long i = depth < 4 ? decomp_index(cp) : -1;
    if (i < 0) { v[0] = cp; return 1; }
    size_t k = decompose(mw_nfc_decomp[i].a, v, depth + 1);
    if (mw_nfc_decomp[i].b) k += decompose(mw_nfc_decomp[i].b, v + k, depth + 1);
    return k;
}

static size_t put_utf8(uint32_t c, char *o)
{
    if (c < 0x80) { o[0] = (char)c; return 1; }
    if (c < 0x800) { o[0] = (char)(0xc0 | c >> 6); o[1] = (char)(0x80 | (c & 0x3f)); return 2; }
    if (c < 0x10000) {
        o[0] = (char)(0xe0 | c >> 12); o[1] = (char)(0x80 | ((c >> 6) & 0x3f)); o[2] = (char)(0x80 | (c & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | c >> 18); o[1] = (char)(0x80 | ((c >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3f)); o[3] = (char)(0x80 | (c & 0x3f));
    return 4;
}

int tok_nfc(const char *s, size_t n, char **out, size_t *out_len)
{
    pthread_once(&once, init);
    *out = NULL;
    *out_len = 0;
    const unsigned char *u = (const unsigned char *)s;
    int any = 0;
    uint32_t cp;
    for (size_t i = 0, cl; i < n; i += cl) {
        cl = tok_utf8_next(u + i, n - i, &cp);
        if (!cl) return mw_error_set(-EINVAL, "NFC of a string that is not valid UTF-8"); /* never: runs are valid */
        if (cp >= 0x300 && is_maybe(cp)) { any = 1; break; }
    }
    if (!any) return 0;
    /* Counted first, so that memory is what the decomposition needs (4 bytes a code point). */
    size_t cap = 0;
    uint32_t tmp[32];
    for (size_t i = 0, cl; i < n; i += cl) {
        cl = tok_utf8_next(u + i, n - i, &cp);
        cap += decompose(cp, tmp, 0);
    }
    uint32_t *v = malloc(cap * sizeof *v);
    if (!v) return mw_error_set(-ENOMEM, "no memory to normalize %zu bytes", n);
    size_t k = 0;
    for (size_t i = 0, cl; i < n; i += cl) {
        cl = tok_utf8_next(u + i, n - i, &cp);
        k += decompose(cp, v + k, 0);
    }
    /* Canonical order: a stable insertion sort of each run of non-starters by class. */
    for (size_t i = 1; i < k; i++) {
        unsigned c = ccc(v[i]);
        if (!c) continue;
        uint32_t x = v[i];
        size_t j = i;
        while (j > 0 && ccc(v[j - 1]) > c) { v[j] = v[j - 1]; j--; }
        v[j] = x;
    }
    /* Compose in place. */
    size_t w = 0;
    long starter = -1;
    unsigned last_cc = 0;
    for (size_t i = 0; i < k; i++) {
        uint32_t c = v[i];
        unsigned cc = ccc(c);
        if (starter >= 0) {
            int adjacent = (size_t)starter == w - 1;
            if (adjacent || (last_cc != 0 && last_cc < cc)) {
                uint32_t p = compose(v[starter], c);
                if (p) { v[starter] = p; continue; }
            }
        }
        if (cc == 0) starter = (long)w;
        last_cc = cc;
        v[w++] = c;
    }
    char *o = malloc(4 * w + 1);
    if (!o) { free(v); return mw_error_set(-ENOMEM, "no memory to normalize %zu bytes", n); }
    size_t ol = 0;
    for (size_t i = 0; i < w; i++) ol += put_utf8(v[i], o + ol);
    free(v);
    *out = o;
    *out_len = ol;
    return 0;
}
