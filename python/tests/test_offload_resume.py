"""memwall.torch.offload(resume=...): a crash loses at most the step in flight, and the resumed
session continues bitwise (docs/python.md, "Resume"; issue 25 item 4).

- kill -9 anywhere: a child process (offload_child.py: a small random LlamaForCausalLM, weights
  streamed, the optimizer on NVMe, accumulation 2) is killed with SIGKILL right after a step() returned
  (its update running behind the next forward pass), in the middle of a forward pass, and at two
  instants drawn from a seeded generator (a line of the child's output, then a delay of up to a line's
  time: forward, backward, update or commit); each kill is resumed with resume=True until the run reaches N steps. Every
  loss any segment printed equals the uninterrupted run's at that step and micro-batch, bit for bit;
  every resume starts at most one step behind the last step() that returned; the final weights are
  the uninterrupted run's, bit for bit.
- Resident weights with the optimizer on NVMe resume too: the weights come from the committed master.
- Refusals: resume=True with nothing committed, resume=False over a committed state (naming its step),
  another model description (the digest), another placement, a corrupt object (named).
- An EIO injected on a unit's read (MEMWALL_FAULT): an OSError naming the unit's module, and nothing
  committed: a resume finds the step before, and continues bitwise.
- The trace (trace=PATH) goes to `memwall report` with one residency lane per unit, named.
"""
import gc
import os
import random
import signal
import shutil
import subprocess
import sys
import time

import pytest
import torch

import offload_child as child
from memwall._lib import MemwallError
from conftest import HERE, ROOT

pytest.importorskip("transformers")

N = 6


def reference(tmp_path, n=N, trace=None):
    """The uninterrupted run in this process: its printed lines, final weights and training seconds."""
    lines = []
    model = child.make_model()
    off = child.open_offload(model, str(tmp_path / "ref"), trace=trace)
    t0 = time.monotonic()
    child.train(model, off, n, lines.append)
    train_s = time.monotonic() - t0
    final = {k: v.clone() for k, v in model.state_dict().items()}
    off.close()
    return lines, final, train_s


def losses_of(lines):
    return {tuple(map(int, x.split()[1:3])): x.split()[3] for x in lines if x.startswith("loss ")}


