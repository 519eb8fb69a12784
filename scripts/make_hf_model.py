#!/usr/bin/env python3
"""make_hf_model.py — a Hugging Face model directory with random weights in a published shape.

Nothing can be downloaded on the machines memwall is built on, so benchmarks, capability runs and
the README's newcomer path start from a directory that transformers writes from a config alone:
the architecture of a published checkpoint (layer count, widths, heads, vocabulary, RoPE, tying)
with random weights (transformers' own initialisation, seeded). Optionally a byte-level BPE
tokenizer trained here on a text file (the `tokenizers` package, offline) goes beside it.

  python3 scripts/make_hf_model.py --shape smollm2-135m --out DIR [--dtype bf16] [--seed 0]
                                   [--tokenizer-from TEXT] [--layers N] [--context N]

Needs torch and transformers (scripts/install-deps.sh installs them).
"""
import argparse
import os
import sys

SHAPES = {
    # name: (model_type, layers, width, heads, kv_heads, mlp, vocab, tied, rope_theta, extra)
    "smollm2-135m": ("llama", 30, 576, 9, 3, 1536, 49152, True, 100000.0, {"max_position_embeddings": 8192}),
    "smollm2-360m": ("llama", 32, 960, 15, 5, 2560, 49152, True, 100000.0, {"max_position_embeddings": 8192}),
    "llama-3.2-1b": ("llama", 16, 2048, 32, 8, 8192, 128256, True, 500000.0,
                     {"rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                      "max_position_embeddings": 131072}),
    "qwen2.5-0.5b": ("qwen2", 24, 896, 14, 2, 4864, 151936, True, 1000000.0, {"max_position_embeddings": 32768}),
    "qwen2.5-1.5b": ("qwen2", 28, 1536, 12, 2, 8960, 151936, True, 1000000.0, {"max_position_embeddings": 32768}),
    "tinyllama-1.1b": ("llama", 22, 2048, 32, 4, 5632, 32000, False, 10000.0, {"max_position_embeddings": 2048}),
    "gpt2-124m": ("gpt2", 12, 768, 12, 12, 3072, 50257, True, 0.0, {}),
}


def build_config(shape, layers, context, vocab):
    from transformers import GPT2Config, LlamaConfig, Qwen2Config
    mt, L, C, H, KV, F, V, tied, theta, extra = SHAPES[shape]
    L = layers or L
    V = vocab or V
    if mt == "gpt2":
        return GPT2Config(n_layer=L, n_embd=C, n_head=H, vocab_size=V, n_positions=context or 1024,
                          tie_word_embeddings=True)
    cls = LlamaConfig if mt == "llama" else Qwen2Config
    kw = dict(num_hidden_layers=L, hidden_size=C, num_attention_heads=H, num_key_value_heads=KV,
              intermediate_size=F, vocab_size=V, tie_word_embeddings=tied, rope_theta=theta,
              max_position_embeddings=2048, rms_norm_eps=1e-5, hidden_act="silu")
    if mt == "qwen2":
        kw.update(use_sliding_window=False, rms_norm_eps=1e-6)
    kw.update(extra)
    if context:
        kw["max_position_embeddings"] = context
    return cls(**kw)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--out", required=True, help="the directory to write (created)")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"], help="weights' type on disk")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=0, help="override the block count (0: the shape's)")
    ap.add_argument("--context", type=int, default=0, help="max_position_embeddings (0: the shape's)")
    ap.add_argument("--vocab", type=int, default=0, help="override the vocabulary (0: the shape's)")
    ap.add_argument("--tokenizer-from", metavar="TEXT", help="train a byte-level BPE tokenizer of the model's "
                    "vocabulary on this text file and save tokenizer.json beside the model")
    a = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM
    torch.manual_seed(a.seed)
    cfg = build_config(a.shape, a.layers, a.context, a.vocab)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    n = sum(p.numel() for p in model.parameters())
    os.makedirs(a.out, exist_ok=True)
    model.save_pretrained(a.out, safe_serialization=True)
    print(f"{a.out}: {cfg.model_type} {a.shape} shape, {n} parameters ({n / 1e9:.3f} B), {a.dtype} weights")
    if a.tokenizer_from:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        V = cfg.vocab_size
        tr = trainers.BpeTrainer(vocab_size=V, special_tokens=["<|endoftext|>"],
                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train([a.tokenizer_from], tr)
        tok.save(os.path.join(a.out, "tokenizer.json"))
        print(f"{a.out}/tokenizer.json: byte-level BPE, {tok.get_vocab_size()} tokens (of {V}) from {a.tokenizer_from}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
