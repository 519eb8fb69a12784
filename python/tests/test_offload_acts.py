"""memwall.torch.offload(activations="nvme"): the tensors autograd saves in the model's forward on NVMe
(python/memwall/_activations.py over the C spill store, src/pyapi/pyacts.c; docs/python.md "Activations
on NVMe").

- Bitwise the same as activations in DRAM: small random-initialised LlamaForCausalLM (tied head),
  Qwen2ForCausalLM (untied) and GPT2LMHeadModel trained 5 steps of 4 micro-batches with clipping and
  an evaluation pass, the same memwall AdamW: weights resident with activations in DRAM (the
  reference) against weights streamed from NVMe with activations on NVMe, and resident weights with
  activations on NVMe: the same losses, gradient norms, evaluation loss and final weights, bit for bit.
  Tensors really went to NVMe and came back (bytes written and read), a storage saved twice was
  written once (the q/k/v projections' shared input), each micro-batch's set is freed after its
  backward (nothing live on NVMe between micro-batches), an evaluation pass under no_grad saves
  nothing.
- A saved activation is not held in DRAM between forward and backward (its tensor is freed), as it is
  with activations="dram".
- Views and dtypes, restored exactly: a model whose blocks save transposed and strided views, two
  views of one storage, a bool mask, large int64 gather indices and small ones, a view of a buffer
  (kept in DRAM: it lives anyway): bitwise the same gradients and weights.
- An exception in the middle of forward, and a training forward dropped without backward: the hooks
  are gone after it, nothing stays on NVMe, training goes on, close() removes the files.
- An EIO injected on an activation read (MEMWALL_FAULT): backward fails with a clear error naming the
  saved tensor, the offload refuses the step (nothing committed: the weights are those before it).
- Refusals: activations="nvme" without nvme_dir, bad NvmeActivations options.
- The hooks alone: a graph unpacked twice (retain_graph=True) gives torch's gradients bit for bit.
- A process that died mid-step left its activations' file: the next offload on the directory removes it.
"""
import gc
import os
import weakref

import pytest
import torch

import memwall.torch as mt
from memwall._activations import _Packed

transformers = pytest.importorskip("transformers")

from test_offload import ACCUM, BETAS, CLIPS, EPS, LR, STEPS, VOCAB, WD, batches, make  # noqa: E402,F401 (the same models)
SMALL = mt.NvmeActivations(min_bytes=1024, prefetch=3)  # tiny models: most saved tensors are above 1 KiB


def bits(x):
    return x.view(torch.int32) if x.dtype == torch.float32 else x


