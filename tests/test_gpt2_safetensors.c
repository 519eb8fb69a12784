/*
 * test_gpt2_safetensors.c — GPT-2 weights through safetensors: round trip (bitwise), a
 * Hugging Face-style file (prefix "transformer.", tied lm_head, attn.bias buffers, BF16 and
 * F16 dtypes), and every kind of broken file: truncated header, truncated data, bad JSON,
 * impossible header length, wrong shapes, missing, unexpected, duplicate and overlapping
 * tensors, shapes that overflow, non-finite or absurd weights (NaN, +-inf, +-1e34; also in BF16 and
 * F16 tensors, and through the streaming loader). Each must fail with MW_EFORMAT and a message
 * naming the problem, never crash (this test also runs under ASan), and leave the model's
 * weights bitwise as they were (verify, then apply). Then the config: config.json beside the
 * file gives the head count, a conflicting flag or an unimplemented setting is refused by name.
 */
#include "memwall/gpt2.h"
#include "memwall/common.h"
#include "model/safetensors.h"
#if defined(__GNUC__) && !defined(__clang__)
/* testutil.h's tu_scratch_dir formats a 512-byte path into a 600-byte command: gcc -O2 warns. */
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif
#include "testutil.h"

#include <errno.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct mw_gpt2_config tiny = {.n_layer = 2, .n_head = 2, .n_embd = 16, .max_seq_len = 8,
                                           .vocab_size = 11, .padded_vocab_size = 16};

static void copy_file(const char *from, const char *to, long keep, long flip_at)
{
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    REQUIRE(a && b);
    int c;
    long i = 0;
    while ((c = fgetc(a)) != EOF && (keep < 0 || i < keep)) {
        if (i == flip_at) c = '}';
        fputc(c, b);
        i++;
    }
    fclose(a);
    fclose(b);
}

static long header_len(const char *path)
{
    FILE *f = fopen(path, "rb");
    REQUIRE(f);
    uint8_t b[8];
    REQUIRE(fread(b, 1, 8, f) == 8);
    fclose(f);
    long n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | b[i];
    return n;
}

static void write_raw(const char *path, const char *json, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    uint64_t len = strlen(json);
    uint8_t lb[8];
    for (int i = 0; i < 8; i++) lb[i] = (uint8_t)(len >> (8 * i));
    REQUIRE(fwrite(lb, 1, 8, f) == 8 && fwrite(json, 1, len, f) == len);
    if (n) REQUIRE(fwrite(data, 1, n, f) == n);
    fclose(f);
}

static void expect_format_error(struct mw_gpt2 *m, const char *path, const char *needle, const char *what)
{
    float *before = malloc(m->sizes.params_bytes);
    REQUIRE(before);
    memcpy(before, m->params, m->sizes.params_bytes);
    mw_error_clear();
    int rc = mw_gpt2_load_safetensors(m, path);
    CHECK_MSG(rc == MW_EFORMAT, "%s: rc %d (%s)", what, rc, mw_error_msg());
    CHECK_MSG(strstr(mw_error_msg(), needle) != NULL, "%s: message \"%s\" lacks \"%s\"", what, mw_error_msg(), needle);
    CHECK_MSG(!memcmp(before, m->params, m->sizes.params_bytes), "%s: a failed load changed the weights", what);
    free(before);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    REQUIRE(f && fputs(text, f) >= 0);
    fclose(f);
}

/* The config of the tiny model, resolved from model.safetensors in dir, with config.json = json
 * (NULL: none) and flags; returns the rc, message in mw_error_msg(). */
static int resolve_with(const char *dir, const char *json, const struct mw_gpt2_config *flags,
                        struct mw_gpt2_config *c, struct mw_gpt2_provenance *pv)
{
    char cj[700], st[700];
    snprintf(cj, sizeof cj, "%s/config.json", dir);
    snprintf(st, sizeof st, "%s/model.safetensors", dir);
    if (json) write_text(cj, json);
    else unlink(cj);
    return mw_gpt2_config_resolve(st, flags, c, pv);
}

/* Writes an HF-like file of the tiny model without memwall's metadata (so n_head is unknown). */
static void save_plain(const struct mw_gpt2 *a, const char *path)
{
    struct mw_st_out t[40];
    int n = 0;
    for (int i = 0; i < a->n_tensors; i++) {
        const struct mw_gpt2_tensor *s = &a->tensors[i];
        t[n++] = (struct mw_st_out){s->name, s->ndim, {s->kind == MW_GPT2_WTE ? 11 : s->shape[0], s->shape[1]},
                                    a->params + s->offset};
    }
    REQUIRE(mw_st_write_f32(path, t, n, NULL, 0) == 0);
}

