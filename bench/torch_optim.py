#!/usr/bin/env python3
"""Optimizer-step throughput of memwall.torch.AdamW beside torch.optim.AdamW(fused=True),
DeepSpeedCPUAdam and torchao's CPUOffloadOptimizer, on GPT-2 124M's parameter shapes
(148 tensors, 124.4M fp32 parameters), at 1 and 2 threads; optionally a whole GPT-2 training
step with the state on NVMe against torch.optim.AdamW in DRAM (--gpt2-steps).

Each (optimizer, threads) runs in its own child process with OMP_NUM_THREADS set before torch
is imported, so every OpenMP runtime in the process (torch's, memwall's, DeepSpeed's) sees the
same count, and no run inherits another's memory. Parameters and gradients are random; one
warm-up step allocates the state; then the median of --reps steps (gradients unchanged, no
zero_grad: the step alone is timed). Every implementation runs once per round (--rounds, in an
order rotated each round), and each speed-up is taken within a round, then the median over
rounds: this guest's memory bandwidth drifts within minutes. memwall's Python overhead is the step's wall time minus
the engine's own time (stats()['step_s']), over the wall time.

--interleave puts all implementations of a thread count in one process instead and takes their
steps in turn (for a guest whose bandwidth jumps within seconds); --limits adds the physical
limit of the fp32 step (the same bytes in place, no arithmetic) to the rounds and prints each
optimizer's share of it.

Missing implementations are listed with the reason (deepspeed and torchao are not installed by
scripts/install-deps.sh; `pip install deepspeed torchao` to add them; torchao's offload refuses
to run without a CUDA or XPU device).

    python3 bench/torch_optim.py                      # the full table (needs ~4 GiB free)
    python3 bench/torch_optim.py --interleave --limits --rounds 3 --reps 9   # (~14 GiB free)
    python3 bench/torch_optim.py --quick              # a 4M-parameter smoke run of the script
    python3 bench/torch_optim.py --gpt2-steps 5 --nvme-dir /mnt/nvme/bench
"""
import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))

IMPLS = ["torch-fused", "memwall", "memwall-bf16", "memwall-8bit", "deepspeed", "torchao-offload", "memwall-cuda"]
LIMITS = ["limit-huge", "limit-4k"]  # the bandwidth ceiling, for --limits


def shapes(quick):
    """GPT-2 124M's parameter tensors in HF order (or a 4M-parameter miniature)."""
    d, v, L, ctx = (192, 12000, 4, 256) if quick else (768, 50257, 12, 1024)
    out = [(v, d), (ctx, d)]
    for _ in range(L):
        out += [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,), (d,), (d,), (d, 4 * d), (4 * d,), (4 * d, d), (d,)]
    return out + [(d,), (d,)]


class BandwidthLimit:
    """The physical limit of the fp32 AdamW step, as `memwall bench adam` measures it: the C
    library's mw_optim_bandwidth_pass moves the same 28 bytes per parameter as the step (reads
    p, g, m, v; writes p, m, v), in place, with no arithmetic, over one flat array per operand.
    "limit-huge": arrays on transparent huge pages (as memwall.torch keeps its flat buffers and
    state); "limit-4k": arrays from torch.empty, 4 KiB pages (as torch and DeepSpeed keep theirs)."""

    def __init__(self, n, huge):
        import torch
        from memwall import _lib
        from memwall.torch import _host_flat
        self.arrays = [(_host_flat(n, torch.float32)[0] if huge else torch.empty(n)).fill_(0.5) for _ in range(4)]
        self.fmt = _lib.OptimFormat(_lib.OPTIM_F32, _lib.OPTIM_F32, 0)
        self.ex = _lib.OptimExec(torch.get_num_threads(), 0, 0)  # AUTO SIMD
        p, g, m, v = (a.data_ptr() for a in self.arrays)
        self.slice = _lib.OptimSlice(n, 0, p, g, m, v, None, None, None)

    def step(self):
        import ctypes
        from memwall import _lib
        _lib.check(_lib.lib().mw_optim_bandwidth_pass(ctypes.byref(self.fmt), ctypes.byref(self.slice),
                                                      ctypes.byref(self.ex)), "mw_optim_bandwidth_pass")


