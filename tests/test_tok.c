/* test_tok.c — the byte-level BPE tokenizer (src/tok/) against Hugging Face tokenizers:
 * - three tokenizers trained by scripts/gen_tok_fixtures.py with GPT-2's, Llama-3's and Qwen2's
 *   pre-tokenizer patterns (Qwen2 with NFC, Llama-3 with ignore_merges, merges in both
 *   spellings, added tokens with lstrip / rstrip / single_word / normalized): HF's ids for a
 *   mixed-script text, element by element, plain, with the post-processor's tokens, with special
 *   tokens as text, and line by line; decode(encode(x)) == x (normalized);
 * - cases.json: small tokenizers for every Split behaviour, add_prefix_space, unk / fuse_unk,
 *   byte_fallback, ignore_merges and the Roberta/Bert post-processors, HF's ids for each;
 * - bytes that are not UTF-8: one byte token each, and decode(encode(x)) == x for random bytes;
 * - hostile tokenizer.json files: each refused with MW_EFORMAT and a message naming the fault.
 * The fixtures are committed; nothing here needs Python. */
#include "memwall/tok.h"
#include "memwall/common.h"
#include "testutil.h"

#include <cjson/cJSON.h>

static char g_fix[600];

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "cannot open %s\n", path); exit(1); }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)len + 1);
    REQUIRE(b && fread(b, 1, (size_t)len, f) == (size_t)len);
    fclose(f);
    b[len] = 0;
    if (n) *n = (size_t)len;
    return b;
}

static const char *fix(const char *rel)
{
    static char p[4][900];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", g_fix, rel);
    return p[k];
}

/* Whitespace-separated ids of s[0..n) (one line of a fixture). */
static void parse_ids(const char *s, size_t n, struct mw_tok_ids *ids)
{
    ids->n = 0;
    size_t i = 0;
    while (i < n) {
        if (s[i] == ' ' || s[i] == '\n') { i++; continue; }
        long v = 0;
        while (i < n && s[i] >= '0' && s[i] <= '9') v = v * 10 + (s[i++] - '0');
        if (ids->n == ids->cap) {
            ids->cap = ids->cap ? 2 * ids->cap : 256;
            ids->v = realloc(ids->v, ids->cap * sizeof *ids->v);
            REQUIRE(ids->v);
        }
        ids->v[ids->n++] = (int32_t)v;
    }
}

/* Element by element; the first difference is reported with its neighbours. */
static int same_ids(const char *what, const struct mw_tok_ids *got, const struct mw_tok_ids *want)
{
    size_t n = MW_MIN(got->n, want->n), i = 0;
    while (i < n && got->v[i] == want->v[i]) i++;
    tu_checks++;
    if (i == n && got->n == want->n) return 1;
    tu_failures++;
    fprintf(stderr, "%s: ids differ at %zu (got %zu ids, want %zu):\n  got ", what, i, got->n, want->n);
    for (size_t j = i > 3 ? i - 3 : 0; j < MW_MIN(got->n, i + 5); j++) fprintf(stderr, " %d", got->v[j]);
    fprintf(stderr, "\n  want");
    for (size_t j = i > 3 ? i - 3 : 0; j < MW_MIN(want->n, i + 5); j++) fprintf(stderr, " %d", want->v[j]);
    fputc('\n', stderr);
    return 0;
}

static void check_file_ids(mw_tok_t *t, const char *name, const char *text, size_t n, unsigned flags, const char *file)
{
    char rel[128], what[160];
    snprintf(rel, sizeof rel, "%s/%s", name, file);
    size_t len;
    char *s = slurp(fix(rel), &len);
    struct mw_tok_ids want = {0}, got = {0};
    parse_ids(s, len, &want);
    CHECK_EQ_INT(mw_tok_encode(t, text, n, flags, &got), 0);
    snprintf(what, sizeof what, "%s %s", name, file);
    same_ids(what, &got, &want);
    mw_tok_ids_free(&want);
    mw_tok_ids_free(&got);
    free(s);
}

