#!/usr/bin/env python3
"""gen_tok_fixtures.py - reference tokenizers and ids for memwall's BPE tokenizer (src/tok/).

Trains three small byte-level BPE tokenizers OFFLINE with the `tokenizers` package (pip install
tokenizers; nothing is downloaded), one per pre-tokenizer pattern in use:

  gpt2   ByteLevel(use_regex=True): the GPT-2 pattern inside the ByteLevel pre-tokenizer,
         <|endoftext|>, a post-processor that adds nothing, merges spelled "a b" (the older form;
         the other two use ["a", "b"] pairs)
  llama3 Split(Llama-3 pattern, Isolated) + ByteLevel(use_regex=False), ignore_merges=True,
         a TemplateProcessing post-processor adding <|begin_of_text|>, Llama-3's header tokens
  qwen2  NFC normalizer + Split(Qwen2 pattern: single digits) + ByteLevel, <|im_start|>/<|im_end|>

each with added tokens that exercise lstrip/rstrip/single_word/normalized, trained on a generated
text of mixed scripts, emoji, digits, whitespace runs and code, and writes into tests/fixtures/tok/:

  text.txt                 the test text (UTF-8, never used for training)
  <name>/tokenizer.json    the trained tokenizer
  <name>/ids.txt           encode(text).ids (add_special_tokens=False), whitespace separated
  <name>/ids_special.txt   encode(text, add_special_tokens=True).ids
  <name>/ids_split.txt     the same as ids.txt with encode_special_tokens=True (special tokens
                           in the text are encoded as text, what `memwall data` does)
  <name>/ids_lines.txt     each line of text.txt (with its "\\n") encoded on its own, one line of
                           ids per line of text
  <name>/normalized.txt    the text after the tokenizer's normalizer (NFC for qwen2): what
                           decoding the ids_split.txt ids must give back

and cases.json: small hand-built tokenizers, each with a text and HF's ids for it, for the rules
the three above do not exercise: every Split behaviour (inverted or not), a literal Split
pattern, ByteLevel's add_prefix_space next to added tokens, unk_token with and without fuse_unk,
byte_fallback, ignore_merges against the merges, Roberta/Bert post-processors.

The C tests (tests/test_tok.c, tests/cli_tokenize.sh) read these files and never need Python.

    PIP_BREAK_SYSTEM_PACKAGES=1 pip install tokenizers
    python3 scripts/gen_tok_fixtures.py        # rewrites tests/fixtures/tok/
"""
import json
import os
import random
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, \
    processors, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "tok")

# The published patterns (GPT-2: openai/gpt-2 encoder.py and tokenizers' ByteLevel; Llama-3 and
# Qwen2: their tokenizer.json files, also tiktoken's cl100k_base for Llama-3).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                  r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                 r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")

WORDS = ("the of and to in is was for on that with as by at from it be this which or are an have not "
         "but had his they you were their one all we can her has there been if more when will would "
         "who so no out up into do than time about only new some could these two may first then "
         "model memory tensor gradient optimizer offload shard token vocabulary training batch "
         "Hello World Python Linux NVMe GPU CPU DRAM Adam").split()
CONTRACTIONS = ["don't", "it's", "I'M", "she'LL", "we've", "THEY'RE", "he'd", "'S", "isn't", "o'clock",
                "rock'n'roll", "y'all", "'tis", "We'Ve"]
SCRIPTS = [
    "中文分词测试，今天天气很好。我们训练一个语言模型！", "東京都の天気は晴れです。カタカナとひらがな、漢字。",
    "한국어 문장도 있습니다. 안녕하세요!", "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "Γειά σου Κόσμε· ελληνικά γράμματα.", "مرحبا بالعالم، هذا نص عربي.", "שלום עולם, זה טקסט בעברית.",
    "नमस्ते दुनिया, यह हिन्दी पाठ है।", "สวัสดีชาวโลก ภาษาไทย", "Ünïcödé àccénts: naïve café résumé Straße ĳ ǅ",
    "Tiếng Việt có dấu: Hà Nội, Sài Gòn.", "ქართული ენა", "Հայերեն լեզու", "ᚠᛇᚻ runes ᛒᛦ",
]
EMOJI = ["😀", "👍🏽", "👩‍💻", "🇫🇷", "❤️", "🧑‍🤝‍🧑", "🤖", "🎉🎉🎉", "✅", "⚡", "🐍", "∑∫√∞≠≤", "→←↑↓", "©®™"]
NUMBERS = ["٣٤٥", "１２３", "²³", "Ⅻ", "½ ¾", "3.14159", "1e-9", "0x7fff", "2024-05-20", "+1 (555) 010-9999",
           "1,000,000", "12345678901234"]
