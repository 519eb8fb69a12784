#!/usr/bin/env python3
"""Writes llm.c-format .bin token shards from text files, for `memwall train --data DIR`.

Shard format (version 1): 256 little-endian int32 header words -- 20240520 (magic), 1
(version), token count -- then the tokens as uint16. Each input file is one document,
preceded by the end-of-text token. The last --val-frac of each document's tokens go to the
validation shard(s) (NAME_val_*.bin), the rest to NAME_train_*.bin; memwall treats files
whose name contains "val" as the validation split.

Tokenizers: "bytes" (default, memwall's own: byte values 0..255, end-of-text 256, vocabulary
257; needs nothing) or "gpt2" (GPT-2 BPE through the tiktoken package, end-of-text 50256,
vocabulary 50257; `pip install tiktoken`, and its BPE files must be downloadable or cached).

Usage: scripts/prepare_corpus.py --out-dir DIR [--name NAME] [--tokenizer bytes|gpt2]
                                 [--val-frac 0.1] [--shard-tokens N] FILE...
"""
import argparse
import os
import struct
import sys

MAGIC, VERSION = 20240520, 1


def write_shard(path, tokens):
    if len(tokens) >= 2**31:
        raise SystemExit("shard %s: too many tokens for the int32 count" % path)
    header = struct.pack("<256i", MAGIC, VERSION, len(tokens), *([0] * 253))
    body = struct.pack("<%dH" % len(tokens), *tokens)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header)
        f.write(body)
    os.replace(tmp, path)
    print("wrote %s (%d tokens)" % (path, len(tokens)))


def encoder(name):
    if name == "bytes":
        return (lambda text: list(text)), 256
    try:
        import tiktoken
    except ImportError:
        raise SystemExit("--tokenizer gpt2 needs the tiktoken package (pip install tiktoken)")
    enc = tiktoken.get_encoding("gpt2")
    return (lambda text: enc.encode_ordinary(text.decode("utf-8", errors="replace"))), enc.eot_token


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--name", default="corpus")
    ap.add_argument("--tokenizer", choices=["bytes", "gpt2"], default="bytes")
    ap.add_argument("--val-frac", type=float, default=0.1)
    ap.add_argument("--shard-tokens", type=int, default=100_000_000)
    a = ap.parse_args()
    if not 0 < a.val_frac < 1:
        raise SystemExit("--val-frac must lie in (0, 1)")
    encode, eot = encoder(a.tokenizer)
    train, val = [], []
    for fn in a.files:
        with open(fn, "rb") as f:
            toks = [eot] + encode(f.read())
        cut = len(toks) - round(len(toks) * a.val_frac)
        train += toks[:cut]
        val += toks[cut:]
    os.makedirs(a.out_dir, exist_ok=True)
    for split, toks in (("val", val), ("train", train)):
        for i in range(0, max(len(toks), 1), a.shard_tokens):
            write_shard(os.path.join(a.out_dir, "%s_%s_%06d.bin" % (a.name, split, i // a.shard_tokens)),
                        toks[i:i + a.shard_tokens])
    return 0


if __name__ == "__main__":
    sys.exit(main())
