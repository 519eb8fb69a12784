#!/usr/bin/env python3

"""gen_llama_fixtures.py - reference data for memwall's Llama family (tests/test_llama_fixture.c).

Three tiny models built by `transformers` itself from a config (random init, nothing downloaded),
each written into tests/fixtures/llama/<name>/:
    config.json          what save_pretrained writes (llama3_untied: rewritten in transformers v4's
                         spelling, rope_theta + rope_scaling, so both spellings are read by the C side)
    model.safetensors    fp32 weights, HF names
    grads.safetensors    every parameter's gradient of the mean cross-entropy on the batch below
                         (HF names; a tied head's share is inside model.embed_tokens.weight)
    expected.bin         "MWLLFX01", u32 B, T, V, nsteps; f64 lr, beta1, beta2, eps, weight_decay;
                         i32 inputs [B*T], i32 targets [B*T], f32 logits [B*T*V], f32 loss,
                         f32 losses [nsteps] (torch.optim.AdamW on the same batch), "END!"
tests/fixtures/llama/sharded/ is llama3_untied saved again by save_pretrained(max_shard_size="50KB"):
a sharded checkpoint (model.safetensors.index.json + three shards) for the index reader.
The reference runs in float64 on the fp32 weights (so it is far more precise than the fp32 C code
it checks). The C suite never needs Python: the files are committed.

    python3 scripts/gen_llama_fixtures.py
"""
import json
import os
import struct
import sys

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "llama")

B, T, NSTEPS = 2, 9, 10
LR, BETA1, BETA2, EPS, WD = 1e-2, 0.9, 0.999, 1e-8, 0.01


def configs():
    from transformers import LlamaConfig, Qwen2Config
    common = dict(bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    return [
        # GQA (4 heads over 2 kv heads), tied head, ragged MLP width.
        ("llama_gqa_tied", LlamaConfig(
            vocab_size=67, hidden_size=32, intermediate_size=44, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
            rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True, **common)),
        # Qwen2: q/k/v biases, 3 heads over 1 kv head, theta 1e6, eps 1e-6.
        ("qwen2_bias", Qwen2Config(
            vocab_size=53, hidden_size=24, intermediate_size=40, num_hidden_layers=2,
            num_attention_heads=3, num_key_value_heads=1, max_position_embeddings=32,
            rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
            use_sliding_window=False, **common)),
        # llama3 rope scaling (a medium band smoothed, the low band divided), untied head, 3 blocks.
        ("llama3_untied", LlamaConfig(
            vocab_size=71, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
            rms_norm_eps=1e-5, tie_word_embeddings=False,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
            rope_theta=500000.0, **common)),
    ]


def f32(vals):
    return struct.pack("<%df" % len(vals), *vals)


def gen(name, cfg, seed):
    import transformers
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).float()
    with torch.no_grad():  # the default init (std 0.02, unit norms) is nearly uniform: widen it
        for n, p in model.named_parameters():
            if p.dim() == 2:
                p.mul_(4.0)
            else:
                p.add_(0.1 * torch.randn_like(p))
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(d, extra)):
            os.remove(os.path.join(d, extra))
    if name == "llama3_untied":  # transformers v4's spelling of the same rope
        with open(os.path.join(d, "config.json")) as f:
            c = json.load(f)
        rp = c.pop("rope_parameters")
        c["rope_theta"] = rp.pop("rope_theta")
        c["rope_scaling"] = rp
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(c, f, indent=2, sort_keys=True)

    V = cfg.vocab_size
    g = torch.Generator().manual_seed(seed + 1)
    window = torch.randint(0, V, (B, T + 1), generator=g)
    inputs, targets = window[:, :T], window[:, 1:]

    m64 = model.double().train()
    logits = m64(input_ids=inputs).logits
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    loss.backward()
    grads = {n: p.grad.detach().float().contiguous() for n, p in m64.named_parameters()}
    save_file(grads, os.path.join(d, "grads.safetensors"))

    opt = torch.optim.AdamW(m64.parameters(), lr=LR, betas=(BETA1, BETA2), eps=EPS, weight_decay=WD,
                            foreach=False)
    losses = []
    for _ in range(NSTEPS):
        opt.zero_grad()
        l = F.cross_entropy(m64(input_ids=inputs).logits.reshape(-1, V), targets.reshape(-1))
        l.backward()
        opt.step()
        losses.append(l.item())

    with open(os.path.join(d, "expected.bin"), "wb") as f:
        f.write(b"MWLLFX01" + struct.pack("<4I", B, T, V, NSTEPS))
        f.write(struct.pack("<5d", LR, BETA1, BETA2, EPS, WD))
        f.write(struct.pack("<%di" % (B * T), *inputs.reshape(-1).tolist()))
        f.write(struct.pack("<%di" % (B * T), *targets.reshape(-1).tolist()))
        f.write(f32(logits.detach().reshape(-1).tolist()))
        f.write(f32([loss.item()]))
        f.write(f32(losses))
        f.write(b"END!")
    print("wrote %s (transformers %s): loss %.7f, 10 AdamW losses %.5f .. %.5f"
          % (os.path.relpath(d, ROOT), transformers.__version__, loss.item(), losses[0], losses[-1]))


def sharded():
    """tests/fixtures/llama/sharded: llama3_untied's weights as transformers shards them
    (save_pretrained(max_shard_size="50KB"): model.safetensors.index.json and three shards), for
    the sharded-checkpoint reader (tests/cli_hf_sharded.sh: the same loss as llama3_untied)."""
    import shutil

    from transformers import AutoModelForCausalLM

    d = os.path.join(OUT, "sharded")
    shutil.rmtree(d, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(os.path.join(OUT, "llama3_untied"), dtype=torch.float32)
    model.save_pretrained(d, max_shard_size="50KB")
    if os.path.exists(os.path.join(d, "generation_config.json")):
        os.remove(os.path.join(d, "generation_config.json"))
    print("wrote %s: %s" % (os.path.relpath(d, ROOT), " ".join(sorted(os.listdir(d)))))


def main():
    torch.set_num_threads(1)
    for i, (name, cfg) in enumerate(configs()):
        gen(name, cfg, 100 + 10 * i)
    sharded()
    return 0


if __name__ == "__main__":
    sys.exit(main())
