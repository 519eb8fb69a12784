"""memwall.torch.offload of a model on a device (python/memwall/_device.py; docs/python.md "Whole-state
offload on a GPU"; issue 25 item 5): each unit copied from the session's host arrays to the device at its
acquire and freed at its release, the gradients copied back and added into the session's.

Without a GPU the copy path runs with the CPU as the device (MEMWALL_OFFLOAD_DEVICE_SIM=1: separate
device buffers and the same code, staging and copies, without the CUDA calls: streams, events, pinning):
- The device path == the plain CPU path, bitwise: small random-initialised LlamaForCausalLM (tied head:
  the alias of the head) and Qwen2ForCausalLM (untied) trained 5 steps of 4 micro-batches with clipping
  and an evaluation pass, loaded back to their first weights (model.load_state_dict) and stepped once
  more, weights streamed and resident: the same losses, gradient norms, evaluation loss and weights;
  every unit use went through a copy (counted), one unit's weights on the device at a time, and after
  close() the parameters are ordinary tensors with the trained values. Again with 1000-element staging
  buffers (units copied in pieces both ways).
- With activations on NVMe: the same, bitwise, and the spill store wrote exactly what it writes on the
  CPU path (the weights' saved views are the device hook's, never spilled).
- What forward saves of a weight does not hold its unit's device buffer (F.linear saves weight.t(), a
  view: without the pack hook every unit would stay on the device until backward); torch behaves as
  the design assumes (a saved leaf sees a new p.data, a saved view does not).
- A toy model with one-element parameters, saved views, buffers, int64 and bool tensors: bitwise too.
- A weight unpacked while its unit is not acquired is an error naming the unit; a parameter replaced
  by the user is refused at the next forward.
On a GPU (skipped here, with the reason; scripts/gpu_check.sh runs them): the CUDA run against the CPU
run (losses within 1e-4 relative, gradient norms within 1e-3, the trained weights' change within 1 %),
the peak device memory (torch.cuda.memory_allocated) over a streamed step of a 16-block model below
(prefetch + 2) units' weights plus two units' gradients and one unit for its activations, and at most
prefetch + 2 unit buffers alive; parameters on two devices refused.
"""
import contextlib
import os

import pytest
import torch

import memwall.torch as mt
from memwall import _device

transformers = pytest.importorskip("transformers")

VOCAB, STEPS, ACCUM, LR, WD, BETAS, EPS = 128, 5, 4, 2e-3, 0.1, (0.9, 0.95), 1e-8
CLIPS = (0.5, 100.0)  # by step: clipping acts at even steps, not at odd ones
SMALL = mt.NvmeActivations(min_bytes=1024, prefetch=3)  # tiny models: most saved tensors are above 1 KiB
NO_CUDA = "no CUDA device (torch.cuda.is_available() is False); scripts/gpu_check.sh runs this on a GPU"


def make(kind, layers=3, hidden=64, inter=128):
    T = transformers
    torch.manual_seed(0)
    if kind == "llama":
        cfg = T.LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                            tie_word_embeddings=True)
        return T.LlamaForCausalLM(cfg)
    cfg = T.Qwen2Config(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                        tie_word_embeddings=False, use_sliding_window=False)
    return T.Qwen2ForCausalLM(cfg)


def batches(n, seed=1, shape=(2, 16)):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, shape, generator=g) for _ in range(n)]


def bits(x):
    return x.view(torch.int32) if x.dtype == torch.float32 else x


@contextlib.contextmanager
def simulated(on):
    """MEMWALL_OFFLOAD_DEVICE_SIM=1 while offload() is called (it decides there); the plain CPU path without
    its lean head and embedding (MEMWALL_OFFLOAD_LEAN=0: _offload.py's design note), whose rounding the
    device path does not share."""
    old = {k: os.environ.pop(k, None) for k in (_device.SIM_ENV, "MEMWALL_OFFLOAD_LEAN")}
    os.environ["MEMWALL_OFFLOAD_LEAN"] = "0"
    if on:
        os.environ[_device.SIM_ENV] = "1"
    try:
        yield
    finally:
        for k, v in old.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v


