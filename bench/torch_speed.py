#!/usr/bin/env python3
"""bench/torch_speed.py — memwall.torch.offload's step time from PyTorch, side by side with the same
model resident and with DeepSpeed ZeRO-3 offloading to NVMe (issue 25's "Speed" and "DeepSpeed side
by side" figures; docs/python.md).

Each case runs in its own process (a child of this script), one after the other, rounds alternating
their order; each step is `accum` micro-batches of batch x seq random token ids (the same ones every
step), forward, backward, then the optimizer's step (lr 1e-4, betas 0.9/0.95, no weight decay). The
model is a transformers Qwen2 of a published shape (scripts/make_hf_model.py, bf16 files).

Cases:
  resident    memwall.torch.offload(weights="dram", optimizer="nvme"): weights and gradients in DRAM, the
              AdamW state on NVMe, the update behind the next forward (the same hooks as offloaded)
  offloaded   memwall.torch.offload() defaults: weights and gradients streamed from NVMe unit by unit,
              the AdamW state on NVMe (offloaded / resident is the speed figure; target at most 1.15)
  deepspeed   DeepSpeed ZeRO-3 with offload_param and offload_optimizer on NVMe (its CPU accelerator, gloo,
              DeepSpeedCPUAdam, aio on this disk), the model built under zero.Init from the same config
              (random weights: the values do not change the time); needs `pip install deepspeed` and libaio

The hooks' Python share: the time spent inside memwall's hook functions minus the time inside the C
calls they make (acquiring a unit waits for its fetch: that is I/O, not Python), over the step time.
Per case: median step time of the steps after --drop, peak resident set (VmHWM), tokens per second.

    python3 bench/torch_speed.py --work /tmp/mw-speed                          # 0.5B, 2 x 256 x 8
    python3 bench/torch_speed.py --shape smollm2-135m --batch 1 --seq 64 --accum 2 --steps 3 --drop 1
    MEMWALL_LIB=build/libmemwall.so PYTHONPATH=python python3 bench/torch_speed.py ...

`--dram-budget G` gives memwall's cases offload(dram_budget=G GiB): with room, each step's gradients stay
in DRAM (docs/python.md); DeepSpeed's peak resident set is the bound of the side-by-side figure.

GiB = 2^30 bytes, GB = 10^9.
"""
import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))
GIB = 1 << 30
CASES = ("resident", "offloaded", "deepspeed")


def status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


# ---------------------------------------------------------------- timing memwall's hooks

class HookClock:
    """Wraps the Offload hook methods and the C library's functions: hook seconds minus C seconds."""

    HOOKS = ("_root_pre", "_root_post", "_site_pre", "_site_post", "_bwd_event", "_on_grad", "_on_alias_grad",
             "_end_backward", "_step", "_grad_norm")

    def __init__(self):
        self.hook_s = 0.0
        self.c_s = 0.0
        self.depth = 0

    def install(self, offload_cls, lib_module):
        for name in self.HOOKS:
            f = getattr(offload_cls, name, None)
            if f is not None:
                setattr(offload_cls, name, self._wrap_hook(f))
        real = lib_module.lib
        clock = self

        class Proxy:
            def __init__(self, cdll):
                self._cdll = cdll

            def __getattr__(self, name):
                fn = getattr(self._cdll, name)
                if not name.startswith("mw_pysession_") or not callable(fn):
                    return fn

                def timed(*args):
                    if clock.depth == 0:
                        return fn(*args)
                    t = time.perf_counter()
                    try:
                        return fn(*args)
                    finally:
                        clock.c_s += time.perf_counter() - t
                return timed

        proxy = {}

        def lib():
            c = real()
            if id(c) not in proxy:
                proxy[id(c)] = Proxy(c)
            return proxy[id(c)]
        lib_module.lib = lib

    def _wrap_hook(self, f):
        clock = self

        @functools.wraps(f)
        def hook(*args, **kw):
            if clock.depth:
                return f(*args, **kw)
            clock.depth += 1
            t = time.perf_counter()
            try:
                return f(*args, **kw)
            finally:
                clock.hook_s += time.perf_counter() - t
                clock.depth -= 1
        return hook


# ---------------------------------------------------------------- one case, in its own process