def run_child(nvme, out, mode, kill=None):
    """Runs offload_child.py; kill(line, proc) -> True kills it with SIGKILL after that line (after_random's
    tuple: the child kills itself). Returns
    (lines, returncode, stderr)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([HERE, os.path.join(ROOT, "python"), env.get("PYTHONPATH", "")])
    if isinstance(kill, tuple):  # after_random: the child kills itself
        env["MEMWALL_TEST_KILL"] = f"{kill[1]},{kill[2]}"
        kill = None
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "offload_child.py"), str(nvme), str(N), str(out), mode],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines = []
    for line in p.stdout:  # every line the child printed, those after the kill's too (a loaded machine
        lines.append(line.strip())  # may read the kill's line late, the child a step further on)
        if kill is not None and kill(lines[-1], p):
            p.send_signal(signal.SIGKILL)
            kill = None
    p.stdout.close()
    err = p.stderr.read()
    p.stderr.close()
    return lines, p.wait(), err


def after_line(prefix):
    return lambda line, p: line.startswith(prefix)


def after_random(rng, line_s):
    """A kill at an instant drawn from rng: after a line drawn among those the child has still to print
    (all but the last step's), plus a delay drawn up to a line's time: anywhere in a step, its forward,
    backward, update or commit, and never after the run's last step. The child times it itself
    (offload_child.py, MEMWALL_TEST_KILL) from its own pace: a reader on a loaded machine reads the
    lines late, and a kill timed from them (or from the reference's pace, line_s, which includes its
    cold first step) let the run end first."""
    del line_s
    return ("child", rng.random(), rng.random())


def test_kill_anywhere_resumes_bitwise(tmp_path):
    ref_lines, ref_final, train_s = reference(tmp_path)
    ref_losses = losses_of(ref_lines)
    assert len(ref_losses) == N * child.ACCUM
    rng = random.Random(25)
    nvme, out = tmp_path / "nvme", tmp_path / "out.pt"
    # The first kill lands right after step() 2 returned: its update runs behind step 3's forward.
    # Then inside a forward pass (after a micro-batch's loss), then at two instants drawn from the seed.
    line_s = train_s / (N * (1 + child.ACCUM))
    kills = [after_line("stepped 2"), after_line("loss 3 0"), after_random(rng, line_s), after_random(rng, line_s)]
    mode, seen, segments = "fresh", {}, []
    for kill in kills + [None]:
        lines, rc, err = run_child(nvme, out, mode, kill)
        assert lines and lines[0].startswith("start"), err
        start = int(lines[0].split()[1])
        segments.append((start, rc))
        if mode == "resume":  # at most the step in flight is lost
            assert last_stepped - 1 <= start <= last_stepped, (start, last_stepped, segments)
        for key, bits in losses_of(lines).items():
            assert bits == ref_losses[key], (key, bits, ref_losses[key], segments)
            seen[key] = bits
        stepped = [int(x.split()[1]) for x in lines if x.startswith("stepped")]
        last_stepped = stepped[-1] if stepped else start
        if kill is None or rc == 0:
            assert rc == 0 and lines[-1] == "done", err
            break
        assert rc == -signal.SIGKILL, (rc, err, segments)
        assert (nvme / "memwall-offload.commit").exists()
        mode = "resume"
    assert seen == ref_losses  # every step ran, and ran right, in some segment
    final = torch.load(out)
    for k, v in ref_final.items():
        assert torch.equal(final[k].view(torch.int32), v.view(torch.int32)), k
    assert sum(1 for s, rc in segments if rc == -signal.SIGKILL) >= 3, segments
    print("segments (start step, exit status):", segments)
    # The finished run (close() without keep) removed its committed state.
    assert not (nvme / "memwall-offload.commit").exists()


def open_after(tmp_path, steps, **kw):
    """A session on tmp_path/'s' trained `steps` steps and closed with its state kept."""
    model = child.make_model()
    off = child.open_offload(model, str(tmp_path / "s"), **kw)
    child.train(model, off, steps, lambda line: None)
    off.close(keep=True)
    return str(tmp_path / "s")


def test_refusals(tmp_path):
    import memwall.torch as mt
    import transformers as T
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        child.open_offload(child.make_model(), str(tmp_path / "empty"), resume=True)
    d = open_after(tmp_path, 2)
    with pytest.raises(MemwallError, match=r"committed state of an earlier session \(step 2\)"):
        child.open_offload(child.make_model(), d)
    # Another model: one layer more.
    torch.manual_seed(0)
    cfg = T.LlamaConfig(vocab_size=child.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                        tie_word_embeddings=True)
    with pytest.raises(MemwallError, match="another model description"):
        child.open_offload(T.LlamaForCausalLM(cfg), d, resume=True)
    # The same model cut into other units (the embeddings and the first block one unit).
    m = child.make_model()
    units = [[m.model.embed_tokens, m.model.layers[0]], m.model.layers[1], m.model.layers[2],
             [m.model.norm]]
    with pytest.raises(MemwallError, match="another model description"):
        mt.offload(m, nvme_dir=d, units=units, grad_accum=child.ACCUM, prefetch=1, subgroup_size=4096, threads=1,
                   resume=True)
    # Another placement: the weights resident.
    with pytest.raises(MemwallError, match="weights streamed"):
        mt.offload(child.make_model(), nvme_dir=d, weights="dram", optimizer="nvme", grad_accum=child.ACCUM,
                   subgroup_size=4096, threads=1, resume=True)
    # resume=True needs the optimizer on NVMe.
    with pytest.raises(MemwallError, match="optimizer state on NVMe"):
        mt.offload(child.make_model(), nvme_dir=d, weights="dram", optimizer="dram", resume=True)
    # The refusals left the state as it was: it resumes at step 2 ("auto" too; the subgroup size the
    # record's when none is given).
    model = child.make_model()
    off = mt.offload(model, nvme_dir=d, grad_accum=child.ACCUM, threads=1, resume="auto")
    assert off.steps == 2 and off.resumable
    off.close(keep=True)
    del off, model
    gc.collect()
    # A corrupt object of the committed slot: refused, naming it.
    dat = os.path.join(d, "memwall-offload.0.dat")
    with open(dat, "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0x40]))
    with pytest.raises(Exception, match="does not hold what was committed|checksum|corrupt"):
        child.open_offload(child.make_model(), d, resume=True)


def test_resume_with_resident_weights(tmp_path):
    """Resident weights, the optimizer on NVMe (the update behind the next forward): the resumed
    session's weights come from the committed master, not from the model it was given."""
    ref_lines, ref_final, _ = reference(tmp_path, 4)  # streamed: bitwise the resident run (test_offload.py)
    open_after(tmp_path, 2, weights="dram")
    gc.collect()
    model = child.make_model()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)  # whatever the model holds is replaced by the committed weights
    off = child.open_offload(model, str(tmp_path / "s"), resume=True, weights="dram")
    assert off.steps == 2
    lines = []
    child.train(model, off, 4, lines.append)
    ref_losses = losses_of(ref_lines)
    assert losses_of(lines) == {k: v for k, v in ref_losses.items() if k[0] >= 2}
    for k, v in model.state_dict().items():
        assert torch.equal(v.view(torch.int32), ref_final[k].view(torch.int32)), k
    off.close()
    assert not os.path.exists(tmp_path / "s" / "memwall-offload.commit")


