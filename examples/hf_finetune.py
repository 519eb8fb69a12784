#!/usr/bin/env python3
"""Fine-tune a Hugging Face transformers model directory from PyTorch with its whole training state
(weights, gradients, AdamW moments and master) on NVMe: memwall.torch.offload (docs/python.md,
"Whole-state offload").

The loop is the ordinary transformers one (model(input_ids, labels=...).loss, backward, clip, step,
an LR schedule); the lines that make it offloaded are marked OFFLOAD below. The model is never whole in
DRAM: it is built on the meta device (no values), and offload(weights_from=DIR) reads the directory's
safetensors a tensor at a time into memwall, unit by unit, straight to NVMe. Each block of the model is
a unit that memwall fetches from NVMe a few units ahead of its use and drops after it; gradients go
back to NVMe as backward finishes each block; the AdamW update runs behind the next forward pass.

    python3 scripts/make_hf_model.py --shape smollm2-135m --out smol --tokenizer-from data/kjv_excerpt.txt
    python3 examples/hf_finetune.py --model smol --steps 20 --nvme-dir /mnt/nvme/ft --save tuned
    python3 examples/hf_finetune.py --model smol --steps 20 --weights dram     # weights resident, for comparison
    python3 examples/hf_finetune.py --model smol --steps 20 --nvme-dir /mnt/nvme/ft --resume   # after a crash

With --nvme-dir the run's committed state stays there at the end (and after a crash or kill: each
step is committed); --resume continues it from its last committed step with the same batches and
learning rates as an uninterrupted run (the windows of step s are drawn from seed + s), bitwise.

Text: --data FILE (default data/kjv_excerpt.txt), tokenized with the directory's tokenizer.json;
training windows of --seq tokens at random places of the first 95 %, the held-out loss on the rest.
"""
import argparse
import math
import os
import shutil
import sys
import tempfile
import time

# Idle OpenMP threads sleep instead of spinning (docs/python.md, "Threads"): set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))  # the source tree's package when not installed