/* fp32 -> fp16 for the small values of an initialised model (normals; tiny values flush to 0). */
static uint16_t f32_to_f16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    int e = (int)((u >> 23) & 0xff) - 127 + 15;
    if (e <= 0) return sign;
    REQUIRE(e < 31);
    return (uint16_t)(sign | (unsigned)e << 10 | (u >> 13 & 0x3ffu));
}

/* Writes m's tensors as safetensors, names prefixed by prefix ("transformer." as HF's
 * GPT2LMHeadModel saves them), all F32 except tensor `half` in dtype "BF16" or "F16"; element
 * poison_at of that tensor (if >= 0) is the raw 16-bit word poison. */
static void save_with(const struct mw_gpt2 *m, const char *path, const char *prefix, const char *half,
                      const char *dtype, long poison_at, uint16_t poison)
{
    size_t cap = 1 << 16, jl = 0, off = 0;
    char *js = malloc(cap);
    uint8_t *data = malloc(m->sizes.params_bytes);
    REQUIRE(js && data);
    jl += (size_t)snprintf(js + jl, cap - jl, "{");
    for (int i = 0; i < m->n_tensors; i++) {
        const struct mw_gpt2_tensor *t = &m->tensors[i];
        size_t rows = t->kind == MW_GPT2_WTE ? (size_t)m->cfg.vocab_size : t->shape[0];
        size_t numel = t->ndim == 2 ? rows * t->shape[1] : rows;
        int h = half && !strcmp(t->name, half);
        size_t esz = h ? 2 : 4;
        char shape[64];
        if (t->ndim == 2) snprintf(shape, sizeof shape, "%zu,%zu", rows, t->shape[1]);
        else snprintf(shape, sizeof shape, "%zu", rows);
        jl += (size_t)snprintf(js + jl, cap - jl, "%s\"%s%s\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%zu,%zu]}",
                               i ? "," : "", prefix, t->name, h ? dtype : "F32", shape, off, off + numel * esz);
        REQUIRE(jl < cap);
        const float *src = m->params + t->offset;
        for (size_t j = 0; j < numel; j++) {
            if (!h) { memcpy(data + off + 4 * j, &src[j], 4); continue; }
            uint32_t u;
            memcpy(&u, &src[j], 4);
            uint16_t w = !strcmp(dtype, "BF16") ? (uint16_t)(u >> 16) : f32_to_f16(src[j]);
            if ((long)j == poison_at) w = poison;
            memcpy(data + off + 2 * j, &w, 2);
        }
        off += numel * esz;
    }
    jl += (size_t)snprintf(js + jl, cap - jl, "}");
    write_raw(path, js, data, off);
    free(js);
    free(data);
}

/* The model a with one element of one tensor set to v, saved (F32) to path. */
static void save_poisoned(const struct mw_gpt2 *a, const char *path, const char *name, size_t at, float v)
{
    struct mw_gpt2 n;
    struct mw_gpt2_options o = {.max_batch = 2, .max_seq = 8, .n_threads = 1};
    REQUIRE(mw_gpt2_init(&n, &a->cfg, &o) == 0);
    memcpy(n.params, a->params, a->sizes.params_bytes);
    n.params[mw_gpt2_find_tensor(&n, name)->offset + at] = v;
    REQUIRE(mw_gpt2_save_safetensors(&n, path) == 0);
    mw_gpt2_free(&n);
}

/* Weights that are not weights: NaN, +-inf and +-1e34 are refused by both loads (the whole-model
 * load and the streaming loader), naming the tensor as the file names it, the element and the
 * value; in BF16 and F16 tensors too. Values inside the bound still load bitwise. */