def build_deepspeed(a, cfg, torch):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(k, v)
    import deepspeed
    from transformers import AutoModelForCausalLM
    deepspeed.init_distributed(dist_backend="gloo")
    largest = max(cfg.vocab_size * cfg.hidden_size, cfg.hidden_size * cfg.intermediate_size)
    os.makedirs(a.nvme_dir, exist_ok=True)
    dsc = {
        "train_micro_batch_size_per_gpu": a.batch,
        "gradient_accumulation_steps": a.accum,
        "optimizer": {"type": "AdamW", "params": {"lr": a.lr, "betas": [0.9, 0.95], "eps": 1e-8,
                                                  "weight_decay": 0.0}},
        "zero_optimization": {
            "stage": 3,
            "offload_param": {"device": "nvme", "nvme_path": a.nvme_dir, "pin_memory": False,
                              "buffer_count": 5, "buffer_size": int(largest * 1.02)},
            "offload_optimizer": {"device": "nvme", "nvme_path": a.nvme_dir, "pin_memory": False,
                                  "buffer_count": 4},
        },
        "aio": {"block_size": 1 << 20, "queue_depth": 8, "single_submit": False, "overlap_events": True,
                "use_gds": False},
        "steps_per_print": 1 << 30,
    }
    with torch.device("meta"):  # imports the model's modules before zero.Init patches tensor creation
        AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    from transformers.integrations import HfDeepSpeedConfig
    a._hf_ds = HfDeepSpeedConfig(dsc)  # kept alive: transformers then builds and initialises under zero.Init
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    eng, _, _, _ = deepspeed.initialize(model=model, config=dsc, model_parameters=model.parameters())
    return eng


