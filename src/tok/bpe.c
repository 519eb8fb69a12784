/*
 * bpe.c — the BPE model of a byte-level tokenizer: the hash tables the loader fills (token bytes
 * -> id, id pair -> merge), the merge loop over one pre-tokenized word, and a cache of words.
 *
 * The merge loop is HF's: the word starts as one symbol per byte; of all adjacent pairs that
 * have a merge, the one of lowest rank is merged first, the leftmost on a tie; repeat until no
 * pair merges. A min-heap of candidate pairs (rank, left position) does this in O(n log n):
 * a merged symbol keeps its left neighbour's position, so positions are stable; an entry whose
 * two symbols are no longer what it was pushed for is stale and skipped when popped. (A plain
 * "scan for the lowest rank" loop would be O(n^2) on a hostile 1 MB word without spaces.)
 *
 * The cache: natural text repeats its words, and a word's ids depend on the word alone, so the
 * ids of words up to TOK_CACHE_WORD bytes are kept in an open-addressing table over two arenas.
 * When either fills up, the whole cache is dropped and starts again (no eviction order to keep).
 * The cache lives in the handle, which is why a handle is used by one thread at a time.
 */
#include "tok/tok_impl.h"
#include "memwall/common.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- hashing ---- */

uint32_t tok_hash_bytes(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t k;
        memcpy(&k, s, 8);
        h = (h ^ k) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t k = 0;
    memcpy(&k, s, n);
    h = (h ^ k) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
    h *= 0x94d049bb133111ebull;
    return (uint32_t)(h ^ (h >> 32));
}

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static size_t pow2_for(size_t expect)
{
    size_t cap = 16;
    while (cap < 2 * expect + 2) cap *= 2;
    return cap;
}

/* ---- string map ---- */

int tok_strmap_init(struct tok_strmap *m, size_t expect)
{
    memset(m, 0, sizeof *m);
    m->cap = pow2_for(expect);
    m->slot = calloc(m->cap, sizeof *m->slot);
    m->val = calloc(m->cap, sizeof *m->val);
    m->hash = calloc(m->cap, sizeof *m->hash);
    if (!m->slot || !m->val || !m->hash) {
        tok_strmap_free(m);
        return mw_error_set(-ENOMEM, "no memory for a token table of %zu entries", expect);
    }
    return 0;
}

void tok_strmap_free(struct tok_strmap *m)
{
    free(m->slot);
    free(m->val);
    free(m->hash);
    memset(m, 0, sizeof *m);
}

static int strmap_grow(struct tok_strmap *m)
{
    struct tok_strmap g;
    if (tok_strmap_init(&g, m->cap)) return -ENOMEM; /* cap entries -> 4 * cap slots */
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slot[i]) continue;
        size_t j = m->hash[i] & (g.cap - 1);
        while (g.slot[j]) j = (j + 1) & (g.cap - 1);
        g.slot[j] = m->slot[i];
        g.val[j] = m->val[i];
        g.hash[j] = m->hash[i];
        g.n++;
    }
    tok_strmap_free(m);
    *m = g;
    return 0;
}

int tok_strmap_put(struct tok_strmap *m, const char *arena, size_t off, size_t len, int32_t v)
{
    if (len >= (1u << 24) || off >= ((uint64_t)1 << 39))
        return mw_error_set(-EOVERFLOW, "a token of %zu bytes is too long", len);
    if (2 * (m->n + 1) > m->cap && strmap_grow(m)) return -ENOMEM;
    uint32_t h = tok_hash_bytes(arena + off, len);
    size_t j = h & (m->cap - 1);
    for (; m->slot[j]; j = (j + 1) & (m->cap - 1)) {
        uint64_t s = m->slot[j] - 1;
        if (m->hash[j] == h && (s & 0xffffff) == len && !memcmp(arena + (s >> 24), arena + off, len)) {
            m->val[j] = v;
            return 0;
        }
    }
    m->slot[j] = ((uint64_t)off << 24 | len) + 1;
    m->val[j] = v;
    m->hash[j] = h;
    m->n++;
    return 0;
}

int32_t tok_strmap_get(const struct tok_strmap *m, const char *arena, const void *key, size_t len)
{
    if (!m->cap) return -1;
    uint32_t h = tok_hash_bytes(key, len);
    for (size_t j = h & (m->cap - 1); m->slot[j]; j = (j + 1) & (m->cap - 1)) {
        uint64_t s = m->slot[j] - 1;
        if (m->hash[j] == h && (s & 0xffffff) == len && !memcmp(arena + (s >> 24), key, len)) return m->val[j];
    }
    return -1;
}

/* ---- pair map ---- */

int tok_pairmap_init(struct tok_pairmap *m, size_t expect)
{
    memset(m, 0, sizeof *m);
    m->cap = pow2_for(expect);
    m->key = malloc(m->cap * sizeof *m->key);
    m->val = malloc(m->cap * sizeof *m->val);
    if (!m->key || !m->val) {
        tok_pairmap_free(m);
        return mw_error_set(-ENOMEM, "no memory for a merge table of %zu entries", expect);
    }
    memset(m->key, 0xff, m->cap * sizeof *m->key);
    return 0;
}