static void test_trained(const char *name, int expect_nfc)
{
    size_t n;
    char *text = slurp(fix("text.txt"), &n);
    mw_tok_t *t = NULL;
    char dir[64];
    snprintf(dir, sizeof dir, "%s", name);
    int rc = mw_tok_load(&t, fix(dir), NULL);
    CHECK_MSG(rc == 0, "%s: %s", name, mw_error_msg());
    if (rc) { free(text); return; }
    check_file_ids(t, name, text, n, 0, "ids.txt");
    check_file_ids(t, name, text, n, MW_TOK_ADD_SPECIAL, "ids_special.txt");
    check_file_ids(t, name, text, n, MW_TOK_SPLIT_SPECIAL, "ids_split.txt");

    /* Line by line: each line of the text (with its \n) on its own. */
    char rel[128];
    snprintf(rel, sizeof rel, "%s/ids_lines.txt", name);
    size_t ln;
    char *lines = slurp(fix(rel), &ln);
    const char *p = text, *end = text + n, *q = lines, *qend = lines + ln;
    int k = 0, bad = 0;
    while (p < end && q < qend) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) + 1 : (size_t)(end - p);
        const char *qnl = memchr(q, '\n', (size_t)(qend - q));
        size_t qlen = qnl ? (size_t)(qnl - q) : (size_t)(qend - q);
        struct mw_tok_ids want = {0}, got = {0};
        parse_ids(q, qlen, &want);
        CHECK_EQ_INT(mw_tok_encode(t, p, len, 0, &got), 0);
        char what[64];
        snprintf(what, sizeof what, "%s line %d", name, k + 1);
        if (!same_ids(what, &got, &want) && ++bad > 3) { mw_tok_ids_free(&want); mw_tok_ids_free(&got); break; }
        mw_tok_ids_free(&want);
        mw_tok_ids_free(&got);
        p += len;
        q += qlen + 1;
        k++;
    }
    CHECK_MSG(k > 100, "%s: only %d lines compared", name, k);
    free(lines);

    /* decode(encode(x)) is the normalized text (special tokens as text, so nothing is stripped). */
    snprintf(rel, sizeof rel, "%s/normalized.txt", name);
    size_t nn;
    char *norm = slurp(fix(rel), &nn);
    CHECK_EQ_INT(expect_nfc, nn != n || memcmp(norm, text, n) != 0);
    struct mw_tok_ids ids = {0};
    CHECK_EQ_INT(mw_tok_encode(t, text, n, MW_TOK_SPLIT_SPECIAL, &ids), 0);
    char *out = NULL;
    size_t olen = 0, ocap = 0;
    CHECK_EQ_INT(mw_tok_decode_ids(t, ids.v, ids.n, 0, &out, &olen, &ocap), 0);
    CHECK_MSG(olen == nn && !memcmp(out, norm, nn), "%s: decode(encode(text)) is not the normalized text", name);
    /* Skipping special tokens in decoding drops exactly their bytes. */
    mw_tok_ids_free(&ids);
    CHECK_EQ_INT(mw_tok_encode(t, "<|endoftext|>x", 14, 0, &ids), 0);
    free(out);
    out = NULL;
    olen = ocap = 0;
    CHECK_EQ_INT(mw_tok_decode_ids(t, ids.v, ids.n, MW_TOK_SKIP_SPECIAL, &out, &olen, &ocap), 0);
    if (mw_tok_token_id(t, "<|endoftext|>") >= 0) CHECK(olen == 1 && out[0] == 'x');
    int32_t badid = mw_tok_vocab_size(t);
    mw_error_clear();
    CHECK_EQ_INT(mw_tok_decode_ids(t, &badid, 1, 0, &out, &olen, &ocap), -EINVAL);
    CHECK(strstr(mw_error_msg(), "not in the vocabulary") != NULL);
    free(out);
    mw_tok_ids_free(&ids);
    free(norm);
    mw_tok_free(t);
    free(text);
}

