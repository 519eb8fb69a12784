#!/usr/bin/env python3
"""A nanoGPT-style GPT-2 training loop in plain PyTorch on the bundled corpus
(data/kjv_excerpt.txt, byte tokens), whose optimizer is memwall's NVMe-offloaded AdamW.

The one line that switches from torch's optimizer to memwall's is marked ONE-LINE SWITCH below;
--optimizer torch runs the same loop with torch.optim.AdamW for comparison.

    python3 examples/torch_gpt.py --steps 50                       # small model, state on NVMe
    python3 examples/torch_gpt.py --optimizer torch --steps 50     # the same with torch.optim.AdamW
    python3 examples/torch_gpt.py --model gpt2 --batch 4 --seq 256 --steps 5 --nvme-dir /mnt/nvme/run

The model follows nanoGPT's GPT (pre-LayerNorm blocks, GELU MLP, tied token embedding and LM
head, decay only on 2-D weights); tests/python import GPT and GPTConfig from this file.
"""
import argparse
import math
import os
import resource
import sys
import tempfile
import time
from dataclasses import dataclass

# Idle OpenMP threads sleep instead of spinning (read once, when torch loads libgomp): torch's
# team and the team of memwall's update thread share two cores here (docs/python.md, "Threads").
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50257
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768


class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_attn = nn.Linear(c.n_embd, 3 * c.n_embd)
        self.c_proj = nn.Linear(c.n_embd, c.n_embd)
        self.n_head = c.n_head

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c.n_embd)
        self.attn = CausalSelfAttention(c)
        self.ln_2 = nn.LayerNorm(c.n_embd)
        self.mlp = nn.Sequential(nn.Linear(c.n_embd, 4 * c.n_embd), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * c.n_embd, c.n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = c
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        self.wpe = nn.Embedding(c.block_size, c.n_embd)
        self.h = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.n_embd)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as GPT-2
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx, targets=None):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    def param_groups(self, weight_decay):
        """nanoGPT's configure_optimizers: decay on 2-D tensors (matmuls, embeddings) only."""
        ps = [p for p in self.parameters() if p.requires_grad]
        return [{"params": [p for p in ps if p.dim() >= 2], "weight_decay": weight_decay},
                {"params": [p for p in ps if p.dim() < 2], "weight_decay": 0.0}]


MODELS = {
    "tiny": GPTConfig(block_size=64, vocab_size=256, n_layer=2, n_head=2, n_embd=64),
    "small": GPTConfig(block_size=256, vocab_size=256, n_layer=4, n_head=4, n_embd=256),
    "gpt2": GPTConfig(),  # 124M
}


def lr_at(step, base, warmup, total):
    """Linear warm-up then cosine decay to base/10 (nanoGPT's get_lr)."""
    if step < warmup:
        return base * (step + 1) / warmup
    r = min(1.0, (step - warmup) / max(1, total - warmup))
    return base / 10 + 0.5 * (1 + math.cos(math.pi * r)) * (base - base / 10)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--optimizer", choices=["memwall", "torch"], default="memwall")
    ap.add_argument("--state", choices=["nvme", "dram"], default="nvme")
    ap.add_argument("--nvme-dir", default=None, help="directory for the NVMe state (default: a temporary one)")
    ap.add_argument("--model", choices=sorted(MODELS), default="tiny")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--clip", type=float, default=1.0, help="global-norm clipping (0: off, lets updates overlap backward)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--subgroup-size", type=int, default=None, help="memwall: elements per subgroup")
    ap.add_argument("--buffer-count", type=int, default=None, help="memwall: NVMe staging buffers")
    ap.add_argument("--release-grads", action="store_true",
                    help="memwall: give gradient and staging memory back after each update (docs/python.md)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (memwall: the state stays on the host; "
                                                      "CUDA parameters go through pinned copies, docs/python.md)")
    ap.add_argument("--trace", default=None, help="memwall trace file (read by `memwall report`)")
    ap.add_argument("--data", default=os.path.join(HERE, "..", "data", "kjv_excerpt.txt"))
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(1337)
    c = MODELS[a.model]
    if a.seq > c.block_size:
        sys.exit(f"torch_gpt: --seq {a.seq} is longer than the model's block size {c.block_size}")
    with open(a.data, "rb") as f:
        data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
    if c.vocab_size < 256:
        sys.exit("torch_gpt: byte tokens need a vocabulary of at least 256")
    model = GPT(c).to(a.device)
    nparams = sum(p.numel() for p in model.parameters())
    groups = model.param_groups(weight_decay=0.1)
    tmp = None
    if a.optimizer == "memwall":
        import memwall.torch
        nvme_dir = a.nvme_dir
        if a.state == "nvme" and nvme_dir is None:
            tmp = tempfile.TemporaryDirectory(prefix="memwall-gpt-")
            nvme_dir = tmp.name
        # ONE-LINE SWITCH: torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.95), fused=True) becomes
        opt = memwall.torch.AdamW(groups, lr=a.lr, betas=(0.9, 0.95), state=a.state, nvme_dir=nvme_dir,
                                  trace=a.trace, threads=a.threads or None, subgroup_size=a.subgroup_size,
                                  buffer_count=a.buffer_count, release_grads=a.release_grads)
    else:
        opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.95), fused=True)
    print(f"model {a.model}: {nparams / 1e6:.2f}M parameters, optimizer {a.optimizer}"
          f"{' (state ' + a.state + ')' if a.optimizer == 'memwall' else ''}, batch {a.batch} x {a.seq}")
    g = torch.Generator().manual_seed(0)
    times = []
    for step in range(a.steps):
        t0 = time.perf_counter()
        for pg in opt.param_groups:
            pg["lr"] = lr_at(step, a.lr, max(1, a.steps // 10), a.steps)
        ix = torch.randint(len(data) - a.seq - 1, (a.batch,), generator=g)
        x = torch.stack([data[i:i + a.seq] for i in ix]).to(a.device)
        y = torch.stack([data[i + 1:i + 1 + a.seq] for i in ix]).to(a.device)
        _, loss = model(x, y)
        loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        if step % 10 == 0 or step == a.steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}  {times[-1] * 1e3:.0f} ms")
    steady = sorted(times[1:])[len(times[1:]) // 2] if len(times) > 1 else times[0]
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30
    print(f"median step {steady * 1e3:.0f} ms, peak RSS {peak_gib:.3f} GiB")
    if a.optimizer == "memwall":
        s = opt.stats()
        print(f"memwall: {s['steps']:.0f} steps, NVMe read {s['nvme_read_bytes'] / 2**30:.2f} GiB, written "
              f"{s['nvme_write_bytes'] / 2**30:.2f} GiB, CPU wait for I/O {s['io_wait_s']:.2f} s, "
              f"overlap {'on' if s['overlap'] else 'off'}")
        opt.close()
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
