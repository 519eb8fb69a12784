"""bf16 and 8-bit moments against the C library's own AdamW kernel (memwall/optim.h, called
directly on flat arrays: a second path through the library that shares no code with the engine
or this package's bookkeeping), and every error case with its message."""
import ctypes
import os

import pytest
import torch

import memwall
import memwall.torch
from memwall import _lib
from conftest import THREADS, make_mlp

# memwall/optim.h, for the reference only
F32, BF16, Q8 = _lib.OPTIM_F32, _lib.OPTIM_BF16, _lib.OPTIM_Q8
Fmt, HP, Slice = _lib.OptimFormat, _lib.AdamwHP, _lib.OptimSlice


def kernel_step(fmt, hp, sl):
    ex = _lib.OptimExec(1, 0, 0)
    _lib.check(_lib.lib().mw_adamw_step(ctypes.byref(fmt), ctypes.byref(hp), ctypes.byref(sl), ctypes.byref(ex)),
               "mw_adamw_step")


@pytest.mark.parametrize("moments,code", [("bf16", BF16), ("8bit", Q8), ("fp32", F32)])
@pytest.mark.parametrize("state", ["dram", "nvme"])
def test_moments_match_the_c_kernel(moments, code, state, nvme_dir):
    shapes = [(37, 29), (333,), (4, 250)]  # 2406 elements: blocks of 256 straddle tensors
    g = torch.Generator().manual_seed(3)
    params = [torch.nn.Parameter(torch.randn(s, generator=g) * 0.1) for s in shapes]
    n = sum(p.numel() for p in params)
    master = torch.cat([p.detach().reshape(-1) for p in params]).clone()
    mb = {"bf16": 2 * n, "8bit": n, "fp32": 4 * n}[moments]
    m, v = torch.zeros(mb, dtype=torch.uint8), torch.zeros(mb, dtype=torch.uint8)
    nsc = -(-n // 256)
    ms, vs = torch.zeros(nsc), torch.zeros(nsc)
    opt = memwall.torch.AdamW(params, lr=1e-2, betas=(0.9, 0.98), eps=1e-7, weight_decay=0.1, state=state,
                              nvme_dir=nvme_dir, moment_dtype=moments, subgroup_size=512, threads=THREADS)
    fmt = Fmt(F32, code, 0)
    for t in range(1, 9):
        grads = [torch.randn(s, generator=g) for s in shapes]
        for p, gr in zip(params, grads):
            p.grad.copy_(gr)
        opt.param_groups[0]["lr"] = 1e-2 / t
        opt.step()
        flat_g = torch.cat([gr.reshape(-1) for gr in grads])
        hp = HP(1e-2 / t, 0.9, 0.98, 1e-7, 0.1, t, 1.0)
        sl = Slice(n, 0, master.data_ptr(), flat_g.data_ptr(), m.data_ptr(), v.data_ptr(),
                   ms.data_ptr() if code == Q8 else None, vs.data_ptr() if code == Q8 else None, None)
        kernel_step(fmt, hp, sl)
    got = torch.cat([p.detach().reshape(-1) for p in params])
    assert torch.equal(got.view(torch.int32), master.view(torch.int32))
    sd = opt.state_dict()
    if moments == "8bit":
        q = sd["memwall"]["groups"][0]
        assert torch.equal(q["exp_avg"], m) and torch.equal(q["exp_avg_sq"], v)
        assert torch.equal(q["exp_avg_scale"].view(torch.int32), ms.view(torch.int32))
        assert torch.equal(q["exp_avg_sq_scale"].view(torch.int32), vs.view(torch.int32))
    else:
        dt = torch.bfloat16 if moments == "bf16" else torch.float32
        got_m = torch.cat([sd["state"][i]["exp_avg"].reshape(-1) for i in range(3)])
        got_v = torch.cat([sd["state"][i]["exp_avg_sq"].reshape(-1) for i in range(3)])
        assert got_m.dtype == dt
        assert torch.equal(got_m.view(torch.uint8), m) and torch.equal(got_v.view(torch.uint8), v)
    assert m.any() and v.any()
    opt.close()


@pytest.mark.parametrize("dtype,wcode", [(torch.bfloat16, BF16), (torch.float16, 3)])
@pytest.mark.parametrize("state", ["dram", "nvme"])
def test_low_precision_params_match_the_c_kernel(dtype, wcode, state, nvme_dir):
    """bf16/fp16 parameters: the fp32 master is memwall's, the parameter is its rounding written
    in the same pass (the kernel's weights_out), gradients converted to fp32."""
    shapes = [(37, 29), (333,)]
    g = torch.Generator().manual_seed(4)
    params = [torch.nn.Parameter((torch.randn(s, generator=g) * 0.1).to(dtype)) for s in shapes]
    n = sum(p.numel() for p in params)
    master = torch.cat([p.detach().float().reshape(-1) for p in params])
    m, v = torch.zeros(4 * n, dtype=torch.uint8), torch.zeros(4 * n, dtype=torch.uint8)
    wout = torch.empty(n, dtype=dtype)
    opt = memwall.torch.AdamW(params, lr=1e-2, weight_decay=0.1, state=state, nvme_dir=nvme_dir,
                              subgroup_size=512, threads=THREADS)
    for t in range(1, 6):
        grads = [torch.randn(s, generator=g).to(dtype) for s in shapes]
        for p, gr in zip(params, grads):
            p.grad = gr.clone()
        opt.step()
        opt.zero_grad()
        assert all(p.grad is None for p in params)
        flat_g = torch.cat([gr.float().reshape(-1) for gr in grads])
        sl = Slice(n, 0, master.data_ptr(), flat_g.data_ptr(), m.data_ptr(), v.data_ptr(), None, None,
                   wout.data_ptr())
        kernel_step(Fmt(F32, F32, wcode), HP(1e-2, 0.9, 0.999, 1e-8, 0.1, t, 1.0), sl)
    got = torch.cat([p.detach().reshape(-1) for p in params])
    assert got.dtype == dtype and torch.equal(got.view(torch.int16), wout.view(torch.int16))
    sd = opt.state_dict()
    got_master = torch.cat([sd["state"][i]["master"].reshape(-1) for i in range(2)])
    assert torch.equal(got_master.view(torch.int32), master.view(torch.int32))
    assert not torch.equal(got_master, got.float())  # the master keeps what the parameter rounds away
    # resume: a fresh optimizer over parameters of other values gets the master and moments back
    params2 = [torch.nn.Parameter(torch.zeros(s, dtype=dtype)) for s in shapes]
    opt2 = memwall.torch.AdamW(params2, lr=1e-2, weight_decay=0.1, threads=THREADS)
    opt2.load_state_dict(sd)
    assert all(torch.equal(a, b) for a, b in zip(params2, params))  # the parameters round the master
    with torch.no_grad():  # a model state dict of the same values loaded afterwards changes nothing
        for a, b in zip(params2, params):
            a.copy_(b)
    for o, ps in ((opt, params), (opt2, params2)):
        for p in ps:
            p.grad = torch.ones_like(p)
        o.step()
    assert all(torch.equal(a, b) for a, b in zip(params2, params))
    s1, s2 = opt.state_dict(), opt2.state_dict()
    for i in range(2):
        for k in ("master", "exp_avg", "exp_avg_sq"):
            assert torch.equal(s1["state"][i][k], s2["state"][i][k])
    opt.close()


# ------------------------------------------------------------------------- errors

def mlp_opt(**kw):
    m = make_mlp()
    return m, memwall.torch.AdamW(m.parameters(), threads=THREADS, **kw)


@pytest.mark.parametrize("overlap", [False, True])
def test_sparse_gradients(overlap):
    """A sparse gradient autograd adds into memwall's dense gradient buffer is densified (the
    dense AdamW update, bitwise that of a dense embedding); one that replaces the buffer (after
    module.zero_grad(set_to_none=True)) is refused with a message."""
    res = []
    for sparse in (True, False):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(10, 4, sparse=sparse)
        opt = memwall.torch.AdamW(emb.parameters(), overlap=overlap)
        for _ in range(3):
            emb(torch.tensor([1, 2, 2])).square().sum().backward()
            opt.step()
            opt.zero_grad()
        res.append(emb.weight.detach().clone())
    assert torch.equal(res[0], res[1])
    emb.sparse = True
    emb.zero_grad(set_to_none=True)
    with pytest.raises(RuntimeError, match=r"does not support sparse gradients \(parameter 0 .*sparse=False"):
        emb(torch.tensor([1, 2])).sum().backward()
        opt.step()


def test_non_contiguous_gradient():
    m, opt = mlp_opt(overlap=False)
    w = m[0].weight
    w.grad = torch.randn(w.shape[1], w.shape[0]).t()
    with pytest.raises(RuntimeError, match=r"non-contiguous gradients \(parameter 0 of param group 0"):
        opt.step()


def test_nvme_dir_missing_or_absent(tmp_path):
    with pytest.raises(FileNotFoundError, match="nvme_dir .*nope.* does not exist.*mkdir -p"):
        mlp_opt(state="nvme", nvme_dir=str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="state='nvme' needs nvme_dir"):
        mlp_opt(state="nvme")


def test_budget_too_small(nvme_dir):
    with pytest.raises(memwall.MemwallError, match=r"dram.*(budget|need)"):
        mlp_opt(dram_budget=4096)
    with pytest.raises(memwall.MemwallError, match=r"nvme.*(budget|need)"):
        mlp_opt(state="nvme", nvme_dir=nvme_dir, nvme_budget=4096)
    assert os.listdir(nvme_dir) == []  # nothing left behind


def test_bad_arguments():
    with pytest.raises(TypeError, match="torch.float64; parameters must be torch.float32, torch.bfloat16 or "):
        memwall.torch.AdamW([torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))])
    with pytest.raises(TypeError, match="torch.bfloat16 but parameter 0 of the group is torch.float32; put"):
        memwall.torch.AdamW([torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))])
    with pytest.raises(ValueError, match="moment_dtype='fp8'"):
        mlp_opt(moment_dtype="fp8")
    with pytest.raises(ValueError, match="state='ssd'"):
        mlp_opt(state="ssd")
    with pytest.raises(ValueError, match="Invalid beta"):
        mlp_opt(betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="subgroup_size=0"):
        mlp_opt(subgroup_size=0)