SPACES = ["  ", "   ", "\t", "\t\t", " \t ", "\u00a0", "\u3000", "\u2003", "\r\n", "\n\n", "\n\n\n", "  \n", " \n "]
CODE = [
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}\n",
    "if (err < 0) return mw_error_set(-EINVAL, \"bad %s\", name);\n",
    "    x = {'a': [1, 2, 3], \"b\": None}\n",
    "SELECT id, name FROM users WHERE age >= 18;\n",
    "<div class=\"main\">&nbsp;</div>\n",
    "$ make -j2 && ./memwall tokenize --tokenizer tok.json in.txt\n",
    "a=b+c*d/e-f%g^h&i|j~k!l?m:n;o,p.q<r>s@t#u$v\n",
]
# NFC matters for qwen2: decomposed letters, singletons (Ohm, Angstrom), conjoining Hangul jamo.
DECOMPOSED = ["cafe\u0301", "A\u030angstro\u0308m", "\u2126hm", "\u212b", "\u1100\u1161\u11a8", "n\u0303",
              "o\u0308\u0304", "e\u0323\u0302"]


def gen_text(rng, n_units, specials):
    out = []
    for _ in range(n_units):
        r = rng.random()
        if r < 0.35:
            k = rng.randint(3, 14)
            words = [rng.choice(WORDS) for _ in range(k)]
            if rng.random() < 0.5:
                words[rng.randrange(k)] = rng.choice(CONTRACTIONS)
            s = " ".join(words)
            out.append(s[0].upper() + s[1:] + rng.choice([". ", "! ", "? ", ", ", "; ", ": ", "... ", "\n"]))
        elif r < 0.50:
            out.append(rng.choice(SCRIPTS) + rng.choice([" ", "\n", "  "]))
        elif r < 0.58:
            out.append(rng.choice(EMOJI) + rng.choice(["", " ", "\n"]))
        elif r < 0.68:
            out.append(rng.choice(NUMBERS) + " " + str(rng.randint(0, 10 ** rng.randint(1, 9))) + " ")
        elif r < 0.78:
            out.append(rng.choice(SPACES))
        elif r < 0.90:
            out.append(rng.choice(CODE))
        elif r < 0.95:
            out.append(rng.choice(DECOMPOSED) + " ")
        elif specials:
            out.append(rng.choice(specials))
    return "".join(out)


def train(name, pre, normalizer, specials, added, post, vocab_size, corpus, ignore_merges=False):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_tokens(added)
    if post is not None:
        tok.post_processor = post(tok)
    return tok


