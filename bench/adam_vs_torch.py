#!/usr/bin/env python3
"""Compares memwall's AdamW step with torch.optim.AdamW (foreach and fused, CPU) and
DeepSpeedCPUAdam on the same parameter count and thread count.

Each thread count runs in a child process with OMP_NUM_THREADS set before torch is imported
(DeepSpeed's CPU Adam and torch may load different OpenMP runtimes; the environment variable
reaches both). memwall is measured by running `memwall bench adam --json` with the same n and
threads. Reported: parameters/s (medians) and memwall's speed-up over each implementation:
memwall fp32 (same 28 bytes/parameter as every torch/DeepSpeed variant here) and memwall's
lean format (bf16 gradients + bf16 moments, 18 bytes/parameter).

Needs torch (and deepspeed for DeepSpeedCPUAdam); missing ones are skipped with a message.
usage: bench/adam_vs_torch.py [--memwall build/memwall] [--n 16777216] [--threads 1,2] [--reps 7] [--rounds 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def child(n, reps):
    """Runs in a child with OMP_NUM_THREADS set; prints one JSON object."""
    try:
        import torch
    except ImportError:
        print(json.dumps({"skip": "torch is not installed (pip install torch)"}))
        return
    torch.manual_seed(0)
    out = {"torch": torch.__version__, "threads": torch.get_num_threads(), "results": {}, "skipped": {}}

    def measure(name, make):
        try:
            p = torch.nn.Parameter(torch.randn(n) * 0.1)
            p.grad = torch.randn(n) * 0.01
            opt = make([p])
            opt.step()  # warm-up: allocates the state
            ts = []
            for _ in range(reps):
                t0 = time.perf_counter()
                opt.step()
                ts.append(time.perf_counter() - t0)
            out["results"][name] = n / statistics.median(ts)
        except Exception as e:  # noqa: BLE001 - report and carry on
            out["skipped"][name] = f"{type(e).__name__}: {e}"

    kw = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)
    measure("torch AdamW foreach", lambda ps: torch.optim.AdamW(ps, foreach=True, **kw))
    measure("torch AdamW fused", lambda ps: torch.optim.AdamW(ps, fused=True, **kw))
    try:
        import io
        import contextlib
        with contextlib.redirect_stdout(io.StringIO()):
            from deepspeed.ops.adam import DeepSpeedCPUAdam
        measure("DeepSpeedCPUAdam", lambda ps: DeepSpeedCPUAdam(ps, adamw_mode=True, **kw))
    except Exception as e:  # noqa: BLE001
        out["skipped"]["DeepSpeedCPUAdam"] = f"deepspeed unavailable ({type(e).__name__}: {e}); pip install deepspeed"
    print(json.dumps(out))


def memwall(cli, n, t, reps):
    r = subprocess.run([cli, "bench", "adam", "--json", "--n", str(n), "--threads", str(t), "--reps", str(reps)],
                       capture_output=True, text=True, check=True)
    return {x["format"]: x for x in json.loads(r.stdout)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--memwall", default=os.path.join(HERE, "..", "build", "memwall"))
    ap.add_argument("--n", type=int, default=1 << 24)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=3, help="alternating torch/memwall rounds (median)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    a = ap.parse_args()
    if a.child:
        child(a.n, a.reps)
        return 0
    rows = []
    for t in [int(x) for x in a.threads.split(",")]:
        # rounds alternate torch/DeepSpeed and memwall so that load changes hit both alike
        runs, mws = {}, {"fp32": [], "bf16-moments": []}
        for _ in range(a.rounds):
            env = dict(os.environ, OMP_NUM_THREADS=str(t), PYTHONWARNINGS="ignore")
            r = subprocess.run([sys.executable, __file__, "--child", "--n", str(a.n), "--reps", str(a.reps)],
                               capture_output=True, text=True, env=env)
            lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
            if r.returncode != 0 or not lines:
                print(f"threads={t}: torch child failed:\n{r.stderr[-2000:]}", file=sys.stderr)
                return 1
            res = json.loads(lines[-1])
            if "skip" in res:
                print("SKIP:", res["skip"])
                return 0
            for k, why in res["skipped"].items():
                if k not in runs:
                    print(f"SKIP {k} (threads={t}): {why}")
                runs.setdefault(k, [])
            for k, pps in res["results"].items():
                runs.setdefault(k, []).append(pps)
            mw = memwall(a.memwall, a.n, t, a.reps)
            for k in mws:
                mws[k].append(mw[k]["params_per_s"])
        mw32, lean = statistics.median(mws["fp32"]), statistics.median(mws["bf16-moments"])
        rows.append(dict(impl="memwall fp32", threads=t, params_per_s=mw32))
        rows.append(dict(impl="memwall bf16-grad+bf16-moments", threads=t, params_per_s=lean))
        for k, v in runs.items():
            if not v:
                continue
            pps = statistics.median(v)
            rows.append(dict(impl=k, threads=t, params_per_s=pps, memwall_fp32_speedup=mw32 / pps,
                             memwall_lean_speedup=lean / pps))
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"AdamW step, n = {a.n} parameters, median of {a.rounds} rounds x {a.reps} steps; "
          "speed-up = memwall params/s / theirs")
    print(f"{'implementation':32s} {'threads':>7s} {'Mparams/s':>10s} {'fp32 x':>8s} {'lean x':>8s}")
    for r in rows:
        sp = (f"{r['memwall_fp32_speedup']:8.2f} {r['memwall_lean_speedup']:8.2f}"
              if "memwall_fp32_speedup" in r else f"{'':8s} {'':8s}")
        print(f"{r['impl']:32s} {r['threads']:7d} {r['params_per_s'] / 1e6:10.1f} {sp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