def test_replaced_parameter_storage():
    m, opt = mlp_opt()
    m[0].weight.data = torch.zeros_like(m[0].weight)
    with pytest.raises(RuntimeError, match="storage of parameter 0 of param group 0 was replaced"):
        opt.step()


def test_overlap_misuse_is_reported():
    m, opt = mlp_opt(lr=1e-3)
    x = torch.randn(8, 24)
    for _ in range(2):  # probe step, then an overlapped one
        m(x).sum().backward()
        opt.step()
        opt.zero_grad()
    assert opt.stats()["overlap"]
    m(x).sum().backward()
    with pytest.raises(RuntimeError, match="zero_grad\\(\\) between backward\\(\\) and step\\(\\)"):
        opt.zero_grad()
    opt.param_groups[0]["lr"] = 5e-4  # changed after backward: the update already ran with 1e-3
    with pytest.raises(RuntimeError, match="lr/betas/eps/weight_decay changed between backward\\(\\) and step\\(\\)"):
        opt.step()
    assert not opt.stats()["overlap"]  # and it turned itself off
    m2, opt2 = mlp_opt()
    for _ in range(2):
        m2(x).sum().backward()
        opt2.step()
        opt2.zero_grad()
    m2(x).sum().backward()
    with pytest.raises(RuntimeError, match="2 backward\\(\\) calls before step\\(\\), but the first step had 1"):
        m2(x).sum().backward()


