"""trace=...: the engine's events (NVMe reads and writes per subgroup, updates, tier bytes) go to a
Chrome/Perfetto JSON file that `memwall report` reads."""
import json
import os
import shutil
import subprocess

import pytest

import memwall.torch
from conftest import ROOT, THREADS, batches, make_mlp, mlp_groups, train


def test_trace_is_written_and_reported(nvme_dir, tmp_path):
    path = tmp_path / "run" / "trace.json"  # the directory is created
    m = make_mlp()
    opt = memwall.torch.AdamW(mlp_groups(m, 1e-3), state="nvme", nvme_dir=nvme_dir, subgroup_size=2048,
                              trace=str(path), threads=THREADS)
    train("mlp", m, opt, batches("mlp", 3))
    opt.close()
    assert not os.listdir(nvme_dir)  # close() removed the engines' state directories
    with open(path) as f:
        tr = json.load(f)
    names = {e.get("name") for e in tr["traceEvents"] if e.get("cat") == "offload"}
    # subgroup reads and writes, named as docs/trace-conventions.md says
    assert {"read", "write"} <= names, names
    assert sum(1 for e in tr["traceEvents"] if e.get("cat") == "offload" and e.get("name") == "update") >= 3
    cli = os.environ.get("MW_CLI") or shutil.which("memwall") or os.path.join(ROOT, "build", "memwall")
    if not os.path.exists(cli):
        pytest.fail("no memwall CLI to read the trace at %s (make build; CTest sets MW_CLI)" % cli)
    r = subprocess.run([cli, "report", "--text", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "nvme" in r.stdout.lower()


def test_trace_and_state_cleaned_up_at_exit_without_close(tmp_path):
    """A script that never calls close(): the trace is still written and the NVMe state removed."""
    import sys
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    path = tmp_path / "t.json"
    code = (f"import torch, memwall.torch\n"
            f"m = torch.nn.Linear(8, 8)\n"
            f"opt = memwall.torch.AdamW(m.parameters(), state='nvme', nvme_dir={str(nvme)!r}, trace={str(path)!r})\n"
            f"m(torch.randn(2, 8)).sum().backward()\n"
            f"opt.step()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy())
    assert r.returncode == 0, r.stderr
    assert path.exists() and json.loads(path.read_text())["traceEvents"]
    assert os.listdir(nvme) == []
