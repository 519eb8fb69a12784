#!/usr/bin/env python3
"""bench/torch_offload.py — memwall.torch.offload from PyTorch: what fits, and in how much memory
(docs/python.md, "Whole-state offload: a model larger than DRAM"; issue 25's "Done when").

Each case runs in its own process (a child of this script), so its peak resident set (VmHWM of
/proc/self/status) is its own. The model is a transformers Qwen2 of a published shape with random
weights (scripts/make_hf_model.py, bf16 files), built on the meta device and offloaded with
weights_from=DIR: it is never whole in DRAM. Each step is one batch of random token ids (the same batch
every step, so the loss falls as the model learns it), backward, the session's AdamW (lr 1e-4).

Cases:
  capability   Qwen2.5-1.5B shape (28 blocks, width 1536, 12/2 heads, MLP 8960, vocabulary 151,936,
               1.54 B parameters, about 25 GB of fp32 state on NVMe), batch 1 x 128, 3 steps, everything
               streamed: peak resident set (target: under 4 GiB) and the losses.
  offloaded    Qwen2.5-0.5B shape, batch 1 x 256, 3 steps, weights streamed from NVMe (offload()'s default);
               --activations nvme puts the saved activations of the streamed cases on NVMe too.
  resident     the same with the weights and gradients in DRAM and the optimizer state on NVMe
               (offload(weights="dram", optimizer="nvme")); offloaded / resident is the memory figure
               (target: at most 1/3).
  adamw        the same model loaded whole by from_pretrained, torch's gradients, memwall.torch.AdamW(
               state="nvme"): the optimizer-only offload memwall had before (a second resident baseline).

All cases use 1M-element optimizer subgroups (--subgroup-size; the engine's default is 4M): the 8
staging buffers of the optimizer on NVMe then take 96 MiB instead of 384 MiB, the same in every case.

    python3 bench/torch_offload.py --work /tmp/mw-offload                 # all default cases
    python3 bench/torch_offload.py --work /tmp/mw-offload --cases offloaded,resident
    MEMWALL_LIB=build/libmemwall.so PYTHONPATH=python python3 bench/torch_offload.py ...

The model directories are made under --work when missing (kept: --clean removes them at the end);
each case's NVMe state goes to --work/nvme-<case> and is removed after it. Free space is checked first.
GiB = 2^30 bytes, GB = 10^9.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))
GIB = 1 << 30

# case: (shape, batch, seq, steps, weights, optimizer, how)
CASES = {
    "capability": ("qwen2.5-1.5b", 1, 128, 3, "nvme", None, "offload"),
    "offloaded": ("qwen2.5-0.5b", 1, 256, 3, "nvme", None, "offload"),
    "resident": ("qwen2.5-0.5b", 1, 256, 3, "dram", "nvme", "offload"),
    "adamw": ("qwen2.5-0.5b", 1, 256, 3, "dram", "nvme", "adamw"),
}
DEFAULT = "capability,offloaded,resident,adamw"
STATE_BYTES_PER_PARAM = 29  # two slots of fp32 master and moments (24), the gradients (4), slack


def status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def dir_bytes(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


# ---------------------------------------------------------------- one case, in its own process

def child(a):
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import torch
    torch.set_num_threads(a.threads)
    from transformers import AutoConfig, AutoModelForCausalLM
    import memwall.torch as mt

    shape, batch, seq, steps, weights, optimizer, how = CASES[a.child]
    steps = a.steps or steps
    out = dict(case=a.child, shape=shape, batch=batch, seq=seq, weights=weights, optimizer=optimizer or "nvme",
               how=how, threads=a.threads, rss_start_gib=status_kib("VmHWM") / (1 << 20))
    t0 = time.time()
    off = None
    if how == "offload":
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(a.model), dtype=torch.float32)
        acts = a.activations if weights == "nvme" else "dram"  # the resident baseline keeps them in DRAM
        out["activations"] = acts
        off = mt.offload(model, nvme_dir=a.nvme_dir, weights=weights, optimizer=optimizer, weights_from=a.model,
                         threads=a.threads, prefetch=a.prefetch, subgroup_size=a.subgroup_size or None,
                         buffer_count=a.buffer_count or None, activations=acts,
                         dram_budget=int(a.dram_budget * GIB) if weights == "nvme" and a.dram_budget else None)
        opt = off.optimizer(lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    else:
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
        os.makedirs(a.nvme_dir, exist_ok=True)
        opt = mt.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, state="nvme",
                       nvme_dir=a.nvme_dir, threads=a.threads, subgroup_size=a.subgroup_size or None,
                       buffer_count=a.buffer_count or None)
    model.train()
    out["params"] = sum(p.numel() for p in model.parameters())
    out["load_s"] = time.time() - t0
    out["rss_load_gib"] = status_kib("VmHWM") / (1 << 20)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, model.config.vocab_size, (batch, seq), generator=g)
    losses, times = [], []
    for _ in range(steps):
        t = time.time()
        loss = model(input_ids=x, labels=x).loss
        if not losses:
            out["rss_forward_gib"] = status_kib("VmRSS") / (1 << 20)  # resident after the first forward
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        times.append(time.time() - t)
        print(f"  {a.child}: step {len(losses)} loss {losses[-1]:.4f} {times[-1]:.1f} s VmHWM "
              f"{status_kib('VmHWM') / (1 << 20):.2f} GiB", file=sys.stderr, flush=True)
    if off is not None:
        off.finish()
        st = off.stats()
        out["planned_dram_peak_gib"] = st["planned_dram_peak"] / GIB
        out["weights_resident_peak_gib"] = st["weights_resident_peak"] / GIB
        if off._acts is not None:
            out["activations_stats"] = off._acts.stats()
    out["nvme_state_gb"] = dir_bytes(a.nvme_dir) / 1e9
    out.update(losses=losses, step_s=times, peak_rss_gib=status_kib("VmHWM") / (1 << 20))
    print("RESULT " + json.dumps(out), flush=True)
    if off is not None:
        off.close(restore=False)
    else:
        opt.close()
    return 0


# ---------------------------------------------------------------- the driver

def make_model(a, shape):
    path = os.path.join(a.work, shape)
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "make_hf_model.py"), "--shape", shape, "--dtype", "bf16",
           "--out", path]
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="/tmp/mw-torch-offload", help="model directories and NVMe state go here")
    ap.add_argument("--cases", default=DEFAULT, help=f"comma-separated, of {', '.join(CASES)} (default {DEFAULT})")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--steps", type=int, default=0, help="steps per case (0: 3)")
    ap.add_argument("--prefetch", type=int, default=2, help="units fetched ahead (offload's default 2)")
    ap.add_argument("--subgroup-size", type=int, default=1 << 20, help="optimizer subgroup, elements (default 1M: "
                    "12 MiB of fp32 state per staging buffer; 0: the engine's default, 4M: 48 MiB)")
    ap.add_argument("--buffer-count", type=int, default=0, help="staging buffers (0: the engine's default, 8)")
    ap.add_argument("--dram-budget", type=float, default=0, help="GiB: offload(dram_budget=) for the streamed cases "
                    "(with --subgroup-size 0 --buffer-count 0 the budget picks both); 0: none")
    ap.add_argument("--activations", choices=("dram", "nvme"), default="dram",
                    help="where the streamed cases keep the saved activations (offload(activations=...); the "
                    "resident case keeps them in DRAM)")
    ap.add_argument("--clean", action="store_true", help="remove the model directories at the end")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--nvme-dir", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a)

    cases = [c.strip() for c in a.cases.split(",") if c.strip()]
    bad = [c for c in cases if c not in CASES]
    if bad:
        ap.error(f"unknown cases {bad}; of {list(CASES)}")
    os.makedirs(a.work, exist_ok=True)
    results = []
    for c in cases:
        shape = CASES[c][0]
        model = make_model(a, shape)
        with open(os.path.join(model, "config.json")) as f:
            cfg = json.load(f)
        n_est = cfg["num_hidden_layers"] * (4 * cfg["hidden_size"] ** 2 + 3 * cfg["hidden_size"] *
                                            cfg["intermediate_size"]) + cfg["vocab_size"] * cfg["hidden_size"]
        need = STATE_BYTES_PER_PARAM * n_est
        free = shutil.disk_usage(a.work).free
        if free < need:
            sys.exit(f"torch_offload: case {c} needs about {need / 1e9:.1f} GB under {a.work}, "
                     f"{free / 1e9:.1f} GB free")
        nvme = os.path.join(a.work, f"nvme-{c}")
        shutil.rmtree(nvme, ignore_errors=True)
        cmd = [sys.executable, os.path.abspath(__file__), "--child", c, "--model", model, "--nvme-dir", nvme,
               "--threads", str(a.threads), "--lr", str(a.lr), "--prefetch", str(a.prefetch), "--steps", str(a.steps),
               "--subgroup-size", str(a.subgroup_size), "--buffer-count", str(a.buffer_count),
               "--activations", a.activations, "--dram-budget", str(a.dram_budget)]
        print(f"$ {' '.join(cmd)}    ({free / 1e9:.0f} GB free)", flush=True)
        t = time.time()
        p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        shutil.rmtree(nvme, ignore_errors=True)
        lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
        if p.returncode != 0 or not lines:
            sys.exit(f"torch_offload: case {c} failed (exit {p.returncode})\n{p.stdout[-2000:]}")
        r = json.loads(lines[-1][7:])
        r["wall_s"] = time.time() - t
        results.append(r)

    print()
    print(f"threads {a.threads}, prefetch {a.prefetch}, subgroup {a.subgroup_size or 'default'}, staging buffers "
          f"{a.buffer_count or 'default'}, streamed cases' activations {a.activations}; GiB = 2^30 B, GB = 10^9 B; "
          "peak RSS = VmHWM of the case's process")
    hdr = ("case", "model", "params", "batch", "weights", "optimizer", "peak RSS", "after load", "load", "step",
           "losses", "NVMe state")
    rows = []
    for r in results:
        rows.append((r["case"], r["shape"], f"{r['params'] / 1e9:.3f} B", f"{r['batch']} x {r['seq']}",
                     r["weights"] if r["how"] == "offload" else "dram (torch)", r["optimizer"],
                     f"{r['peak_rss_gib']:.2f} GiB", f"{r['rss_load_gib']:.2f} GiB", f"{r['load_s']:.0f} s",
                     "/".join(f"{s:.0f}" for s in r["step_s"]) + " s",
                     " ".join(f"{x:.3f}" for x in r["losses"]), f"{r['nvme_state_gb']:.1f} GB"))
    w = [max(len(str(x)) for x in col) for col in zip(hdr, *rows)]
    for row in (hdr, *rows):
        print("  ".join(str(x).ljust(k) for x, k in zip(row, w)).rstrip())
    by = {r["case"]: r for r in results}
    if "capability" in by:
        r = by["capability"]
        ok = r["peak_rss_gib"] < 4 and r["losses"][-1] < r["losses"][0]
        print(f"capability: {r['params'] / 1e9:.2f} B parameters, peak RSS {r['peak_rss_gib']:.2f} GiB (target < 4), "
              f"loss {r['losses'][0]:.3f} -> {r['losses'][-1]:.3f}: {'met' if ok else 'NOT met'}")
    if "offloaded" in by and "resident" in by:
        q = by["offloaded"]["peak_rss_gib"] / by["resident"]["peak_rss_gib"]
        print(f"memory: offloaded / resident peak RSS = {by['offloaded']['peak_rss_gib']:.2f} / "
              f"{by['resident']['peak_rss_gib']:.2f} GiB = {q:.3f} (target <= 1/3 = 0.333): "
              f"{'met' if q <= 1 / 3 else 'NOT met'}")
    if "offloaded" in by and "adamw" in by:
        q = by["offloaded"]["peak_rss_gib"] / by["adamw"]["peak_rss_gib"]
        print(f"against memwall.torch.AdamW(state='nvme') on the whole model: {q:.3f}")
    if a.clean:
        for c in cases:
            shutil.rmtree(os.path.join(a.work, CASES[c][0]), ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