def make_opt(impl, quick, out):
    """Random parameters and gradients in GPT-2's shapes and the optimizer `impl` over them."""
    import torch
    torch.manual_seed(0)
    ps = []
    for s in shapes(quick):
        p = torch.nn.Parameter(torch.randn(s) * 0.02)
        p.grad = torch.randn(s) * 0.01
        ps.append(p)
    kw = dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    if impl in LIMITS:
        opt = BandwidthLimit(sum(p.numel() for p in ps), impl == "limit-huge")
        out["note"] = "no arithmetic: the bytes of the fp32 step, in place"
    elif impl == "torch-fused":
        opt = torch.optim.AdamW(ps, fused=True, **kw)
    elif impl == "memwall-cuda":  # torchao's setting: CUDA parameters, state on the host
        import memwall.torch
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device")
        ps = [torch.nn.Parameter(p.detach().cuda()) for p in ps]
        for p, s in zip(ps, shapes(quick)):
            p.grad = torch.randn(s, device="cuda") * 0.01
        opt = memwall.torch.AdamW(ps, threads=torch.get_num_threads(), **kw)
        out["note"] = "CUDA params, includes the host<->device copies"
    elif impl.startswith("memwall"):
        import memwall.torch
        mom = {"memwall": "fp32", "memwall-bf16": "bf16", "memwall-8bit": "8bit"}[impl]
        opt = memwall.torch.AdamW(ps, moment_dtype=mom, threads=torch.get_num_threads(), **kw)
    elif impl == "deepspeed":
        import contextlib
        import io
        with contextlib.redirect_stdout(io.StringIO()):
            from deepspeed.ops.adam import DeepSpeedCPUAdam
        opt = DeepSpeedCPUAdam(ps, adamw_mode=True, **kw)
    elif impl == "torchao-offload":
        # torchao's CPU offload keeps CUDA parameters and their state on the host; on a
        # machine without CUDA it refuses (reported as skipped).
        from torchao.optim import CPUOffloadOptimizer
        if torch.cuda.is_available():
            ps = [torch.nn.Parameter(p.detach().cuda()) for p in ps]
            for p, s in zip(ps, shapes(quick)):
                p.grad = torch.randn(s, device="cuda") * 0.01
        opt = CPUOffloadOptimizer(ps, torch.optim.AdamW, fused=True, **kw)
        out["note"] = "CUDA params, includes the host<->device copies"
    else:
        raise ValueError(impl)
    return opt


def timed_step(impl, opt):
    """One step: (wall seconds, the engine's own seconds or None)."""
    import torch
    s0 = opt.stats()["step_s"] if impl.startswith("memwall") else 0.0
    t0 = time.perf_counter()
    opt.step()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t = time.perf_counter() - t0
    return t, (opt.stats()["step_s"] - s0 if impl.startswith("memwall") else None)


def child(impl, quick, reps, nvme_dir):
    import torch
    n = sum(math.prod(s) for s in shapes(quick))
    out = {"impl": impl, "threads": torch.get_num_threads(), "params": n}
    try:
        opt = make_opt(impl, quick, out)
        opt.step()
        ts, eng = [], []
        for _ in range(reps):
            t, e = timed_step(impl, opt)
            ts.append(t)
            if e is not None:
                eng.append(e)
        out["step_s"] = statistics.median(ts)
        out["params_per_s"] = n / out["step_s"]
        if eng:
            over = [(t - e) / t for t, e in zip(ts, eng)]
            out["python_overhead"] = statistics.median(over)
    except Exception as e:  # noqa: BLE001 - a missing or failing implementation is reported, not fatal
        out["skip"] = skip_reason(e)
    print("RESULT " + json.dumps(out))


def skip_reason(e):
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]