void tok_pairmap_free(struct tok_pairmap *m)
{
    free(m->key);
    free(m->val);
    memset(m, 0, sizeof *m);
}

int tok_pairmap_put(struct tok_pairmap *m, int32_t a, int32_t b, uint32_t rank, int32_t id)
{
    if (2 * (m->n + 1) > m->cap) {
        struct tok_pairmap g;
        if (tok_pairmap_init(&g, m->cap)) return -ENOMEM;
        for (size_t i = 0; i < m->cap; i++) {
            if (m->key[i] == UINT64_MAX) continue;
            size_t j = mix64(m->key[i]) & (g.cap - 1);
            while (g.key[j] != UINT64_MAX) j = (j + 1) & (g.cap - 1);
            g.key[j] = m->key[i];
            g.val[j] = m->val[i];
            g.n++;
        }
        tok_pairmap_free(m);
        *m = g;
    }
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t j = mix64(k) & (m->cap - 1);
    for (; m->key[j] != UINT64_MAX; j = (j + 1) & (m->cap - 1))
        if (m->key[j] == k) break;
    if (m->key[j] == UINT64_MAX) m->n++;
    m->key[j] = k;
    m->val[j] = (uint64_t)rank << 32 | (uint32_t)id;
    return 0;
}

int tok_pairmap_get(const struct tok_pairmap *m, int32_t a, int32_t b, uint32_t *rank, int32_t *id)
{
    if (!m->n) return 0;
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (size_t j = mix64(k) & (m->cap - 1); m->key[j] != UINT64_MAX; j = (j + 1) & (m->cap - 1))
        if (m->key[j] == k) {
            *rank = (uint32_t)(m->val[j] >> 32);
            *id = (int32_t)(uint32_t)m->val[j];
            return 1;
        }
    return 0;
}

/* ---- ids ---- */

int tok_ids_push(struct mw_tok_ids *ids, int32_t id)
{
    if (ids->n == ids->cap) {
        size_t cap = ids->cap ? ids->cap * 2 : 256;
        int32_t *v = realloc(ids->v, cap * sizeof *v);
        if (!v) return mw_error_set(-ENOMEM, "no memory for %zu token ids", cap);
        ids->v = v;
        ids->cap = cap;
    }
    ids->v[ids->n++] = id;
    return 0;
}

void mw_tok_ids_free(struct mw_tok_ids *ids)
{
    free(ids->v);
    ids->v = NULL;
    ids->n = ids->cap = 0;
}

/* ---- word cache ---- */

enum { TOK_CACHE_WORD = 128, TOK_CACHE_SLOTS = 1 << 16, TOK_CACHE_KEYS = 4 << 20, TOK_CACHE_IDS = 1 << 20 };

struct tok_cache_ent {
    uint32_t hash, key_len, n_ids, used;
    uint32_t key_off, ids_off;
};

struct tok_cache {
    struct tok_cache_ent ent[TOK_CACHE_SLOTS];
    size_t n;
    char keys[TOK_CACHE_KEYS];
    size_t keys_len;
    int32_t ids[TOK_CACHE_IDS];
    size_t ids_len;
};

int tok_cache_new(struct tok_cache **c)
{
    *c = calloc(1, sizeof **c);
    return *c ? 0 : mw_error_set(-ENOMEM, "no memory for the tokenizer's word cache");
}

void tok_cache_free(struct tok_cache *c) { free(c); }

static struct tok_cache_ent *cache_find(struct tok_cache *c, const unsigned char *w, size_t n, uint32_t h)
{
    size_t j = h & (TOK_CACHE_SLOTS - 1);
    for (; c->ent[j].used; j = (j + 1) & (TOK_CACHE_SLOTS - 1)) {
        struct tok_cache_ent *e = &c->ent[j];
        if (e->hash == h && e->key_len == n && !memcmp(c->keys + e->key_off, w, n)) return e;
    }
    return &c->ent[j]; /* the empty slot where it would go */
}

static void cache_put(struct tok_cache *c, const unsigned char *w, size_t n, uint32_t h, const int32_t *ids, size_t k)
{
    if (2 * (c->n + 1) > TOK_CACHE_SLOTS || c->keys_len + n > TOK_CACHE_KEYS || c->ids_len + k > TOK_CACHE_IDS) {
        memset(c->ent, 0, sizeof c->ent);
        c->n = c->keys_len = c->ids_len = 0;
    }
    struct tok_cache_ent *e = cache_find(c, w, n, h);
    if (e->used) return;
    memcpy(c->keys + c->keys_len, w, n);
    if (k) memcpy(c->ids + c->ids_len, ids, k * sizeof *ids);
    *e = (struct tok_cache_ent){h, (uint32_t)n, (uint32_t)k, 1, (uint32_t)c->keys_len, (uint32_t)c->ids_len};
    c->keys_len += n;
    c->ids_len += k;
    c->n++;
}

/* ---- the merge loop ---- */

