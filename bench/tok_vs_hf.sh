#!/usr/bin/env bash
# Tokenizer throughput: `memwall tokenize` against Hugging Face `tokenizers`, one thread each, on
# the same >= 10 MB of generated mixed text (scripts/gen_tok_fixtures.py's generator: several
# scripts, emoji, digits, whitespace runs, code), for each pre-tokenizer pattern (GPT-2, Llama-3,
# Qwen2 with NFC). The tokenizers are trained here, offline, with a 32k vocabulary (nothing is
# downloaded). Prints MB/s (10^6 bytes of input per second, loading excluded) as the median of 3
# runs, and checks that both give identical ids.
#
#   bash bench/tok_vs_hf.sh [MEMWALL] [MB] [VOCAB]      # defaults: build/memwall 12 32000
#
# memwall encodes the file as one string (memwall tokenize --time). HF is timed on the same one
# string (Tokenizer.encode) and, for reference, line by line (encode_batch, RAYON_NUM_THREADS=1),
# which is how HF is usually fed. Needs python3 with tokenizers (pip install tokenizers).
set -euo pipefail
cd "$(dirname "$0")/.."
mw=${1:-build/memwall}
mb=${2:-12}
vocab=${3:-32000}
[ -x "$mw" ] || { echo "tok_vs_hf: no memwall binary at $mw (build first)" >&2; exit 1; }
python3 -c "import tokenizers" 2>/dev/null || { echo "tok_vs_hf: needs the tokenizers package (pip install tokenizers)" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/tok_vs_hf.XXXXXX")
trap 'rm -rf "$work"' EXIT
export RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
python3 - "$mw" "$mb" "$vocab" "$work" <<'PY'
import os, re, statistics, subprocess, sys, time
sys.path.insert(0, os.path.join(os.getcwd(), "scripts"))
import gen_tok_fixtures as g
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

mw, mb, vocab, work = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rng = g.random.Random(1234)
parts, size = [], 0
while size < mb * 1e6:
    s = g.gen_text(rng, 200, None)
    parts.append(s)
    size += len(s.encode("utf-8"))
text = "".join(parts)
path = os.path.join(work, "text.txt")
with open(path, "w", encoding="utf-8") as f:
    f.write(text)
nbytes = os.path.getsize(path)
train_text = parts[: max(1, len(parts) // 3)]
lines = text.split("\n")
print("text: %.1f MB (%d lines); tokenizers %s; vocabulary %d; one thread; median of 3 runs" %
      (nbytes / 1e6, len(lines), __import__("tokenizers").__version__, vocab))
shapes = {
    "gpt2": (None, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), False),
    "llama3": (None, pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(g.LLAMA3_PATTERN), "isolated"),
                                              pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), True),
    "qwen2": (normalizers.NFC(), pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(g.QWEN2_PATTERN), "isolated"),
                                                           pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                                    use_regex=False)]), False),
}
print("%-7s %12s %14s %16s %10s" % ("pattern", "memwall MB/s", "HF MB/s (one)", "HF MB/s (lines)", "ids equal"))
for name, (norm, pre, ign) in shapes.items():
    tok = Tokenizer(models.BPE(ignore_merges=ign))
    tok.normalizer = norm
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(train_text, trainers.BpeTrainer(
        vocab_size=vocab, show_progress=False, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tj = os.path.join(work, name + ".json")
    tok.save(tj)
    tok = Tokenizer.from_file(tj)
    mw_rates, out = [], None
    for _ in range(3):
        r = subprocess.run([mw, "tokenize", "--tokenizer", tj, "--time", path], capture_output=True, check=True)
        mw_rates.append(float(re.search(rb"([0-9.]+) MB/s", r.stderr).group(1)))
        out = r.stdout
    one, batch = [], []
    for _ in range(3):
        t0 = time.perf_counter()
        ids = tok.encode(text, add_special_tokens=False).ids
        one.append(nbytes / 1e6 / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        tok.encode_batch(lines, add_special_tokens=False)
        batch.append(nbytes / 1e6 / (time.perf_counter() - t0))
    same = [int(x) for x in out.split()] == ids
    print("%-7s %12.2f %14.2f %16.2f %10s" % (name, statistics.median(mw_rates), statistics.median(one),
                                              statistics.median(batch), "yes" if same else "NO"))
    if not same:
        sys.exit(1)
PY