def child_interleaved(impls, quick, reps):
    """--interleave: every implementation in this one process, each over its own tensors, and
    their steps taken in turn (rotated each repetition), so that a drift of the machine's
    memory bandwidth falls on neighbouring steps of all of them alike. One RESULT per
    (implementation, repetition); the repetition is the round of the ratios."""
    import torch
    n = sum(math.prod(s) for s in shapes(quick))
    opts = {}
    for impl in impls:
        out = {"impl": impl, "threads": torch.get_num_threads(), "params": n}
        try:
            opt = make_opt(impl, quick, out)
            opt.step()  # warm-up: allocates the state
            opts[impl] = opt
        except Exception as e:  # noqa: BLE001
            out["skip"] = skip_reason(e)
            print("RESULT " + json.dumps(out))
    live = [i for i in impls if i in opts]
    for r in range(reps):
        k = r % max(1, len(live))
        for impl in live[k:] + live[:k]:
            t, e = timed_step(impl, opts[impl])
            out = {"impl": impl, "threads": torch.get_num_threads(), "params": n, "rep": r,
                   "step_s": t, "params_per_s": n / t}
            if e is not None:
                out["python_overhead"] = (t - e) / t
            print("RESULT " + json.dumps(out), flush=True)


def run_interleaved(impls, threads, quick, reps):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child-interleaved", ",".join(impls),
                        "--reps", str(reps)] + (["--quick"] if quick else []),
                       env=env, capture_output=True, text=True)
    rows = [json.loads(line[7:]) for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
        rows += [{"impl": i, "threads": threads, "skip": f"child failed (rc {r.returncode}): {tail[:200]}"} for i in impls]
    return rows


def run_child(impl, threads, quick, reps, nvme_dir):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", impl, "--reps", str(reps),
                        "--nvme-dir", nvme_dir or ""] + (["--quick"] if quick else []),
                       env=env, capture_output=True, text=True)
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
    return {"impl": impl, "threads": threads, "skip": f"child failed (rc {r.returncode}): {tail[:200]}"}