def small_cases():
    """Hand-built tokenizers (BPE from a vocabulary and merges) for the rarer rules."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    base = {c: i for i, c in enumerate(sorted(alphabet))}

    def bpe_vocab(extra, drop=()):
        v = {c: i for c, i in base.items() if c not in drop}
        for t in extra:
            v.setdefault(t, len(base) + len(v))
        # dense ids
        return {t: i for i, t in enumerate(v)}

    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("1", "2"), ("12", "3"), ("a", "b"), ("ab", "c")]
    vocab = bpe_vocab(["Ġt", "he", "Ġthe", "12", "123", "ab", "abc"])
    text = "the 12345 abc, the123 abcabc  x1 2 ab-c the\nthe"
    cases = []

    def add(name, tok, text, **kw):
        cases.append({"name": name, "tokenizer": json.loads(tok.to_str()), "text": text,
                      "ids": tok.encode(text, **kw).ids, "add_special": kw.get("add_special_tokens", False)})

    for behavior in ["removed", "isolated", "merged_with_previous", "merged_with_next", "contiguous"]:
        for invert in (False, True):
            for pat in (Regex(r"\d|\s"), " "):
                t = Tokenizer(models.BPE(vocab=vocab, merges=merges))
                t.pre_tokenizer = pre_tokenizers.Sequence([
                    pre_tokenizers.Split(pat, behavior=behavior, invert=invert),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
                add("split %s invert=%s %s" % (behavior, invert, "regex" if isinstance(pat, Regex) else "string"),
                    t, text, add_special_tokens=False)
    t = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    t.add_special_tokens(["<s>"])
    t.add_tokens([AddedToken("abc", normalized=False)])
    add("bytelevel add_prefix_space with added tokens", t, "the<s>the abc123<s> the abcthe", add_special_tokens=False)
    for fuse in (False, True):
        v = bpe_vocab(["<unk>", "Ġt", "he", "Ġthe"], drop=("x", "y", "Ġ"))
        t = Tokenizer(models.BPE(vocab=v, merges=[("h", "e")], unk_token="<unk>", fuse_unk=fuse))
        t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        add("unk fuse_unk=%s" % fuse, t, "the xxy hexy", add_special_tokens=False)
    v = bpe_vocab(["<0x%02X>" % b for b in range(256)], drop=("x", "Ġ", "é"))
    t = Tokenizer(models.BPE(vocab=v, merges=[], byte_fallback=True))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    add("byte_fallback", t, "axb c\u00e9", add_special_tokens=False)
    # ignore_merges: "abc" is in the vocabulary, but the merges make "a" + "bc" first.
    v = bpe_vocab(["bc", "abc"])
    for ign in (False, True):
        t = Tokenizer(models.BPE(vocab=v, merges=[("b", "c")], ignore_merges=ign))
        t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        add("ignore_merges=%s" % ign, t, "abc abc", add_special_tokens=False)
    for name, post in (("roberta", processors.RobertaProcessing(("</s>", 1), ("<s>", 0))),
                       ("bert", processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2)))):
        t = Tokenizer(models.BPE(vocab=vocab, merges=merges))
        t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        t.post_processor = post
        add("post-processor " + name, t, "the abc", add_special_tokens=True)
    return cases


def ids_str(ids):
    return " ".join(str(i) for i in ids) + "\n"


def write(path, s, binary=False):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(s if binary else s.encode("utf-8"))


def main():
    rng = random.Random(20240520)
    # Training text: no special tokens (they are added to the vocabulary, never merged).
    corpus = [gen_text(rng, 60, None) for _ in range(2500)]
    llama_bos = "<|begin_of_text|>"
    configs = {
        "gpt2": dict(
            pre=pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            normalizer=None, specials=["<|endoftext|>"],
            added=[AddedToken("<mask>", lstrip=True, rstrip=False, single_word=False, normalized=False,
                              special=True),
                   AddedToken("Zebra", single_word=True, normalized=True)],
            post=lambda t: processors.ByteLevel(trim_offsets=False), vocab_size=1500),
        "llama3": dict(
            pre=pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
            normalizer=None,
            specials=[llama_bos, "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
            added=[AddedToken("[MASK]", lstrip=True, rstrip=True, special=True, normalized=False),
                   AddedToken("foo_bar", single_word=True, normalized=True)],
            post=lambda t: processors.Sequence([
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(single=llama_bos + " $A", pair=llama_bos + " $A " + llama_bos + " $B:1",
                                              special_tokens=[(llama_bos, t.token_to_id(llama_bos))])]),
            vocab_size=2000, ignore_merges=True),
        "qwen2": dict(
            pre=pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
            normalizer=normalizers.NFC(), specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            added=[AddedToken("caf\u00e9", normalized=True), AddedToken("  ", normalized=False)],
            post=None, vocab_size=1800),
    }
    trng = random.Random(7)
    all_specials = ["<|endoftext|>", "<mask>", " <mask>", "[MASK]", " [MASK] ", "<|begin_of_text|>",
                    "<|im_start|>user\n", "<|im_end|>\n", "Zebra ", "aZebra ", "foo_bar ", "xfoo_bar",
                    "<|eot_id|>", "caf\u00e9 ", "cafe\u0301 "]
    text = gen_text(trng, 700, all_specials)
    text += "\nthe end: trailing spaces   \n\n  "
    write(os.path.join(OUT, "text.txt"), text)
    lines = text.split("\n")
    lines = [l + "\n" for l in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
    for name, cfg in configs.items():
        tok = train(name, corpus=corpus, **cfg)
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"), pretty=False)
        if name == "gpt2":  # the older spelling of merges ("a b" strings) that GPT-2's own file uses
            with open(os.path.join(d, "tokenizer.json"), encoding="utf-8") as f:
                j = json.load(f)
            j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
            with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
                json.dump(j, f, ensure_ascii=False, separators=(",", ":"))
        # Reload from the file, so the ids come from exactly what the C code reads.
        tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        ids = tok.encode(text, add_special_tokens=False).ids
        write(os.path.join(d, "ids.txt"), ids_str(ids))
        write(os.path.join(d, "ids_special.txt"), ids_str(tok.encode(text, add_special_tokens=True).ids))
        tok.encode_special_tokens = True
        write(os.path.join(d, "ids_split.txt"), ids_str(tok.encode(text, add_special_tokens=False).ids))
        tok.encode_special_tokens = False
        write(os.path.join(d, "ids_lines.txt"),
              "".join(ids_str(tok.encode(l, add_special_tokens=False).ids) for l in lines))
        write(os.path.join(d, "normalized.txt"), tok.normalizer.normalize_str(text) if tok.normalizer else text)
        print("%s: vocabulary %d, %d ids for %d bytes of text" % (name, tok.get_vocab_size(), len(ids),
                                                                 len(text.encode("utf-8"))))
    cases = small_cases()
    write(os.path.join(OUT, "cases.json"), json.dumps(cases, ensure_ascii=False, separators=(",", ":")))
    print("cases.json: %d small tokenizers" % len(cases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