def test_eio_on_a_unit_read(tmp_path, monkeypatch):
    """After 2 steps the session is reopened with MEMWALL_FAULT set so that the first read after the
    reopen's own (the committed state, one piece per subgroup) that reaches a block's weights fails:
    with no update behind the forward pass, the reads of step 3 are the units' fetches in order."""
    ref_lines, ref_final, _ = reference(tmp_path, 4)
    d = open_after(tmp_path, 2)
    gc.collect()
    model = child.make_model()
    n_params = sum(p.numel() for p in model.parameters())
    S = 4096
    nsg = -(-n_params // S)
    end_1 = model.model.embed_tokens.weight.numel() + sum(p.numel() for p in model.model.layers[0].parameters())
    before = nsg + -(-end_1 // S)  # the restore's reads, then units 0 and 1's subgroups
    monkeypatch.setenv("MEMWALL_FAULT", f"read:eio:after={before}:count=1")
    off = child.open_offload(model, d, resume=True)
    assert off.steps == 2
    with pytest.raises(OSError) as e:
        child.train(model, off, 4, lambda line: None)
    msg = str(e.value)
    assert e.value.errno == 5 and "'model.layers.1'" in msg and "injected by MEMWALL_FAULT" in msg, msg
    assert "fetching the weights" in msg, msg
    off.close(restore=False)  # unusable after the error: its committed state stays
    del off, model, e  # the traceback's frames hold the forward's graph, which views the session's weights
    gc.collect()
    monkeypatch.delenv("MEMWALL_FAULT")
    model = child.make_model()
    off = child.open_offload(model, d, resume=True)
    assert off.steps == 2  # nothing of step 3 was committed
    lines = []
    child.train(model, off, 4, lines.append)
    ref_losses = losses_of(ref_lines)
    for key, bits in losses_of(lines).items():
        assert bits == ref_losses[key], key
    for k, v in model.state_dict().items():
        assert torch.equal(v.view(torch.int32), ref_final[k].view(torch.int32)), k
    off.close()


def test_trace_goes_to_memwall_report(tmp_path):
    path = tmp_path / "run" / "trace.json"
    reference(tmp_path, 3, trace=str(path))
    import json
    with open(path) as f:
        tr = json.load(f)
    md = tr["metadata"]
    names = ["model.embed_tokens", "model.layers.0", "model.layers.1", "model.layers.2", "model.norm"]
    assert md["units"] == str(len(names)) and [md[f"unit.{u}.name"] for u in range(len(names))] == names, md
    fetched = {e["args"].get("unit") for e in tr["traceEvents"] if e.get("cat") == "residency"
               and e.get("name") == "resident"}
    assert fetched == set(range(len(names))), fetched
    cli = os.environ.get("MW_CLI") or shutil.which("memwall") or os.path.join(ROOT, "build", "memwall")
    if not os.path.exists(cli):
        pytest.fail(f"no memwall CLI to read the trace at {cli} (make build; CTest sets MW_CLI)")
    html = tmp_path / "report.html"
    r = subprocess.run([cli, "report", "--text", "--output", str(html), str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "weight residency: 5 units" in r.stdout, r.stdout
    for u, n in enumerate(names):  # the per-unit table: one row per unit, named
        assert any(line.split()[:2] == [str(u), n] for line in r.stdout.splitlines()), (n, r.stdout)
    page = html.read_text()
    assert all(n in page for n in names)