def train(kind, weights, activations, tmp_path):
    model = make(kind)
    off = mt.offload(model, nvme_dir=tmp_path / f"{weights}-{'nvme' if activations != 'dram' else 'dram'}",
                     weights=weights, grad_accum=ACCUM, prefetch=1, subgroup_size=4096, threads=1,
                     activations=activations)
    opt = off.optimizer(lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    data = batches(STEPS * ACCUM + 1)
    losses, norms, evals, live = [], [], [], []
    for t in range(STEPS):
        for a in range(ACCUM):
            x = data[t * ACCUM + a]
            loss = model(input_ids=x, labels=x).loss
            (loss / ACCUM).backward()
            losses.append(loss.item())
            if off._acts is not None:
                live.append(off._acts.stats()["live"])
        norms.append(mt.clip_grad_norm_(model.parameters(), CLIPS[t % 2]).item())
        opt.step()
        if t == 2:
            puts = off._acts.stats()["puts"] if off._acts is not None else 0
            with torch.no_grad():
                evals.append(model(input_ids=data[-1], labels=data[-1]).loss.item())
            if off._acts is not None:
                assert off._acts.stats()["puts"] == puts, "an evaluation pass saved tensors"
    final = {k: v.clone() for k, v in model.state_dict().items()}
    acts = off._acts.stats() if off._acts is not None else None
    where = off._acts.dir if off._acts is not None else None
    off.close()
    if where is not None:
        assert not os.path.exists(where), f"{where} left after close()"
    return dict(losses=losses, norms=norms, evals=evals, final=final, acts=acts, live=live)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gpt2"])
def test_nvme_activations_equal_dram(kind, tmp_path):
    ref = train(kind, "dram", "dram", tmp_path)
    for weights in ("nvme", "dram"):
        run = train(kind, weights, SMALL, tmp_path)
        name = f"weights {weights}, activations on NVMe"
        assert run["losses"] == ref["losses"], f"{name}: losses differ"
        assert run["norms"] == ref["norms"] and run["evals"] == ref["evals"], name
        assert run["final"].keys() == ref["final"].keys()
        for k in ref["final"]:
            assert torch.equal(bits(run["final"][k]), bits(ref["final"][k])), f"{name}: {k} differs"
        st = run["acts"]
        assert st["puts"] >= 10 * STEPS * ACCUM and st["bytes_written"] > 0, st
        assert st["bytes_read"] >= st["bytes_written"], st  # every one read back at least once
        assert run["live"] == [0.0] * (STEPS * ACCUM), "a micro-batch's activations outlived its backward"
        assert st["live_bytes"] == 0 and st["peak_live_bytes"] > 0, st
        assert st["direct"] in (0.0, 1.0) and st["staging_bytes"] == 32 << 20
        if kind != "gpt2":  # the normed input of q, k and v (and of gate and up): written once
            assert st["shared_packs"] >= 3 * 3 * STEPS * ACCUM, st
    assert ref["acts"] is None


def test_saved_tensor_not_held_in_dram(tmp_path):
    """The MLP's product (down_proj's input, saved by its matmul) is freed after forward when on NVMe."""
    for acts, held in (("dram", True), (SMALL, False)):
        m = make("llama")
        off = mt.offload(m, nvme_dir=tmp_path / str(held), weights="nvme", threads=1, activations=acts)
        seen = []
        h = m.model.layers[1].mlp.down_proj.register_forward_pre_hook(lambda mod, args: seen.append(
            weakref.ref(args[0])))
        x = batches(1)[0]
        loss = m(input_ids=x, labels=x).loss
        assert len(seen) == 1 and (seen[0]() is not None) == held, f"activations={acts}"
        loss.backward()
        assert seen[0]() is None
        h.remove()
        off.close()


class _Block(torch.nn.Module):
    """Saves a transposed view, a strided view, two views of one storage, a bool mask, large and small
    int64 indices."""

    def __init__(self, d):
        super().__init__()
        self.lin = torch.nn.Linear(d, d)
        self.lin2 = torch.nn.Linear(d // 2, d)
        self.register_buffer("gate", torch.rand(32, d))  # 8 KiB, saved by a mul: lives anyway, never spilled

    def forward(self, x):
        h = self.lin(x) * self.gate[: x.shape[1]]
        a = torch.tanh(h.transpose(1, 2)).transpose(1, 2)        # tanh saves its non-contiguous output
        m = a > 0
        b = torch.where(m, a, a * 0.5)                           # the bool mask
        idx = (b.abs() * 1000).long() % b.shape[-1]              # int64, 64 KiB
        g = torch.gather(b, -1, idx)
        small = torch.tensor([1, 0, 3, 2])                       # int64, 32 bytes: stays in DRAM
        g = g.index_select(-1, small.repeat(g.shape[-1] // 4) + torch.arange(g.shape[-1]) // 4 * 4)
        half = b[..., ::2]                                       # a strided view of b
        q, k = h[..., : h.shape[-1] // 2], h[..., h.shape[-1] // 2:]  # two views of h's storage
        c = self.lin2(half * g[..., : h.shape[-1] // 2] + q * k)
        return x + c


class _Toy(torch.nn.Module):
    def __init__(self, d=64, n=3):
        super().__init__()
        torch.manual_seed(3)
        self.inp = torch.nn.Linear(d, d)
        self.blocks = torch.nn.ModuleList([_Block(d) for _ in range(n)])
        self.out = torch.nn.Linear(d, 1)

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.out(x).pow(2).mean()


def test_views_and_dtypes_exact(tmp_path):
    g = torch.Generator().manual_seed(5)
    data = [torch.randn(4, 32, 64, generator=g) for _ in range(6)]
    out = {}
    for acts in ("dram", SMALL):
        m = _Toy()
        off = mt.offload(m, nvme_dir=tmp_path / str(acts is SMALL), weights="nvme", grad_accum=2, threads=1,
                         subgroup_size=4096, activations=acts)
        opt = off.optimizer(lr=1e-2)
        losses = []
        for s in range(3):
            for a in range(2):
                loss = m(data[2 * s + a])
                (loss / 2).backward()
                losses.append(loss.item())
            opt.step()
        st = off._acts.stats() if off._acts is not None else None
        if off._acts is not None:  # what the hooks do with a view of a buffer, and with an ordinary large tensor
            assert not isinstance(off._acts._pack(m.blocks[1].gate[2:]), _Packed)
            big = torch.randn(64, 64).exp()
            kept = off._acts._pack(big)
            assert isinstance(kept, _Packed)
            del kept
        out[acts is SMALL] = (losses, {k: v.clone() for k, v in m.state_dict().items()}, st)
        off.close()
    (l0, w0, _), (l1, w1, st) = out[False], out[True]
    assert l0 == l1
    assert all(torch.equal(bits(w0[k]), bits(w1[k])) for k in w0)
    assert st["puts"] > 0 and st["kept_bytes"] > 0 and st["shared_packs"] > 0, st


def test_exception_mid_forward(tmp_path):
    m = make("qwen2")
    off = mt.offload(m, nvme_dir=tmp_path, weights="nvme", threads=1, activations=SMALL)
    opt = off.optimizer(lr=1e-3)
    boom = {"on": True}

    def hook(mod, args):
        if boom["on"]:
            raise RuntimeError("boom in block 2")

    h = m.model.layers[2].register_forward_pre_hook(hook)
    x = batches(1)[0]
    with pytest.raises(RuntimeError, match="boom in block 2"):
        m(input_ids=x, labels=x)
    gc.collect()  # the traceback's frames (a cycle) held the partial graph
    st = off._acts.stats()
    assert st["puts"] > 0 and st["live"] == 0, st  # the partial graph went, and its objects with it
    y = torch.randn(256, 64, requires_grad=True)
    (y.exp() * 2).sum().backward()  # outside the model: the hooks are not active any more
    assert off._acts.stats()["puts"] == st["puts"]
    boom["on"] = False
    loss = m(input_ids=x, labels=x).loss  # a training forward dropped without backward: its graph frees them
    assert off._acts.stats()["live"] > 0
    del loss
    assert off._acts.stats()["live"] == 0
    loss = m(input_ids=x, labels=x).loss
    loss.backward()
    opt.step()
    assert off._acts.stats()["live"] == 0 and torch.isfinite(loss)
    where = off._acts.dir
    h.remove()
    off.close()
    assert not os.path.exists(where)


def test_eio_on_activation_read(tmp_path, monkeypatch):
    """Only the activations' store does I/O here (weights and optimizer in DRAM): its first read fails."""
    monkeypatch.setenv("MEMWALL_FAULT", "read:eio:after=0:count=1")
    m = make("llama")
    off = mt.offload(m, nvme_dir=tmp_path, weights="dram", optimizer="dram", threads=1, activations=SMALL)
    opt = off.optimizer(lr=1e-3)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    x = batches(1)[0]
    loss = m(input_ids=x, labels=x).loss
    with pytest.raises(OSError, match=r"reading a saved tensor .* back from NVMe failed: .*activations on NVMe: "
                                      r"reading saved tensor \d+ \(\d+ bytes\) back for the backward pass failed.*"
                                      r"MEMWALL_FAULT"):
        loss.backward()
    with pytest.raises(RuntimeError, match="unusable after an earlier error"):
        opt.step()
    after = m.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing committed
    del loss
    gc.collect()
    assert off._acts.stats()["live"] == 0  # the failed backward's graph went, its objects with it
    where = off._acts.dir
    off.close()
    assert not os.path.exists(where)
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())


def test_refusals(tmp_path):
    m = make("llama", layers=2)
    with pytest.raises(ValueError, match="nvme_dir= is needed with weights, optimizer state or activations"):
        mt.offload(m, weights="dram", optimizer="dram", activations="nvme")
    for bad in (dict(min_bytes=0), dict(prefetch=-1), dict(prefetch=65), dict(staging_bytes=1.5)):
        with pytest.raises(ValueError, match="activations"):
            mt.NvmeActivations(**bad)
    with pytest.raises(Exception, match="activations on NVMe: staging"):
        mt.offload(m, nvme_dir=tmp_path, weights="dram", activations=mt.NvmeActivations(chunk_bytes=4096))
    assert getattr(m, "_memwall_offload", None) is None  # refused before the model was touched
    off = mt.offload(m, nvme_dir=tmp_path, weights="dram", activations="nvme", threads=1)
    assert off._acts.opts.min_bytes == 64 << 10 and off._acts.dir == f"{tmp_path}/activations"
    off.close()


def test_spill_store_alone_retain_graph(tmp_path):
    """The hooks without an offload: a graph unpacked twice (retain_graph=True) reads its tensors from NVMe
    again and gives torch's gradients bit for bit; a storage saved by three ops is written once."""
    from memwall._activations import Spill

    def f(x, w):
        h = x @ w
        a = torch.sigmoid(h)                  # saves its output
        return (a * h).sum() + (h.t() @ a).pow(2).sum() + (h * 3).tanh().sum()

    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(128, 96, generator=g), torch.randn(96, 80, generator=g, requires_grad=True)
    f(x, w).backward(retain_graph=False)
    want, w.grad = w.grad.clone(), None
    sp = Spill(mt.NvmeActivations(min_bytes=1024, prefetch=2), tmp_path, [], lambda e: e)
    with torch.autograd.graph.saved_tensors_hooks(sp._pack, sp._unpack):
        y = f(x, w)
    st = sp.stats()
    assert st["live"] > 0 and st["shared_packs"] >= 3, st  # h by the mul and (as h.t()) the matmul; a by three
    y.backward(retain_graph=True)
    first = w.grad.clone()
    y.backward()
    assert torch.equal(first, want) and torch.equal(w.grad, 2 * want)
    assert sp.stats()["reads"] >= 2 * sp.stats()["puts"]
    del y
    assert sp.stats()["live"] == 0
    sp.close()
    assert not os.path.exists(tmp_path / "activations")


def test_files_of_a_killed_run_are_removed(tmp_path):
    """A process that dies mid-step (os._exit: no close, no atexit, as kill -9) leaves its activations' file;
    the next offload on the directory removes it and trains."""
    import subprocess
    import sys
    code = ("import sys, os, torch; sys.path.insert(0, sys.argv[2]); import memwall.torch as mt; "
            "from test_offload_acts import make, batches, SMALL; m = make('llama'); "
            "off = mt.offload(m, nvme_dir=sys.argv[1], weights='dram', optimizer='dram', threads=1, activations=SMALL); "
            "x = batches(1)[0]; loss = m(input_ids=x, labels=x).loss; "
            "assert off._acts.stats()['live'] > 0; os._exit(0)")
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(here, ".."), os.environ.get("PYTHONPATH", "")]))
    subprocess.run([sys.executable, "-c", code, str(tmp_path), here], check=True, env=env, timeout=300)
    assert os.path.exists(tmp_path / "activations" / "memwall-acts.0.dat")
    m = make("llama")
    off = mt.offload(m, nvme_dir=tmp_path, weights="dram", optimizer="dram", threads=1, activations=SMALL)
    opt = off.optimizer(lr=1e-3)
    x = batches(1)[0]
    m(input_ids=x, labels=x).loss.backward()
    opt.step()
    assert off._acts.stats()["puts"] > 0
    off.close()
    assert not os.path.exists(tmp_path / "activations")