static void test_cases(void)
{
    char *s = slurp(fix("cases.json"), NULL);
    cJSON *root = cJSON_Parse(s);
    REQUIRE(cJSON_IsArray(root));
    int count = 0;
    for (const cJSON *c = root->child; c; c = c->next, count++) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        char *json = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "tokenizer"));
        const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
        struct mw_tok_ids want = {0}, got = {0};
        for (const cJSON *x = cJSON_GetObjectItem(c, "ids")->child; x; x = x->next) {
            if (want.n == want.cap) { want.cap = want.cap ? 2 * want.cap : 64; want.v = realloc(want.v, want.cap * 4); }
            want.v[want.n++] = (int32_t)x->valuedouble;
        }
        mw_tok_t *t = NULL;
        int rc = mw_tok_load_json(&t, json, strlen(json), name);
        CHECK_MSG(rc == 0, "%s: %s", name, mw_error_msg());
        if (!rc) {
            unsigned flags = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_special")) ? MW_TOK_ADD_SPECIAL : 0;
            CHECK_EQ_INT(mw_tok_encode(t, text, strlen(text), flags, &got), 0);
            same_ids(name, &got, &want);
        }
        mw_tok_free(t);
        mw_tok_ids_free(&want);
        mw_tok_ids_free(&got);
        free(json);
    }
    CHECK(count >= 20);
    cJSON_Delete(root);
    free(s);
}

static int32_t id_of_byte(mw_tok_t *t, unsigned char b)
{
    /* The byte-level character of b, as the vocabulary spells it. */
    uint32_t u = b;
    int self = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    if (!self) {
        u = 0x100;
        for (int c = 0; c < b; c++)
            if (!((c >= '!' && c <= '~') || (c >= 0xa1 && c <= 0xac) || c >= 0xae)) u++;
    }
    char s[4];
    if (u < 0x80) { s[0] = (char)u; s[1] = 0; }
    else { s[0] = (char)(0xc0 | u >> 6); s[1] = (char)(0x80 | (u & 0x3f)); s[2] = 0; }
    return mw_tok_token_id(t, s);
}

static void test_invalid_utf8(void)
{
    mw_tok_t *t = NULL;
    REQUIRE(mw_tok_load(&t, fix("llama3/tokenizer.json"), NULL) == 0);
    struct mw_tok_ids ids = {0};
    /* "a", 0x80 (a lone continuation byte), "b": three runs, three ids. */
    CHECK_EQ_INT(mw_tok_encode(t, "a\x80" "b", 3, 0, &ids), 0);
    CHECK(ids.n == 3 && ids.v[0] == id_of_byte(t, 'a') && ids.v[1] == id_of_byte(t, 0x80) && ids.v[2] == id_of_byte(t, 'b'));
    CHECK(id_of_byte(t, 0x80) >= 0 && id_of_byte(t, 0xff) >= 0);
    /* A truncated 3-byte sequence, an overlong '/', a surrogate, 0xff: one byte token each. */
    const char bad[] = "\xe4\xb8" "\xc0\xaf" "\xed\xa0\x80" "\xff";
    ids.n = 0;
    CHECK_EQ_INT(mw_tok_encode(t, bad, sizeof bad - 1, 0, &ids), 0);
    CHECK_EQ_INT(ids.n, sizeof bad - 1);
    for (size_t i = 0; i < ids.n && i < sizeof bad - 1; i++) CHECK_EQ_INT(ids.v[i], id_of_byte(t, (unsigned char)bad[i]));
    /* Random bytes (some valid UTF-8, most not) survive encode + decode, in both tokenizers
     * without a normalizer. */
    const char *names[] = {"gpt2", "llama3"};
    for (int k = 0; k < 2; k++) {
        mw_tok_t *u = NULL;
        REQUIRE(mw_tok_load(&u, fix(names[k]), NULL) == 0);
        uint64_t seed = 42 + (uint64_t)k;
        for (int r = 0; r < 300; r++) {
            unsigned char buf[200];
            size_t n = tu_rand(&seed) % sizeof buf;
            for (size_t i = 0; i < n; i++) {
                uint64_t x = tu_rand(&seed);
                buf[i] = (unsigned char)(x % 4 == 0 ? ' ' : x % 4 == 1 ? 'a' + (x >> 8) % 26 : (x >> 16) & 0xff);
            }
            struct mw_tok_ids v = {0};
            char *out = NULL;
            size_t ol = 0, oc = 0;
            CHECK_EQ_INT(mw_tok_encode(u, (const char *)buf, n, MW_TOK_SPLIT_SPECIAL, &v), 0);
            CHECK_EQ_INT(mw_tok_decode_ids(u, v.v, v.n, 0, &out, &ol, &oc), 0);
            CHECK_MSG(ol == n && (!n || !memcmp(out, buf, n)), "%s: random bytes %d do not survive encode + decode",
                      names[k], r);
            free(out);
            mw_tok_ids_free(&v);
        }
        /* A long word without spaces goes through the heap merge path and the cache limit. */
        size_t big = 300000;
        char *w = malloc(big);
        REQUIRE(w);
        for (size_t i = 0; i < big; i++) w[i] = "abcab"[i % 5];
        struct mw_tok_ids v = {0};
        char *out = NULL;
        size_t ol = 0, oc = 0;
        CHECK_EQ_INT(mw_tok_encode(u, w, big, 0, &v), 0);
        CHECK_EQ_INT(mw_tok_decode_ids(u, v.v, v.n, 0, &out, &ol, &oc), 0);
        CHECK(ol == big && !memcmp(out, w, big));
        free(out);
        free(w);
        mw_tok_ids_free(&v);
        mw_tok_free(u);
    }
    mw_tok_ids_free(&ids);
    mw_tok_free(t);
}