def gpt2_step(opt, threads, steps, nvme_dir, quick, mw_args=()):
    """examples/torch_gpt.py, GPT-2 124M, batch 4 x 256: median step time and peak RSS."""
    cmd = [sys.executable, os.path.join(ROOT, "examples", "torch_gpt.py"), "--model", "tiny" if quick else "gpt2",
           "--batch", "4", "--seq", "64" if quick else "256", "--steps", str(steps), "--threads", str(threads),
           "--clip", "0", "--optimizer", opt]
    if opt == "memwall":
        cmd += ["--state", "nvme"] + (["--nvme-dir", nvme_dir] if nvme_dir else []) + list(mw_args)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    m = re.search(r"median step (\d+) ms, peak RSS ([\d.]+) GiB", r.stdout)
    if not m:
        return {"opt": opt, "skip": (r.stderr.strip().splitlines() or ["no output"])[-1][:200]}
    return {"opt": opt, "step_s": int(m.group(1)) / 1e3, "peak_rss_gib": float(m.group(2))}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=5, help="timed steps per child process (median)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds over all implementations (ratios: median over rounds)")
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--quick", action="store_true", help="4M parameters, to check that the script works")
    ap.add_argument("--gpt2-steps", type=int, default=0, help="also time GPT-2 training steps (0: skip)")
    ap.add_argument("--nvme-dir", default=None, help="directory for the NVMe state of --gpt2-steps")
    ap.add_argument("--gpt2-memwall-args", default="--subgroup-size 2097152 --buffer-count 4 --release-grads",
                    help="memwall options of examples/torch_gpt.py for --gpt2-steps (staging: 4 x 24 MiB, "
                         "released between steps with the gradients)")
    ap.add_argument("--interleave", action="store_true",
                    help="all implementations of a thread count in one process, their steps taken in turn; "
                         "each repetition is a round of the ratios (for a guest whose bandwidth drifts within "
                         "seconds; needs ~10 GiB free)")
    ap.add_argument("--limits", action="store_true",
                    help="also time the bandwidth limit of the fp32 step (limit-huge, limit-4k: the same bytes "
                         "in place, no arithmetic) and print each optimizer's share of it")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-interleaved", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.quick, a.reps, a.nvme_dir)
        return
    if a.child_interleaved:
        child_interleaved(a.child_interleaved.split(","), a.quick, a.reps)
        return
    # Rounds: every implementation once per round, in an order rotated each round, so that the
    # minute-to-minute drift of this machine's memory bandwidth falls on all of them alike; each
    # ratio is taken within a round (side by side) and the median over rounds is reported.
    rows = []
    impls = a.impls.split(",") + (LIMITS if a.limits else [])
    threads = [int(x) for x in a.threads.split(",")]
    nrounds = a.rounds * a.reps if a.interleave else a.rounds
    for rnd in range(a.rounds):
        for t in threads:
            if a.interleave:
                got = run_interleaved(impls, t, a.quick, a.reps)
                for r in got:
                    r["round"] = rnd * a.reps + r.get("rep", 0)
            else:
                k = rnd % len(impls)
                got = []
                for impl in impls[k:] + impls[:k]:
                    got.append(run_child(impl, t, a.quick, a.reps, a.nvme_dir))
                    got[-1]["round"] = rnd
            for r in got:
                impl = r["impl"]
                rows.append(r)
                if "skip" in r:
                    if rnd == 0:
                        print(f"{impl:16s} {t} thread(s): skipped: {r['skip']}", flush=True)
                    continue
                extra = f", Python overhead {100 * r['python_overhead']:.2f}%" if "python_overhead" in r else ""
                print(f"round {r['round'] + 1}/{nrounds} {impl:16s} {t} thread(s): {r['params'] / 1e6:.1f}M params, step "
                      f"{r['step_s'] * 1e3:8.1f} ms, {r['params_per_s'] / 1e9:.3f} Gparams/s{extra}", flush=True)
    ok = [r for r in rows if "skip" not in r]
    print(f"\nmedians over {nrounds} round(s):")
    for t in threads:
        for impl in impls:
            v = [r for r in ok if r["impl"] == impl and r["threads"] == t]
            if v:
                st = statistics.median(r["step_s"] for r in v)
                print(f"  {impl:16s} {t} thread(s): step {st * 1e3:8.1f} ms, {v[0]['params'] / st / 1e9:.3f} Gparams/s")
    print("\nspeed-up of memwall over each (same threads, same round; median over rounds [min, max]; >1 = memwall faster):")
    by = {(r["impl"], r["threads"], r["round"]): r for r in ok}
    pairs = [(mw, other) for mw in ("memwall", "memwall-bf16", "memwall-8bit") for other in ("torch-fused", "deepspeed")]
    pairs.append(("memwall-cuda", "torchao-offload"))
    for t in threads:
        for mw, other in pairs:
            q = [by[(mw, t, k)]["params_per_s"] / by[(other, t, k)]["params_per_s"]
                 for k in range(nrounds) if (mw, t, k) in by and (other, t, k) in by]
            if q:
                print(f"  {t} thread(s): {mw:13s} / {other:16s} {statistics.median(q):.2f}x [{min(q):.2f}, {max(q):.2f}]")
    if any(r["impl"] in LIMITS for r in ok):
        print("\nshare of the bandwidth limit (bytes moved per second over the limit's, same threads and round; "
              "fp32 state 28 B/param, bf16 moments 20 B/param):")
        for t in threads:
            for impl, nbytes in (("torch-fused", 28), ("deepspeed", 28), ("memwall", 28), ("memwall-bf16", 20)):
                for lim in LIMITS:
                    q = [by[(impl, t, k)]["params_per_s"] * nbytes / (by[(lim, t, k)]["params_per_s"] * 28)
                         for k in range(nrounds) if (impl, t, k) in by and (lim, t, k) in by]
                    if q:
                        print(f"  {t} thread(s): {impl:13s} / {lim:10s} {statistics.median(q):.3f} "
                              f"[{min(q):.3f}, {max(q):.3f}]")
    gpt = []
    if a.gpt2_steps:
        tmp = None
        nvme = a.nvme_dir
        if not nvme:
            tmp = tempfile.TemporaryDirectory(prefix="memwall-bench-")
            nvme = tmp.name
        for opt in ("torch", "memwall"):
            gpt.append(gpt2_step(opt, 2, a.gpt2_steps, nvme, a.quick, a.gpt2_memwall_args.split()))
            print(f"GPT-2 step, {opt}: {gpt[-1]}", flush=True)
        if all("skip" not in g for g in gpt):
            print(f"  step time memwall(nvme) / torch(dram): {gpt[1]['step_s'] / gpt[0]['step_s']:.2f}; peak RSS "
                  f"{gpt[1]['peak_rss_gib']:.2f} vs {gpt[0]['peak_rss_gib']:.2f} GiB")
        if tmp:
            tmp.cleanup()
    if a.json:
        print(json.dumps({"rows": rows, "gpt2": gpt}))


if __name__ == "__main__":
    main()