def train(kind, tmp_path, tag, *, weights="nvme", activations="dram", sim=False, device="cpu"):
    model = make(kind).to(device)
    start = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    with simulated(sim):
        off = mt.offload(model, nvme_dir=tmp_path / tag, weights=weights, activations=activations, grad_accum=ACCUM,
                         prefetch=1, subgroup_size=4096, threads=1)
    dev = off._dev
    assert (dev is not None) == (sim or device != "cpu"), "the device path was not taken (or taken on the CPU path)"
    opt = off.optimizer(lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    data = [x.to(device) for x in batches((STEPS + 1) * ACCUM + 1)]
    losses, norms, evals = [], [], []

    def step(t):
        for a in range(ACCUM):
            x = data[t * ACCUM + a]
            loss = model(input_ids=x, labels=x).loss
            (loss / ACCUM).backward()
            losses.append(loss.item())
            if dev is not None:  # the gradients are the session's now; no unit is on the device
                assert all(p.grad is None for p in model.parameters()), "a device gradient outlived its unit"
                assert dev.live_units() == 0, f"{dev.live_units()} unit buffers alive after backward"
        norms.append(mt.clip_grad_norm_(model.parameters(), CLIPS[t % 2]).item())
        opt.step()
        opt.zero_grad()

    for t in range(STEPS):
        step(t)
        if t == 2:  # an evaluation pass between steps (the update may still run behind it)
            with torch.no_grad():
                evals.append(model(input_ids=data[-1], labels=data[-1]).loss.item())
    trained = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    model.load_state_dict(start)  # back to the first weights (the moments stay), then one more step
    reloaded = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    step(STEPS)
    final = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    figures = None
    if dev is not None:
        fwd, bwd = off.schedule
        passes = (STEPS + 1) * ACCUM
        figures = dict(units_in=dev.units_in, expect_in=passes * (len(fwd) + len(bwd)) + len(fwd),
                       bytes_out=dev.bytes_out, peak_units=dev.peak_units,
                       n_params=sum(n for _, n in off.units))
    acts = off._acts.stats() if off._acts is not None else None
    off.close()
    for k, v in model.state_dict().items():  # the model trains on without memwall, where it was
        assert v.device.type == torch.device(device).type, f"{k} is on {v.device} after close()"
        assert torch.equal(v.cpu(), final[k]), k
    return dict(losses=losses, norms=norms, evals=evals, trained=trained, reloaded=reloaded, final=final,
                start=start, dev=figures, acts=acts)


def assert_bitwise(run, ref, name):
    assert len(run["losses"]) == (STEPS + 1) * ACCUM
    assert run["losses"] == ref["losses"], f"{name}: losses differ: {run['losses'][:4]} vs {ref['losses'][:4]}"
    assert run["norms"] == ref["norms"], f"{name}: gradient norms differ: {run['norms']} vs {ref['norms']}"
    assert run["evals"] == ref["evals"], f"{name}: evaluation loss differs"
    for what in ("trained", "reloaded", "final"):
        assert run[what].keys() == ref[what].keys()
        for k in ref[what]:
            assert torch.equal(bits(run[what][k]), bits(ref[what][k])), f"{name}: {what} {k} differs"
    for k in ref["start"]:
        assert torch.equal(run["reloaded"][k], run["start"][k]), f"{name}: load_state_dict did not restore {k}"


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_device_path_equals_cpu_path(kind, tmp_path):
    for weights in ("nvme", "dram"):
        ref = train(kind, tmp_path, f"cpu-{weights}", weights=weights)
        run = train(kind, tmp_path, f"sim-{weights}", weights=weights, sim=True)
        assert_bitwise(run, ref, f"{kind}, weights {weights}, device path on the CPU")
        assert min(ref["norms"]) > CLIPS[0] and max(ref["norms"]) < CLIPS[1], ref["norms"]  # clipping acted, once
        d = run["dev"]
        assert ref["dev"] is None
        # Every use of a unit (forward and backward runs of each micro-batch, the evaluation's forward) copied
        # it to the device; every gradient came back (a unit's gradients once per micro-batch at least).
        assert d["units_in"] == d["expect_in"], d
        assert d["bytes_out"] >= 4 * d["n_params"] * (STEPS + 1) * ACCUM, d
        assert d["peak_units"] == 1, d  # one unit's weights on the device at a time (no prefetch to the device)


def test_device_path_in_pieces(tmp_path, monkeypatch):
    """Staging buffers of 1000 elements: every block's weights and gradients go through them in pieces (the
    final norm's 64 in one), bitwise as the plain CPU path."""
    ref = train("llama", tmp_path, "cpu", weights="nvme")
    monkeypatch.setattr(_device.DeviceUnits, "CHUNK", 1000)
    run = train("llama", tmp_path, "sim", weights="nvme", sim=True)
    assert_bitwise(run, ref, "llama, streamed, device path on the CPU in 1000-element pieces")
    assert run["dev"]["units_in"] == run["dev"]["expect_in"], run["dev"]


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_device_path_with_activations_on_nvme(kind, tmp_path):
    ref = train(kind, tmp_path, "cpu-dram", weights="nvme")
    spill = train(kind, tmp_path, "cpu-acts", weights="nvme", activations=SMALL)
    run = train(kind, tmp_path, "sim-acts", weights="nvme", activations=SMALL, sim=True)
    assert_bitwise(run, ref, f"{kind}, streamed, activations on NVMe, device path on the CPU")
    a, b = run["acts"], spill["acts"]
    assert a["puts"] >= 10 * (STEPS + 1) * ACCUM and a["bytes_written"] > 0, a
    # The same tensors went to NVMe as on the CPU path: the weights' saved views (device buffers here) were
    # the device hook's, not spilled; everything else was.
    assert (a["puts"], a["bytes_written"]) == (b["puts"], b["bytes_written"]), (a, b)
    assert a["live_bytes"] == 0


def test_device_path_on_a_toy_model(tmp_path):
    """test_offload_acts.py's toy: parameters of one element (out.bias) and of shape (1, d), a buffer saved
    by a mul, transposed, strided and shared views saved, int64 and bool tensors; activations in DRAM and
    on NVMe: bitwise the plain CPU path."""
    from test_offload_acts import _Toy
    g = torch.Generator().manual_seed(5)
    data = [torch.randn(4, 32, 64, generator=g) for _ in range(6)]
    out = {}
    for sim in (False, True):
        for acts in ("dram", SMALL):
            m = _Toy()
            with simulated(sim):
                off = mt.offload(m, nvme_dir=tmp_path / f"{sim}-{acts is SMALL}", weights="nvme", grad_accum=2,
                                 threads=1, subgroup_size=4096, activations=acts)
            assert (off._dev is not None) == sim
            opt = off.optimizer(lr=1e-2)
            losses = []
            for s in range(3):
                for a in range(2):
                    loss = m(data[2 * s + a])
                    (loss / 2).backward()
                    losses.append(loss.item())
                opt.step()
            out[sim, acts is SMALL] = (losses, {k: v.clone() for k, v in m.state_dict().items()})
            off.close()
    ref_losses, ref_w = out[False, False]
    for key, (losses, w) in out.items():
        assert losses == ref_losses, f"(device path, activations on NVMe) = {key}: losses differ"
        assert all(torch.equal(bits(w[k]), bits(ref_w[k])) for k in ref_w), f"{key}: weights differ"


def test_saved_weights_do_not_hold_the_device(tmp_path, monkeypatch):
    """After a training forward, before its backward, no unit's buffer is alive: what autograd saved of
    the weights are handles. Without the pack hook they would all be (F.linear saves weight.t())."""
    def forward_then_count(tag):
        model = make("llama", layers=4)
        with simulated(True):
            off = mt.offload(model, nvme_dir=tmp_path / tag, weights="nvme", prefetch=1, threads=1)
        x = batches(1)[0]
        loss = model(input_ids=x, labels=x).loss
        alive = off._dev.live_units()
        placeholders = all(off._dev.is_placeholder(p.data) for p in model.parameters())
        loss.backward()
        off.close(restore=False)
        return alive, placeholders

    alive, placeholders = forward_then_count("hooked")
    assert alive == 0, f"{alive} unit buffers held by the autograd graph between forward and backward"
    assert placeholders, "a parameter holds device memory outside its unit's use"
    monkeypatch.setattr(_device.DeviceUnits, "pack", lambda self, t, nxt=None: t if nxt is None else nxt(t))
    monkeypatch.setattr(_device.DeviceUnits, "unpack", lambda self, x, nxt=None: x if nxt is None else nxt(x))
    alive, _ = forward_then_count("unhooked")
    assert alive >= 4, f"without the pack hook only {alive} unit buffers stayed alive: is the hook still needed?"


def test_torch_saves_leaves_and_views_as_the_design_assumes():
    """A leaf saved for backward is the variable itself (a new p.data is seen by backward); a view of it
    (F.linear's weight.t()) holds the old storage. The device path relies on neither: its pack hook turns
    both into handles over the unit's current buffer. This pins down torch's behaviour it works around."""
    x = torch.randn(3, 4, requires_grad=True)
    w = torch.nn.Parameter(torch.randn(4))
    y = (x * w).sum()
    new = torch.randn(4)
    w.data = new
    y.backward()
    assert torch.equal(x.grad, new.expand(3, 4)), "a saved leaf did not see its new .data"
    x.grad = None
    lin = torch.nn.Parameter(torch.randn(5, 4))
    old = lin.detach().clone()
    y = torch.nn.functional.linear(x, lin).sum()
    lin.data = torch.randn(5, 4)
    y.backward()
    assert torch.equal(x.grad, old.sum(0).expand(3, 4)), "F.linear's saved weight view followed the new .data"


def test_unpack_outside_its_unit_is_an_error():
    ps = [torch.nn.Parameter(torch.zeros(2, 3)), torch.nn.Parameter(torch.zeros(4))]
    flat_p = torch.arange(10, dtype=torch.float32)
    dev = _device.DeviceUnits("cpu", [ps], [(0, 10)], flat_p, torch.zeros(10), {}, ["model.layers.0"])
    dev.park()
    assert all(dev.is_placeholder(p.data) and p.shape == s for p, s in zip(ps, [(2, 3), (4,)]))
    dev.acquire(0)
    assert torch.equal(ps[1].detach(), torch.tensor([6.0, 7, 8, 9]))
    handle = dev.pack(ps[0].t())
    assert torch.equal(dev.unpack(handle), flat_p[:6].view(2, 3).t())
    dev.release(0)
    with pytest.raises(RuntimeError, match=r"unit 'model\.layers\.0' while that unit is not acquired"):
        dev.unpack(handle)
    assert dev.unpack(handle if False else 5) == 5  # not a handle: passed through


def test_replaced_parameter_is_refused(tmp_path):
    model = make("qwen2")
    with simulated(True):
        off = mt.offload(model, nvme_dir=tmp_path / "r", weights="dram", threads=1)
    x = batches(1)[0]
    with torch.no_grad():
        model(input_ids=x)
    p = model.model.layers[1].mlp.up_proj.weight
    assert p.shape == (128, 64) and off._dev.is_placeholder(p.data)
    p.data = torch.zeros(128, 64)
    with pytest.raises(RuntimeError, match=r"'model\.layers\.1\.mlp\.up_proj\.weight' is not the session's"):
        model(input_ids=x)
    off.close(restore=False)
    assert p.numel() == 0


# ---------------------------------------------------------------------------------------------- on a GPU

def _close(a, b, rel):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("weights,acts", [("nvme", "dram"), ("dram", "dram"), ("nvme", "nvme")])
def test_cuda_matches_cpu(kind, weights, acts, tmp_path):
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 products on the GPU, as on the CPU
    ref = train(kind, tmp_path, "cpu", weights=weights)
    ctx = pytest.warns(RuntimeWarning, match="stay on the device") if acts == "nvme" else contextlib.nullcontext()
    with ctx:
        run = train(kind, tmp_path, "cuda", weights=weights, activations=SMALL if acts == "nvme" else "dram",
                    device="cuda")
    name = f"{kind}, weights {weights}, activations {acts}, CUDA against the CPU"
    assert len(run["losses"]) == len(ref["losses"])
    for i, (a, b) in enumerate(zip(run["losses"], ref["losses"])):
        assert _close(a, b, 1e-4), f"{name}: loss {i}: {a} vs {b}"
    for i, (a, b) in enumerate(zip(run["norms"], ref["norms"])):
        assert _close(a, b, 1e-3), f"{name}: gradient norm {i}: {a} vs {b}"
    assert _close(run["evals"][0], ref["evals"][0], 1e-4), name
    for k in ref["final"]:
        moved = (ref["final"][k] - ref["start"][k]).norm().item()
        diff = (run["final"][k] - ref["final"][k]).norm().item()
        assert diff <= 0.01 * moved + 1e-6, f"{name}: {k}: {diff} apart after training moved it {moved}"
    d = run["dev"]
    assert d["units_in"] == d["expect_in"] and d["peak_units"] == 1, d
    _figure(f"offload cuda {kind} weights={weights} activations={acts}: max loss rel diff "
            f"{max(abs(a - b) / abs(b) for a, b in zip(run['losses'], ref['losses'])):.2e}, "
            f"{d['units_in']} unit copies in, {d['bytes_out'] / 2**20:.1f} MiB of gradients out")


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_cuda_weights_on_the_device_are_bounded(tmp_path):
    """torch.cuda.memory_allocated through a streamed step of a 16-block model whose weights dominate (batch
    1 x 8): the peak above the start stays under (prefetch + 2) units' weights plus two units' gradients
    plus the activations (at most one unit's worth here), far under the 16 units a resident model holds."""
    prefetch = 1
    model = make("qwen2", layers=16, hidden=256, inter=1024).cuda()
    torch.cuda.synchronize()
    off = mt.offload(model, nvme_dir=tmp_path / "m", weights="nvme", prefetch=prefetch, grad_accum=1, threads=2)
    unit = max(n for _, n in off.units[1:-1]) * 4  # a block's weights, bytes
    total = sum(n for _, n in off.units) * 4
    opt = off.optimizer(lr=LR)
    x = batches(1, shape=(1, 8))[0].cuda()
    model(input_ids=x, labels=x).loss.backward()  # a first step: the allocator's pools made
    opt.step()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    model(input_ids=x, labels=x).loss.backward()
    opt.step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    bound = (prefetch + 2) * unit + 2 * unit + unit
    _figure(f"offload cuda memory: peak {peak / 2**20:.1f} MiB above the start over a streamed step; a unit "
            f"{unit / 2**20:.1f} MiB, the model {total / 2**20:.1f} MiB; bound {bound / 2**20:.1f} MiB; "
            f"peak unit buffers alive {off._dev.peak_units}")
    assert off._dev.peak_units <= prefetch + 2
    assert peak <= bound, f"{peak} bytes on the device above the start; bound {bound} (a unit: {unit})"
    assert bound < total, "the test's model is too small to tell"
    off.close(restore=False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_cuda_refuses_two_devices(tmp_path):
    model = make("qwen2").cuda()
    model.model.norm.cpu()
    with pytest.raises(ValueError, match=r"several devices .*'model\.norm\.weight' on cpu.*model\.to\(device\)"):
        mt.offload(model, nvme_dir=tmp_path / "two", threads=1)


def _figure(line):
    """A line for scripts/gpu_check.sh's figures (GPU_CHECK_FIGURES), and for pytest -s."""
    print(line)
    path = os.environ.get("GPU_CHECK_FIGURES")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")