/* A tokenizer.json with the given parts; NULL parts are left out. */
static char *make_json(const char *model, const char *pre, const char *extra)
{
    char *s = malloc(8192);
    REQUIRE(s);
    snprintf(s, 8192, "{\"added_tokens\":[],%s%s%s\"model\":%s}", pre ? "\"pre_tokenizer\":" : "", pre ? pre : "",
             pre ? "," : "", model);
    if (extra) {
        char *t = malloc(8192);
        REQUIRE(t);
        snprintf(t, 8192, "{%s,%s", extra, s + 1);
        free(s);
        s = t;
    }
    return s;
}

static void expect_refused(const char *what, const char *json, const char *needle)
{
    mw_tok_t *t = (mw_tok_t *)1;
    mw_error_clear();
    int rc = mw_tok_load_json(&t, json, strlen(json), what);
    CHECK_MSG(rc == MW_EFORMAT, "%s: got %d (%s)", what, rc, mw_error_msg());
    CHECK(t == NULL);
    CHECK_MSG(strstr(mw_error_msg(), needle) != NULL, "%s: message '%s' lacks '%s'", what, mw_error_msg(), needle);
}

static void test_hostile(void)
{
    const char *bl = "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}";
    const char *ok_model = "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]}";
    char *j = make_json(ok_model, bl, NULL);
    mw_tok_t *t = NULL;
    CHECK_MSG(mw_tok_load_json(&t, j, strlen(j), "ok") == 0, "%s", mw_error_msg());
    struct mw_tok_ids ids = {0};
    CHECK(t && mw_tok_encode(t, "abab", 4, 0, &ids) == 0 && ids.n == 2 && ids.v[0] == 2 && ids.v[1] == 2);
    mw_tok_ids_free(&ids);
    mw_tok_free(t);
    free(j);

    expect_refused("not JSON", "{\"model\": {", "not valid JSON");
    expect_refused("an array", "[1,2]", "not a JSON object");
    expect_refused("no model", "{\"pre_tokenizer\":null}", "no \"model\"");
    struct { const char *what, *model, *pre, *extra, *needle; } cases[] = {
        {"WordPiece", "{\"type\":\"WordPiece\",\"vocab\":{}}", bl, NULL, "unknown model type 'WordPiece'"},
        {"no pre-tokenizer", ok_model, NULL, NULL, "no pre-tokenizer"},
        {"Metaspace", ok_model, "{\"type\":\"Metaspace\"}", NULL, "pre-tokenizer 'Metaspace' is not supported"},
        {"no ByteLevel", ok_model, "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},\"behavior\":\"Isolated\"}", NULL,
         "must end with ByteLevel"},
        {"bad regex", ok_model, "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
         "\"(a\"},\"behavior\":\"Isolated\"}," "{\"type\":\"ByteLevel\"}]}", NULL, "does not compile"},
        {"bad behavior", ok_model, "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"String\":"
         "\" \"},\"behavior\":\"Sideways\"},{\"type\":\"ByteLevel\"}]}", NULL, "behavior must be one of"},
        {"negative id", "{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}", bl, NULL, "whole number"},
        {"huge id", "{\"type\":\"BPE\",\"vocab\":{\"a\":1e12},\"merges\":[]}", bl, NULL, "whole number"},
        {"fractional id", "{\"type\":\"BPE\",\"vocab\":{\"a\":1.5},\"merges\":[]}", bl, NULL, "whole number"},
        {"string id", "{\"type\":\"BPE\",\"vocab\":{\"a\":\"1\"},\"merges\":[]}", bl, NULL, "whole number"},
        {"vocab array", "{\"type\":\"BPE\",\"vocab\":[],\"merges\":[]}", bl, NULL, "model.vocab must be an object"},
        {"merge unknown", "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a b\"]}", bl, NULL,
         "not in the vocabulary: 'ab'"},
        {"merge three", "{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b c\"]}", bl, NULL,
         "not two tokens"},
        {"merge pair of 3", "{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[[\"a\",\"a\",\"a\"]]}", bl, NULL,
         "neither"},
        {"prefix", "{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[],\"continuing_subword_prefix\":\"##\"}", bl,
         NULL, "not byte-level"},
        {"unk missing", "{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[],\"unk_token\":\"<unk>\"}", bl, NULL,
         "unk_token '<unk>' is not in the vocabulary"},
        {"NFKC", ok_model, bl, "\"normalizer\":{\"type\":\"NFKC\"}", "normalizer 'NFKC' is not supported"},
        {"added not UTF-8", ok_model, bl, "\"added_tokens\":[{\"id\":5,\"content\":\"\xc3\",\"special\":true}]",
         "not valid UTF-8"},
        {"added bad id", ok_model, bl, "\"added_tokens\":[{\"id\":-3,\"content\":\"x\"}]", "whole number"},
        {"bool as string", ok_model, "{\"type\":\"ByteLevel\",\"add_prefix_space\":\"no\"}", NULL, "true or false"},
        {"template no A", ok_model, bl, "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[],"
         "\"special_tokens\":{}}", "no sequence $A"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *s = make_json(cases[i].model, cases[i].pre, cases[i].extra);
        expect_refused(cases[i].what, s, cases[i].needle);
        free(s);
    }
    /* Missing file and a directory without tokenizer.json: errno-style, naming the path. */
    mw_error_clear();
    CHECK_EQ_INT(mw_tok_load(&t, fix("no-such-file.json"), NULL), -ENOENT);
    CHECK(strstr(mw_error_msg(), "no-such-file.json") != NULL);
    CHECK(mw_tok_load(&t, g_fix, NULL) == -ENOENT);
    /* An unsupported post-processor loads, but refuses MW_TOK_ADD_SPECIAL. */
    j = make_json(ok_model, bl, "\"post_processor\":{\"type\":\"Unknown\"}");
    REQUIRE(mw_tok_load_json(&t, j, strlen(j), "post") == 0);
    CHECK_EQ_INT(mw_tok_encode(t, "a", 1, MW_TOK_ADD_SPECIAL, &ids), -ENOTSUP);
    CHECK_EQ_INT(mw_tok_encode(t, "a", 1, 0, &ids), 0);
    mw_tok_ids_free(&ids);
    mw_tok_free(t);
    free(j);
}

int main(void)
{
    const char *src = getenv("MW_SOURCE_DIR");
    snprintf(g_fix, sizeof g_fix, "%s/tests/fixtures/tok", src ? src : ".");
    test_trained("gpt2", 0);
    test_trained("llama3", 0);
    test_trained("qwen2", 1);
    test_cases();
    test_invalid_utf8();
    test_hostile();
    TEST_END();
}