def size(text):
    """'3GiB', '512M', '1000000' -> bytes (binary suffixes, as memwall's command line)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:], 1)
    return int(float(t[:-1] if mult > 1 else t) * mult)


def peak_rss_gib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / (1 << 20)
    return float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a transformers model directory (config.json, weights, "
                    "tokenizer.json): Llama, Qwen2, GPT-2, ...")
    ap.add_argument("--data", default=os.path.join(HERE, "..", "data", "kjv_excerpt.txt"), help="a text file")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=1, help="sequences per micro-batch")
    ap.add_argument("--seq", type=int, default=128, help="tokens per sequence")
    ap.add_argument("--grad-accum", type=int, default=4, help="micro-batches per step")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--warmup", type=int, default=5, help="steps of linear warm-up, then cosine to 10 %%")
    ap.add_argument("--clip", type=float, default=1.0, help="max gradient norm (0: off)")
    ap.add_argument("--weights", default="nvme", choices=["nvme", "dram"], help="stream the weights from NVMe, "
                    "or keep them resident (the optimizer state still on NVMe)")
    ap.add_argument("--nvme-dir", help="directory of the NVMe state (created; default: a temporary directory, "
                    "removed at the end)")
    ap.add_argument("--dram-budget", type=size, default=0, help="refuse the run up front if its planned DRAM peak "
                    "is above this (e.g. 2GiB)")
    ap.add_argument("--prefetch", type=int, default=2, help="units fetched ahead of their use")
    ap.add_argument("--threads", type=int, default=0, help="torch's and the optimizer's threads (0: default)")
    ap.add_argument("--save", metavar="DIR", help="write the fine-tuned model here (save_pretrained: a directory "
                    "transformers and `memwall train --init-hf` load)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", action="store_true", help="continue the run committed in --nvme-dir (from its "
                    "last committed step; without a committed run there: start afresh)")
    a = ap.parse_args()

    from transformers import AutoConfig, AutoModelForCausalLM
    import memwall.torch as mt

    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    tok_path = os.path.join(a.model, "tokenizer.json")
    if not os.path.exists(tok_path):
        sys.exit(f"hf_finetune: {tok_path} is missing; make the directory with a tokenizer "
                 "(scripts/make_hf_model.py --tokenizer-from TEXT) or copy one in")
    from tokenizers import Tokenizer
    with open(a.data, encoding="utf-8") as f:
        ids = torch.tensor(Tokenizer.from_file(tok_path).encode(f.read()).ids, dtype=torch.long)
    cut = int(len(ids) * 0.95)
    train_ids, val_ids = ids[:cut], ids[cut:]
    if len(train_ids) <= a.seq + 1 or len(val_ids) <= a.seq + 1:
        sys.exit(f"hf_finetune: {a.data} has {len(ids)} tokens, too few for --seq {a.seq}")

    t0 = time.time()
    # OFFLOAD: the model's structure only (parameters on the meta device: no memory, no values); an
    # ordinary run would call AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32) here.
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(a.model), dtype=torch.float32)
    model.train()
    n = sum(p.numel() for p in model.parameters())

    nvme_dir = a.nvme_dir or tempfile.mkdtemp(prefix="hf_finetune-")
    # OFFLOAD: the weights, gradients and optimizer state live in memwall; the initial weights are read
    # from the directory's safetensors unit by unit (weights_from); decay on matrices only, as
    # transformers' Trainer does.
    off = mt.offload(model, nvme_dir=nvme_dir, weights=a.weights, optimizer="nvme", dram_budget=a.dram_budget,
                     prefetch=a.prefetch, grad_accum=a.grad_accum, threads=a.threads or None,
                     no_decay=lambda name, p: p.dim() < 2, weights_from=a.model, resume="auto" if a.resume else False)
    print(f"{a.model}: {model.config.model_type}, {n / 1e6:.1f} M parameters, loaded into memwall in "
          f"{time.time() - t0:.1f} s (peak RSS {peak_rss_gib():.2f} GiB); {len(ids)} tokens of text")
    opt = off.optimizer(lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)  # OFFLOAD: memwall's AdamW
    first = off.steps  # steps committed before (a resumed run); 0 for a fresh one
    if a.resume:
        print(f"resumed at step {first} from {nvme_dir}" if first else f"nothing committed in {nvme_dir}: a fresh run")
    st = off.stats()
    print(f"offload: {len(off.units)} units, weights {a.weights}, optimizer state on NVMe in {nvme_dir}"
          + (f"; planned DRAM peak {st['planned_dram_peak'] / (1 << 30):.2f} GiB" if a.weights == "nvme" else ""))

    def lr_at(s):
        if s < a.warmup:
            return (s + 1) / a.warmup
        return 0.1 + 0.45 * (1 + math.cos(math.pi * (s - a.warmup) / max(1, a.steps - a.warmup)))

    g = torch.Generator()

    def window(src):
        i = torch.randint(0, len(src) - a.seq - 1, (a.batch,), generator=g)
        return torch.stack([src[j:j + a.seq] for j in i.tolist()])

    def val_loss():
        model.eval()
        with torch.no_grad():
            x = val_ids[:a.seq].unsqueeze(0)
            loss = model(input_ids=x, labels=x).loss.item()
        model.train()
        return loss

    print(f"held-out loss before: {val_loss():.4f}")
    for step in range(first, a.steps):
        t = time.time()
        g.manual_seed(a.seed * 1000003 + step)  # the same windows whether the run was resumed or not
        opt.param_groups[0]["lr"] = a.lr * lr_at(step)  # the schedule read by the session's step
        total = 0.0
        for _ in range(a.grad_accum):
            x = window(train_ids)
            loss = model(input_ids=x, labels=x).loss
            (loss / a.grad_accum).backward()
            total += loss.item() / a.grad_accum
        norm = mt.clip_grad_norm_(model.parameters(), a.clip).item() if a.clip > 0 else float("nan")  # OFFLOAD
        lr = opt.param_groups[0]["lr"]
        opt.step()
        opt.zero_grad()
        print(f"step {step + 1:4d}  loss {total:.4f}  norm {norm:.3f}  lr {lr:.2e}  "
              f"{time.time() - t:.2f} s  peak RSS {peak_rss_gib():.2f} GiB", flush=True)
    print(f"held-out loss after: {val_loss():.4f}")
    st = off.stats()
    print(f"NVMe: weights fetched {st['weight_bytes_fetched'] / 1e9:.2f} GB, gradients written "
          f"{st['grad_bytes_written'] / 1e9:.2f} GB, optimizer read {st['optimizer_nvme_read_bytes'] / 1e9:.2f} GB / "
          f"written {st['optimizer_nvme_write_bytes'] / 1e9:.2f} GB; waited {st['fetch_wait_s']:.2f} s for fetches; "
          f"weights resident at most {st['weights_resident_peak'] / (1 << 20):.1f} MiB of {4 * n / (1 << 20):.1f}")
    if a.save:
        model.save_pretrained(a.save)  # model.state_dict() gathers the weights from the session
        shutil.copy(tok_path, os.path.join(a.save, "tokenizer.json"))
        print(f"saved {a.save}")
    off.close(restore=False, keep=bool(a.nvme_dir))  # a given directory keeps the run (--resume continues it)
    if not a.nvme_dir:
        shutil.rmtree(nvme_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