def test_load_state_dict_mismatch():
    m, opt = mlp_opt(moment_dtype="bf16")
    m(torch.randn(2, 24)).sum().backward()
    opt.step()
    sd = opt.state_dict()
    _, opt32 = mlp_opt()
    with pytest.raises(ValueError, match="bf16 moments, this optimizer stores fp32"):
        opt32.load_state_dict(sd)
    _, opt_other = mlp_opt(moment_dtype="bf16")
    sd["param_groups"][0]["params"] = sd["param_groups"][0]["params"][:-1]
    with pytest.raises(ValueError, match="param group 0 has 5 parameters in the state dict, 6 in the optimizer"):
        opt_other.load_state_dict(sd)


def test_gradients_present_at_construction_are_kept():
    """A gradient already in p.grad when the optimizer is built moves into memwall's buffer."""
    ps = [torch.nn.Parameter(torch.ones(5, 3)), torch.nn.Parameter(torch.ones(4))]
    for p in ps:
        p.grad = torch.full_like(p, 0.5)
    opt = memwall.torch.AdamW(ps, lr=0.1, weight_decay=0.0, overlap=False)
    assert all(torch.equal(p.grad, torch.full_like(p, 0.5)) for p in ps)
    opt.step()
    # first AdamW step: p -= lr * g / (|g| + eps)
    assert all(torch.allclose(p, torch.full_like(p, 0.9)) for p in ps)


def test_optimizer_is_freed_without_close(nvme_dir):
    """The gradient hooks do not keep the optimizer alive: dropping it frees its engines and
    removes its NVMe state directories."""
    import gc
    m = make_mlp()
    opt = memwall.torch.AdamW(m.parameters(), state="nvme", nvme_dir=nvme_dir, threads=THREADS)
    m(torch.randn(4, 24)).sum().backward()
    opt.step()
    assert os.listdir(nvme_dir)
    del opt
    gc.collect()
    assert os.listdir(nvme_dir) == []
    m(torch.randn(4, 24)).sum().backward()  # the hooks of the dead optimizer are harmless
