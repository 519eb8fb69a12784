#!/usr/bin/env python3
"""What memwall.torch.AdamW costs beside the update: peak resident set and staging buffers of a
short training run, and the NVMe bytes state_dict() / load_state_dict() move (docs/python.md,
"Footprint").

    python3 bench/torch_footprint.py                  # 4.19M parameters: torch vs memwall (NVMe)
    python3 bench/torch_footprint.py --vocab 50257 --layers 12 --embd 768 --block 1024   # GPT-2 124M

Each optimizer runs in its own process (a resident-set peak is per process): the GPT of
examples/torch_gpt.py on random byte batches, `--steps` steps with clipping, then (memwall) a
state_dict() and a load_state_dict() of it into the same optimizer, with the engine's
nvme_read_bytes / nvme_write_bytes taken around each. One line of JSON per process.
"""
import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, ".."))


def child(a):
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch
    torch.set_num_threads(a.threads)
    spec = importlib.util.spec_from_file_location("torch_gpt", os.path.join(ROOT, "examples", "torch_gpt.py"))
    tg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tg)
    torch.manual_seed(0)
    model = tg.GPT(tg.GPTConfig(block_size=a.block, vocab_size=a.vocab, n_layer=a.layers, n_head=a.heads,
                                n_embd=a.embd))
    n = sum(p.numel() for p in model.parameters())
    groups = model.param_groups(weight_decay=0.1)
    out = {"optimizer": a.child, "params": n}
    tmp = None
    if a.child == "torch":
        opt = torch.optim.AdamW(groups, lr=1e-3)
    else:
        import memwall.torch
        tmp = tempfile.TemporaryDirectory(prefix="memwall-footprint-", dir=a.nvme_dir)
        opt = memwall.torch.AdamW(groups, lr=1e-3, state="nvme", nvme_dir=tmp.name, threads=a.threads)
    g = torch.Generator().manual_seed(0)
    for _ in range(a.steps):
        x = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
        _, loss = model(x, torch.roll(x, -1, 1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    out["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30
    if a.child == "memwall":
        s0 = opt.stats()
        out["staging_bytes"] = s0["staging_bytes"]
        out["n_subgroups"] = s0["n_subgroups"]
        sd = opt.state_dict()
        s1 = opt.stats()
        opt.load_state_dict(sd)
        s2 = opt.stats()
        out["moment_bytes"] = sum(v.numel() * v.element_size() for st in sd["state"].values()
                                  for k, v in st.items() if k in ("exp_avg", "exp_avg_sq"))
        out["state_bytes_on_nvme"] = s0["nvme_bytes"] / 2  # two slots
        out["state_dict_read"] = s1["nvme_read_bytes"] - s0["nvme_read_bytes"]
        out["load_state_dict_read"] = s2["nvme_read_bytes"] - s1["nvme_read_bytes"]
        out["load_state_dict_written"] = s2["nvme_write_bytes"] - s1["nvme_write_bytes"]
        opt.close()
    if tmp:
        tmp.cleanup()
    print("RESULT " + json.dumps(out), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", choices=["torch", "memwall"], help=argparse.SUPPRESS)
    ap.add_argument("--optimizers", default="torch,memwall")
    ap.add_argument("--vocab", type=int, default=3780)   # with the defaults below: 4.19M parameters
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--block", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--nvme-dir", default=None, help="where the NVMe state goes (default: the temporary directory)")
    a = ap.parse_args()
    if a.child:
        child(a)
        return
    args = [f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items()
            if k not in ("child", "optimizers") and v is not None]
    for opt in a.optimizers.split(","):
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", opt] + args,
                           capture_output=True, text=True)
        lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
        if r.returncode or not lines:
            print(f"{opt}: failed (rc {r.returncode}): {r.stderr.strip()[-2000:]}")
            continue
        print(lines[-1][7:])


if __name__ == "__main__":
    main()