static void test_absurd_weights(struct mw_gpt2 *a, struct mw_gpt2 *b, const char *dir)
{
    char p[700];
    snprintf(p, sizeof p, "%s/absurd.safetensors", dir);
    static const struct { const char *tensor; size_t at; float v; const char *needle; } f32[] = {
        {"h.1.mlp.c_fc.weight", 37, INFINITY, "h.1.mlp.c_fc.weight\" element 37 (row 0, column 37) is inf"},
        {"h.0.ln_1.bias", 2, -INFINITY, "h.0.ln_1.bias\" element 2 is -inf"},
        {"wte.weight", 21, 1e34f, "wte.weight\" element 21 (row 1, column 5) is 1e+34"},
        {"h.1.attn.c_proj.bias", 0, -1e34f, "h.1.attn.c_proj.bias\" element 0 is -1e+34"},
        {"ln_f.weight", 15, 2e9f, "ln_f.weight\" element 15 is 2e+09"},
    };
    for (size_t i = 0; i < sizeof f32 / sizeof f32[0]; i++) {
        save_poisoned(a, p, f32[i].tensor, f32[i].at, f32[i].v);
        expect_format_error(b, p, f32[i].needle, f32[i].needle);
        CHECK_MSG(strstr(mw_error_msg(), "re-export the checkpoint"), "no advice: %s", mw_error_msg());
        struct mw_gpt2_st_loader *l = (struct mw_gpt2_st_loader *)1;
        mw_error_clear();
        CHECK(mw_gpt2_st_loader_open(&l, b, p) == MW_EFORMAT && l == NULL);
        CHECK_MSG(strstr(mw_error_msg(), f32[i].needle), "streaming loader: %s", mw_error_msg());
        mw_gpt2_st_loader_close(l == (struct mw_gpt2_st_loader *)1 ? NULL : l);
    }
    /* Large but inside the bound: loads, bitwise. */
    save_poisoned(a, p, "wpe.weight", 3, 5e8f);
    CHECK(mw_gpt2_load_safetensors(b, p) == 0);
    CHECK(b->params[mw_gpt2_find_tensor(b, "wpe.weight")->offset + 3] == 5e8f);
    /* Converted dtypes, with HF's "transformer." names: the message names the file's tensor. */
    save_with(a, p, "transformer.", "wpe.weight", "BF16", -1, 0);
    CHECK_MSG(mw_gpt2_load_safetensors(b, p) == 0, "a clean BF16 wpe: %s", mw_error_msg());
    uint32_t u;
    float big = 1e34f;
    memcpy(&u, &big, 4);
    save_with(a, p, "transformer.", "wpe.weight", "BF16", 19, (uint16_t)(u >> 16));
    expect_format_error(b, p, "\"transformer.wpe.weight\" element 19 (row 1, column 3) is 9.9", "BF16 1e34");
    save_with(a, p, "transformer.", "ln_f.weight", "F16", -1, 0);
    CHECK_MSG(mw_gpt2_load_safetensors(b, p) == 0, "a clean F16 ln_f.weight: %s", mw_error_msg());
    save_with(a, p, "transformer.", "ln_f.weight", "F16", 4, 0x7C00);
    expect_format_error(b, p, "\"transformer.ln_f.weight\" element 4 is inf", "F16 inf");
    save_with(a, p, "", "h.0.attn.c_attn.bias", "F16", 7, 0x7E00);
    expect_format_error(b, p, "\"h.0.attn.c_attn.bias\" element 7 is nan", "F16 NaN");
    /* And the clean F32 file is still loaded bitwise. */
    char good[700];
    snprintf(good, sizeof good, "%s/model.safetensors", dir);
    CHECK(mw_gpt2_load_safetensors(b, good) == 0);
    CHECK(!memcmp(a->params, b->params, a->sizes.params_bytes));
}