struct heap_ent {
    uint32_t rank, pos;
    int32_t a, b, id;
};

static int heap_less(const struct heap_ent *x, const struct heap_ent *y)
{
    return x->rank < y->rank || (x->rank == y->rank && x->pos < y->pos);
}

static void heap_push(struct heap_ent *h, size_t *n, struct heap_ent e)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&e, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static struct heap_ent heap_pop(struct heap_ent *h, size_t *n)
{
    struct heap_ent top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(&h[c + 1], &h[c])) c++;
        if (!heap_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

/* The symbols one byte starts as: its vocabulary id; else its "<0xXX>" ids (byte_fallback: one
 * for each byte of the byte-level character's UTF-8, as HF does, when all exist; the loader
 * finds them); else unk (fused with an unk just
 * before it under fuse_unk); else nothing (HF drops a character it cannot represent). */
static size_t init_symbols(const mw_tok_t *t, const unsigned char *w, size_t n, int32_t *sym)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[w[i]];
        if (id >= 0) { sym[k++] = id; continue; }
        if (t->fallback_n[w[i]]) {
            for (int j = 0; j < t->fallback_n[w[i]]; j++) sym[k++] = t->fallback_ids[w[i]][j];
            continue;
        }
        if (t->unk_id >= 0) {
            if (t->fuse_unk && k > 0 && sym[k - 1] == t->unk_id) continue;
            sym[k++] = t->unk_id;
        }
    }
    return k;
}

int tok_bpe_word(mw_tok_t *t, const unsigned char *w, size_t n, struct mw_tok_ids *out)
{
    if (n == 0) return 0;
    if (t->ignore_merges) {
        int32_t id = tok_strmap_get(&t->by_bytes, t->arena, w, n);
        if (id >= 0) return tok_ids_push(out, id);
    }
    if (n == 1 && t->byte_id[w[0]] >= 0) return tok_ids_push(out, t->byte_id[w[0]]);
    uint32_t h = 0;
    struct tok_cache_ent *ce = NULL;
    if (n <= TOK_CACHE_WORD && t->cache) {
        h = tok_hash_bytes(w, n);
        ce = cache_find(t->cache, w, n, h);
        if (ce->used) {
            for (uint32_t i = 0; i < ce->n_ids; i++)
                if (tok_ids_push(out, t->cache->ids[ce->ids_off + i])) return -ENOMEM;
            return 0;
        }
    }
    enum { SMALL = 64 };
    int32_t sym_s[2 * SMALL], prev_s[2 * SMALL], next_s[2 * SMALL];
    struct heap_ent heap_s[6 * SMALL];
    int32_t *sym = sym_s, *prev = prev_s, *next = next_s;
    struct heap_ent *heap = heap_s;
    if (n > SMALL) {
        /* Up to two symbols a byte (byte fallback), and every merge pushes at most two entries. */
        sym = malloc(2 * n * sizeof *sym);
        prev = malloc(2 * n * sizeof *prev);
        next = malloc(2 * n * sizeof *next);
        heap = malloc(6 * n * sizeof *heap);
        if (!sym || !prev || !next || !heap) {
            free(sym); free(prev); free(next); free(heap);
            return mw_error_set(-ENOMEM, "no memory to merge a word of %zu bytes", n);
        }
    }
    size_t k = init_symbols(t, w, n, sym), hn = 0;
    for (size_t i = 0; i < k; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < k ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < k; i++) {
        uint32_t r;
        int32_t id;
        if (tok_pairmap_get(&t->merges, sym[i], sym[i + 1], &r, &id))
            heap_push(heap, &hn, (struct heap_ent){r, (uint32_t)i, sym[i], sym[i + 1], id});
    }
    while (hn) {
        struct heap_ent e = heap_pop(heap, &hn);
        int32_t p = (int32_t)e.pos, q = next[p];
        if (sym[p] != e.a || q < 0 || sym[q] != e.b) continue; /* stale */
        sym[p] = e.id;
        sym[q] = -1;
        next[p] = next[q];
        if (next[q] >= 0) prev[next[q]] = p;
        uint32_t r;
        int32_t id;
        if (prev[p] >= 0 && tok_pairmap_get(&t->merges, sym[prev[p]], sym[p], &r, &id))
            heap_push(heap, &hn, (struct heap_ent){r, (uint32_t)prev[p], sym[prev[p]], sym[p], id});
        if (next[p] >= 0 && tok_pairmap_get(&t->merges, sym[p], sym[next[p]], &r, &id))
            heap_push(heap, &hn, (struct heap_ent){r, (uint32_t)p, sym[p], sym[next[p]], id});
    }
    size_t first = out->n;
    int err = 0;
    for (int32_t i = k ? 0 : -1; i >= 0 && !err; i = next[i]) err = tok_ids_push(out, sym[i]);
    /* (A word of bytes the vocabulary cannot represent gives no ids, and out may have no array.) */
    if (!err && ce) cache_put(t->cache, w, n, h, out->n > first ? out->v + first : NULL, out->n - first);
    if (n > SMALL) { free(sym); free(prev); free(next); free(heap); }
    return err;
}