def child(a):
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import torch
    torch.set_num_threads(a.threads)
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(a.model)
    out = dict(case=a.child, shape=a.shape, batch=a.batch, seq=a.seq, accum=a.accum, threads=a.threads)
    clock = None
    t0 = time.time()
    if a.child == "deepspeed":
        eng = build_deepspeed(a, cfg, torch)
        fwd, n_params = eng, sum(p.ds_numel for p in eng.module.parameters())

        def backward(loss):
            eng.backward(loss)

        def step():
            pass  # eng.step() after each backward (DeepSpeed steps at the accumulation boundary)
    else:
        import memwall._lib as mlib
        import memwall._offload as moff
        import memwall.torch as mt
        clock = HookClock()
        clock.install(moff.Offload, mlib)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        weights, optimizer = ("dram", "nvme") if a.child == "resident" else ("nvme", None)
        off = mt.offload(model, nvme_dir=a.nvme_dir, weights=weights, optimizer=optimizer, weights_from=a.model,
                         grad_accum=a.accum, threads=a.threads, prefetch=a.prefetch,
                         dram_budget=int(a.dram_budget * 2**30) if a.dram_budget else None,
                         trace=f"{a.trace}.{a.child}.json" if a.trace else None)
        opt = off.optimizer(lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
        model.train()
        fwd, n_params = model, sum(p.numel() for p in model.parameters())

        def backward(loss):
            (loss / a.accum).backward()

        def step():
            opt.step()
            opt.zero_grad()
    out["params"] = n_params
    out["load_s"] = time.time() - t0
    g = torch.Generator().manual_seed(0)
    xs = [torch.randint(0, cfg.vocab_size, (a.batch, a.seq), generator=g) for _ in range(a.accum)]
    losses, times, hook_py, waits = [], [], [], []
    for _ in range(a.steps):
        h0 = (clock.hook_s - clock.c_s) if clock else 0.0
        w0 = off.stats()["fetch_wait_s"] if a.child != "deepspeed" else 0.0
        t = time.perf_counter()
        total = 0.0
        for x in xs:
            loss = fwd(input_ids=x, labels=x).loss
            backward(loss)
            if a.child == "deepspeed":
                fwd.step()
            total += loss.item()
        step()
        times.append(time.perf_counter() - t)
        hook_py.append(((clock.hook_s - clock.c_s) if clock else 0.0) - h0)
        waits.append((off.stats()["fetch_wait_s"] if a.child != "deepspeed" else 0.0) - w0)
        losses.append(total / a.accum)
        print(f"  {a.child}: step {len(losses)} loss {losses[-1]:.4f} {times[-1]:.2f} s (hooks' Python "
              f"{hook_py[-1]:.3f} s, waited for weight fetches {waits[-1]:.2f} s) VmHWM "
              f"{status_kib('VmHWM') / (1 << 20):.2f} GiB", file=sys.stderr, flush=True)
    if a.child != "deepspeed":
        off.finish()
    kept = times[a.drop:] or times
    med = statistics.median(kept)
    out.update(losses=losses, step_s=times, median_step_s=med, tokens_per_s=a.batch * a.seq * a.accum / med,
               hook_python_s=hook_py, fetch_wait_s=waits, hook_python_share=statistics.median(
                   [h / t for h, t in zip(hook_py[a.drop:] or hook_py, kept)]),
               peak_rss_gib=status_kib("VmHWM") / (1 << 20))
    print("RESULT " + json.dumps(out), flush=True)
    if a.child != "deepspeed":
        off.close(restore=False)
    return 0


# ---------------------------------------------------------------- the driver

def make_model(a):
    path = os.path.join(a.work, a.shape)
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    cmd = [sys.executable, os.path.join(ROOT, "scripts", "make_hf_model.py"), "--shape", a.shape, "--dtype", "bf16",
           "--out", path]
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return path


def run_case(a, c, model):
    nvme = os.path.join(a.work, f"nvme-{c}")
    shutil.rmtree(nvme, ignore_errors=True)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", c, "--model", model, "--nvme-dir", nvme]
    for k in ("shape", "batch", "seq", "accum", "steps", "drop", "threads", "lr", "prefetch", "dram_budget"):
        cmd += [f"--{k.replace('_', '-')}", str(getattr(a, k))]
    if a.trace:
        cmd += ["--trace", os.path.abspath(a.trace)]
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    shutil.rmtree(nvme, ignore_errors=True)
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        print(f"torch_speed: case {c} failed (exit {p.returncode})\n{p.stdout[-2000:]}", file=sys.stderr)
        return None
    return json.loads(lines[-1][7:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="/tmp/mw-torch-speed", help="model directory and NVMe state go here")
    ap.add_argument("--cases", default="resident,offloaded", help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--shape", default="qwen2.5-0.5b", help="scripts/make_hf_model.py --shape (default qwen2.5-0.5b)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--accum", type=int, default=8, help="micro-batches per step (default 8)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--drop", type=int, default=1, help="first steps left out of the median (default 1)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds; each reverses the order of the cases")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--prefetch", type=int, default=2)
    ap.add_argument("--dram-budget", type=float, default=0,
                    help="GiB: memwall's dram_budget (0: none); the budget picks the staging and, with room, keeps "
                         "each step's gradients in DRAM")
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument("--trace", help="memwall's trace of each memwall case to TRACE.<case>.json (memwall report)")
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
    if min(a.batch, a.seq, a.accum, a.steps, a.rounds, a.threads) < 1 or not 0 <= a.drop < a.steps:
        ap.error("batch, seq, accum, steps, rounds, threads: at least 1; drop: 0 .. steps-1")
    os.makedirs(a.work, exist_ok=True)
    model = make_model(a)
    results = []
    for r in range(a.rounds):
        for c in (cases if r % 2 == 0 else cases[::-1]):
            res = run_case(a, c, model)
            if res:
                res["round"] = r
                results.append(res)
    by = {}
    for res in results:
        by.setdefault(res["case"], []).append(res)
    print(f"\n{a.shape}, batch {a.batch} x {a.seq}, accumulation {a.accum}, {a.threads} threads, "
          f"{a.steps} steps (median of steps {a.drop + 1}..{a.steps}), {a.rounds} round(s)")
    print(f"{'case':<10} {'step s':>9} {'tokens/s':>9} {'peak RSS GiB':>13} {'hooks Python':>13}  losses")
    med = {}
    for c, rs in by.items():
        med[c] = statistics.median(x["median_step_s"] for x in rs)
        rss = max(x["peak_rss_gib"] for x in rs)
        share = statistics.median(x["hook_python_share"] for x in rs)
        print(f"{c:<10} {med[c]:>9.2f} {a.batch * a.seq * a.accum / med[c]:>9.1f} {rss:>13.2f} "
              f"{100 * share:>12.2f}%  {' '.join(f'{v:.4f}' for v in rs[0]['losses'])}")
    if "resident" in med and "offloaded" in med:
        print(f"offloaded / resident step time: {med['offloaded'] / med['resident']:.3f} (target at most 1.15)")
    if "deepspeed" in med and "offloaded" in med:
        print(f"memwall offloaded throughput / DeepSpeed ZeRO-3 NVMe: {med['deepspeed'] / med['offloaded']:.2f}x "
              "(target at least 1.5x)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