int main(void)
{
    const char *dir = tu_scratch_dir("gpt2_safetensors");
    char path[700], bad[700];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(bad, sizeof bad, "%s/bad.safetensors", dir);
    struct mw_gpt2_options o = {.max_batch = 2, .max_seq = 8, .n_threads = 1};

    /* Round trip. */
    struct mw_gpt2 a, b;
    REQUIRE(mw_gpt2_init(&a, &tiny, &o) == 0 && mw_gpt2_init(&b, &tiny, &o) == 0);
    mw_gpt2_init_weights(&a, 5);
    CHECK(mw_gpt2_save_safetensors(&a, path) == 0);
    struct mw_gpt2_config c;
    CHECK(mw_gpt2_config_from_safetensors(path, &c) == 0);
    CHECK(c.n_layer == 2 && c.n_head == 2 && c.n_embd == 16 && c.max_seq_len == 8 && c.vocab_size == 11 &&
          c.padded_vocab_size == 16);
    for (size_t i = 0; i < b.sizes.n_params; i++) b.params[i] = 7.0f; /* padding must be re-zeroed */
    CHECK(mw_gpt2_load_safetensors(&b, path) == 0);
    CHECK(!memcmp(a.params, b.params, a.sizes.params_bytes));
    int32_t in[16], tg[16];
    for (int i = 0; i < 16; i++) { in[i] = i % 11; tg[i] = (i * 3) % 11; }
    REQUIRE(mw_gpt2_forward(&a, in, tg, 2, 8) == 0 && mw_gpt2_forward(&b, in, tg, 2, 8) == 0);
    CHECK(a.loss == b.loss && isfinite(a.loss));

    /* HF-style file: "transformer." prefix, lm_head.weight, attn.bias buffers, BF16 wpe, F16 ln_f. */
    {
        struct mw_st_out t[40];
        int n = 0;
        char names[40][64];
        float mask[64];
        for (int i = 0; i < 64; i++) mask[i] = 1.0f;
        uint16_t bf[8 * 16], hf[16];
        for (int i = 0; i < a.n_tensors; i++) {
            const struct mw_gpt2_tensor *s = &a.tensors[i];
            if (s->kind == MW_GPT2_WPE || s->kind == MW_GPT2_LNF_W) continue;
            snprintf(names[n], 64, "transformer.%s", s->name);
            t[n] = (struct mw_st_out){names[n], s->ndim, {s->kind == MW_GPT2_WTE ? 11 : s->shape[0], s->shape[1]},
                                      a.params + s->offset};
            n++;
        }
        t[n++] = (struct mw_st_out){"lm_head.weight", 2, {11, 16}, a.params};
        t[n++] = (struct mw_st_out){"transformer.h.0.attn.bias", 2, {8, 8}, mask};
        t[n++] = (struct mw_st_out){"transformer.h.1.attn.masked_bias", 1, {1, 1}, mask};
        char hfpath[700];
        snprintf(hfpath, sizeof hfpath, "%s/hf_part.safetensors", dir);
        REQUIRE(mw_st_write_f32(hfpath, t, n, NULL, 0) == 0);
        /* Append BF16 wpe and F16 ln_f.weight by rewriting the file by hand: simpler to build a
         * second raw file holding just those and check conversions through mw_st_read_f32. */
        const float *wpe = a.params + mw_gpt2_find_tensor(&a, "wpe.weight")->offset;
        for (int i = 0; i < 8 * 16; i++) { uint32_t u; memcpy(&u, &wpe[i], 4); bf[i] = (uint16_t)(u >> 16); }
        for (int i = 0; i < 16; i++) hf[i] = (uint16_t)(0x3C00 + i); /* 1 + i/1024 in fp16 */
        char raw[4096];
        uint8_t data[8 * 16 * 2 + 32];
        memcpy(data, bf, sizeof bf);
        memcpy(data + sizeof bf, hf, sizeof hf);
        snprintf(raw, sizeof raw, "{\"wpe.weight\":{\"dtype\":\"BF16\",\"shape\":[8,16],\"data_offsets\":[0,256]},"
                 "\"ln_f.weight\":{\"dtype\":\"F16\",\"shape\":[16],\"data_offsets\":[256,288]}}");
        write_raw(bad, raw, data, sizeof data);
        struct mw_st_file f;
        REQUIRE(mw_st_open(&f, bad) == 0);
        float w[128], l[16];
        CHECK(mw_st_read_f32(&f, mw_st_find(&f, "wpe.weight"), 0, 128, w) == 0);
        CHECK(mw_st_read_f32(&f, mw_st_find(&f, "ln_f.weight"), 0, 16, l) == 0);
        for (int i = 0; i < 128; i++) CHECK(fabsf(w[i] - wpe[i]) <= fabsf(wpe[i]) * (1.0f / 128));
        for (int i = 0; i < 16; i++) CHECK(l[i] == 1.0f + (float)i / 1024.0f);
        mw_st_close(&f);
        /* Without wpe/ln_f.weight the HF-style file must report the missing tensor... */
        expect_format_error(&b, hfpath, "wpe.weight", "missing tensor");
    }

    /* Truncations and corruption of the good file. */
    long hl = header_len(path);
    copy_file(path, bad, 5, -1);
    expect_format_error(&b, bad, "truncated", "5-byte file");
    copy_file(path, bad, 8 + hl / 2, -1);
    expect_format_error(&b, bad, "header length", "truncated header");
    {
        FILE *f = fopen(path, "rb");
        REQUIRE(f);
        fseek(f, 0, SEEK_END);
        long sz = ftell(f);
        fclose(f);
        copy_file(path, bad, sz - 100, -1);
        expect_format_error(&b, bad, "truncated", "truncated data");
    }
    copy_file(path, bad, -1, 8 + hl / 3); /* one header byte overwritten: some MW_EFORMAT */
    expect_format_error(&b, bad, "", "corrupt header byte");
    write_raw(bad, "{\"wte.weight\":{\"dtype\":\"F32\",\"shape\":[1,", NULL, 0);
    expect_format_error(&b, bad, "JSON", "bad JSON");
    write_raw(bad, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}} x", "abcd", 4);
    expect_format_error(&b, bad, "JSON", "trailing garbage after JSON");
    write_raw(bad, "{\"wte.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", "abcd", 4);
    expect_format_error(&b, bad, "data_offsets span", "offsets vs shape");
    write_raw(bad, "{\"wte.weight\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,4]}}", "abcd", 4);
    expect_format_error(&b, bad, "unknown dtype", "unknown dtype");
    write_raw(bad, "[1,2,3]", NULL, 0);
    expect_format_error(&b, bad, "JSON", "header not an object");
    {
        FILE *f = fopen(bad, "wb");
        uint8_t huge[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, '{', '}'};
        REQUIRE(f && fwrite(huge, 1, 16, f) == 16);
        fclose(f);
        expect_format_error(&b, bad, "header length", "huge header length");
    }

    /* Hostile headers: duplicates, overlaps, a shape whose product wraps, a bad offset. */
    write_raw(bad, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
              "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", "abcdefgh", 8);
    expect_format_error(&b, bad, "appears twice", "duplicate name");
    write_raw(bad, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", "abcdefgh", 8);
    expect_format_error(&b, bad, "overlap", "overlapping tensors");
    write_raw(bad, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}",
              NULL, 0);
    expect_format_error(&b, bad, "overflows", "shape product wraps");
    write_raw(bad, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[1e300,4]}}", "abcd", 4);
    expect_format_error(&b, bad, "data_offsets", "offset 1e300");
    write_raw(bad, "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", "abcd", 4);
    expect_format_error(&b, bad, "shape[0]", "negative dimension");
    write_raw(bad, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", "abcd", 4);
    expect_format_error(&b, bad, "shape[0]", "fractional dimension");
    /* A good file whose last tensor holds a NaN: refused by the verify pass, nothing applied. */
    {
        struct mw_gpt2 n;
        REQUIRE(mw_gpt2_init(&n, &tiny, &o) == 0);
        mw_gpt2_init_weights(&n, 9);
        const struct mw_gpt2_tensor *lnfb = mw_gpt2_find_tensor(&n, "ln_f.bias");
        n.params[lnfb->offset + 3] = NAN;
        REQUIRE(mw_gpt2_save_safetensors(&n, bad) == 0);
        expect_format_error(&b, bad, "ln_f.bias\" element 3", "NaN weight");
        mw_gpt2_free(&n);
    }

    test_absurd_weights(&a, &b, dir);

    /* The config: the head count from config.json beside the file, not a guess. */
    {
        char cdir[600], st[700];
        snprintf(cdir, sizeof cdir, "%s/hf", dir);
        REQUIRE(mkdir(cdir, 0755) == 0);
        snprintf(st, sizeof st, "%s/model.safetensors", cdir);
        save_plain(&a, st);
        struct mw_gpt2_config rc_cfg, fl = {0};
        struct mw_gpt2_provenance pv;
        /* Nothing says n_head: C/64 does not divide, the guess is 1, and it says it guessed. */
        CHECK(resolve_with(cdir, NULL, NULL, &rc_cfg, &pv) == 0);
        CHECK(rc_cfg.n_head == 1 && pv.n_head == MW_GPT2_FROM_GUESS && pv.config_json[0] == 0);
        CHECK(rc_cfg.n_layer == 2 && pv.n_layer == MW_GPT2_FROM_TENSORS && rc_cfg.vocab_size == 11);
        /* A flag fills it. */
        fl.n_head = 4;
        CHECK(resolve_with(cdir, NULL, &fl, &rc_cfg, &pv) == 0);
        CHECK(rc_cfg.n_head == 4 && pv.n_head == MW_GPT2_FROM_FLAG);
        /* config.json says 2: it wins over the guess, and a flag saying 4 is refused naming both. */
        const char *good = "{\"model_type\":\"gpt2\",\"n_layer\":2,\"n_head\":2,\"n_embd\":16,\"n_positions\":8,"
                           "\"vocab_size\":11,\"layer_norm_epsilon\":1e-05,\"activation_function\":\"gelu_new\","
                           "\"n_inner\":null,\"resid_pdrop\":0.1}";
        CHECK(resolve_with(cdir, good, NULL, &rc_cfg, &pv) == 0);
        CHECK(rc_cfg.n_head == 2 && pv.n_head == MW_GPT2_FROM_CONFIG_JSON && strstr(pv.config_json, "config.json"));
        CHECK(pv.vocab_size == MW_GPT2_FROM_CONFIG_JSON && rc_cfg.padded_vocab_size == 0);
        CHECK(resolve_with(cdir, good, &fl, &rc_cfg, &pv) == MW_EFORMAT);
        CHECK_MSG(strstr(mw_error_msg(), "n_head") && strstr(mw_error_msg(), "config.json") &&
                  strstr(mw_error_msg(), "command line"), "conflict message: %s", mw_error_msg());
        fl.n_head = 2;
        CHECK(resolve_with(cdir, good, &fl, &rc_cfg, &pv) == 0 && pv.n_head == MW_GPT2_FROM_CONFIG_JSON);
        /* What memwall does not implement is refused by name; sizes that disagree with the tensors too. */
        static const struct { const char *json, *needle; } refuse[] = {
            {"{\"n_head\":2,\"activation_function\":\"relu\"}", "activation_function \"relu\""},
            {"{\"n_head\":2,\"activation_function\":\"gelu\"}", "activation_function \"gelu\""},
            {"{\"n_head\":2,\"layer_norm_epsilon\":1e-6}", "layer_norm_epsilon"},
            {"{\"n_head\":2,\"n_embd\":16,\"n_inner\":32}", "n_inner"},
            {"{\"n_head\":2,\"scale_attn_weights\":false}", "scale_attn_weights"},
            {"{\"n_head\":2,\"scale_attn_by_inverse_layer_idx\":true}", "scale_attn_by_inverse_layer_idx"},
            {"{\"n_head\":2,\"tie_word_embeddings\":false}", "tie_word_embeddings"},
            {"{\"model_type\":\"llama\"}", "model_type"},
            {"{\"n_layer\":3}", "n_layer is 2 by the tensor shapes but 3 by the config.json"},
            {"{\"n_positions\":1024}", "n_positions"},
            {"{\"n_head\":1e300}", "n_head"},
            {"{\"n_head\":3}", "not a multiple"},
            {"{\"vocab_size\":12}", "vocab_size 12"},
            {"[1]", "not a JSON object"},
        };
        for (size_t i = 0; i < sizeof refuse / sizeof refuse[0]; i++) {
            int r = resolve_with(cdir, refuse[i].json, NULL, &rc_cfg, &pv);
            CHECK_MSG(r == MW_EFORMAT && strstr(mw_error_msg(), refuse[i].needle), "%s: rc %d, \"%s\"",
                      refuse[i].json, r, mw_error_msg());
        }
        resolve_with(cdir, NULL, NULL, &rc_cfg, &pv);
    }

    /* Wrong shapes: a model of another width. */
    struct mw_gpt2_config wide = tiny;
    wide.n_embd = 32;
    struct mw_gpt2 w;
    REQUIRE(mw_gpt2_init(&w, &wide, &o) == 0);
    expect_format_error(&w, path, "shape", "wrong width");
    mw_gpt2_free(&w);
    /* A model with fewer layers finds an unexpected h.1 tensor. */
    struct mw_gpt2_config shallow = tiny;
    shallow.n_layer = 1;
    REQUIRE(mw_gpt2_init(&w, &shallow, &o) == 0);
    expect_format_error(&w, path, "unexpected tensor", "extra layer");
    mw_gpt2_free(&w);

    CHECK(mw_gpt2_load_safetensors(&b, "/nonexistent/x.safetensors") == -ENOENT);
    write_raw(bad, "[1,2,3]", NULL, 0);
    CHECK(mw_gpt2_config_from_safetensors(bad, &c) == MW_EFORMAT);

    mw_gpt2_free(&a);
    mw_gpt2_free(&b);
    tu_rm_rf(dir);
    TEST_END();
}
