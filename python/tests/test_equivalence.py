"""Bitwise properties of memwall.torch.AdamW: NVMe state == DRAM state, overlap == no overlap,
state_dict round trips and resumes, a failed NVMe write leaves a step that can be retried."""
import io
import os

import pytest
import torch

import memwall.torch
from conftest import (THREADS, assert_bitwise, batches, gpt_groups, make_gpt, make_mlp, mlp_groups, params_bits,
                      train, warmup_cosine)

LR = 3e-3


def state_tensors(opt):
    return sd_tensors(opt.state_dict())


def sd_tensors(sd):
    out = []
    for i in sorted(sd["state"]):
        s = sd["state"][i]
        out += [s[k] for k in ("exp_avg", "exp_avg_sq") if k in s]
    for g in sd["memwall"]["groups"]:
        out += [g[k] for k in sorted(g)]
    return out


def run_mlp(state, nvme_dir, moments, steps=25, **kw):
    m = make_mlp()
    opt = memwall.torch.AdamW(mlp_groups(m, LR), lr=LR, state=state, nvme_dir=nvme_dir, moment_dtype=moments,
                              threads=THREADS, **kw)
    train("mlp", m, opt, batches("mlp", steps), clip=0.05, accum=2, sched=warmup_cosine(opt, steps))
    return m, opt


@pytest.mark.parametrize("moments,striped", [("fp32", False), ("bf16", False), ("8bit", False), ("fp32", True)])
def test_nvme_bitwise_equals_dram(moments, striped, nvme_dir, tmp_path):
    m_d, o_d = run_mlp("dram", None, moments)
    dirs = nvme_dir
    if striped:  # two directories, "d1:d2": the store stripes over them
        (tmp_path / "d2").mkdir()
        dirs = f"{nvme_dir}:{tmp_path / 'd2'}"
    # Small subgroups and two staging buffers: many subgroups, some cut through tensors. (Striped:
    # one subgroup per group; the store refuses small subgroups striped over two files, "store
    # full", with the CLI too: `memwall bench offload --params 11520 --subgroup-size 1024
    # --tier nvme --nvme-dir a:b`, a store issue reported to the integrator.)
    m_n, o_n = run_mlp("nvme", dirs, moments, subgroup_size=None if striped else 1024, buffer_count=2)
    if striped:
        assert all(len(os.listdir(d)) == 3 for d in dirs.split(":"))  # one state directory per group in each
    s = o_n.stats()
    assert s["n_subgroups"] > (2 if striped else 10) and s["nvme_read_bytes"] > 0 and s["nvme_write_bytes"] > 0
    assert o_d.stats()["nvme_read_bytes"] == 0
    assert_bitwise(params_bits(m_n), params_bits(m_d))
    assert_bitwise(state_tensors(o_n), state_tensors(o_d))
    # and the run did train: the moments are not zero
    assert any(t.float().abs().sum() > 0 for t in state_tensors(o_d))


@pytest.mark.parametrize("state,dtype", [("dram", torch.float32), ("nvme", torch.float32),
                                         ("nvme", torch.bfloat16)])
def test_overlap_bitwise_equals_no_overlap(state, dtype, nvme_dir):
    """Free-running GPT with 2 micro-batches per step, no clipping: overlap engages from step 2."""
    steps = 12
    res = []
    for overlap in (True, False):
        m = make_gpt().to(dtype)
        opt = memwall.torch.AdamW(gpt_groups(m, LR), lr=LR, state=state, nvme_dir=nvme_dir, overlap=overlap,
                                  subgroup_size=2048, threads=THREADS)
        train("gpt", m, opt, batches("gpt", steps), accum=2, sched=warmup_cosine(opt, steps))
        assert opt.stats()["overlap"] is overlap
        res.append((params_bits(m), state_tensors(opt)))
        opt.close()
    assert_bitwise(res[0][0], res[1][0])
    assert_bitwise(res[0][1], res[1][1])


@pytest.mark.parametrize("save_state,load_state,moments", [
    ("dram", "dram", "fp32"), ("nvme", "dram", "fp32"), ("dram", "nvme", "8bit"), ("nvme", "nvme", "bf16")])
def test_state_dict_resume_bitwise(save_state, load_state, moments, tmp_path):
    d1, d2 = tmp_path / "a", tmp_path / "b"
    d1.mkdir()
    d2.mkdir()
    data = batches("gpt", 16)

    def make_opt(m, state, d):
        return memwall.torch.AdamW(gpt_groups(m, LR), lr=LR, state=state, nvme_dir=str(d), moment_dtype=moments,
                                   subgroup_size=1024, threads=THREADS)
    # one run of 16 steps
    m = make_gpt()
    opt = make_opt(m, save_state, d1)
    train("gpt", m, opt, data)
    full = (params_bits(m), state_tensors(opt))
    opt.close()
    # 8 steps, save both state dicts through torch.save, a fresh process-like start, 8 more
    m = make_gpt()
    opt = make_opt(m, save_state, d1)
    train("gpt", m, opt, data[:8])
    buf = io.BytesIO()
    torch.save({"model": m.state_dict(), "opt": opt.state_dict()}, buf)
    opt.close()
    buf.seek(0)
    ck = torch.load(buf)
    m2 = make_gpt(seed=5)  # different initial weights: everything must come from the checkpoint
    opt2 = make_opt(m2, load_state, d2)
    m2.load_state_dict(ck["model"])
    opt2.load_state_dict(ck["opt"])
    assert opt2.state_dict()["param_groups"] == ck["opt"]["param_groups"]
    assert_bitwise(state_tensors(opt2), sd_tensors(ck["opt"]))  # what was loaded reads back as saved
    train("gpt", m2, opt2, data[8:])
    assert_bitwise(params_bits(m2), full[0])
    assert_bitwise(state_tensors(opt2), full[1])


def test_loads_torch_adamw_state(capsys):
    """fp32 moments are torch.optim.AdamW's layout: its state dict continues in memwall."""
    ref, mw = make_mlp(), make_mlp()
    data = batches("mlp", 20)
    opt_ref = torch.optim.AdamW(mlp_groups(ref, LR), lr=LR, foreach=False)
    train("mlp", ref, opt_ref, data[:10])
    mw.load_state_dict(ref.state_dict())
    opt_mw = memwall.torch.AdamW(mlp_groups(mw, LR), lr=LR, threads=THREADS)
    opt_mw.load_state_dict(opt_ref.state_dict())
    train("mlp", ref, opt_ref, data[10:])
    train("mlp", mw, opt_mw, data[10:])
    for a, b in zip(mw.parameters(), ref.parameters()):
        assert ((a - b).abs() <= 1e-6 + 1e-6 * b.abs()).all()
    assert opt_mw.stats()["steps"] == 10 and float(opt_mw.state_dict()["state"][0]["step"]) == 20


def test_failed_nvme_write_can_be_retried(nvme_dir, tmp_path):
    data = batches("mlp", 6)
    m_ref, o_ref = run_mlp("dram", None, "fp32", steps=6)
    m = make_mlp()
    opt = memwall.torch.AdamW(mlp_groups(m, LR), lr=LR, state="nvme", nvme_dir=nvme_dir, subgroup_size=1024,
                              threads=THREADS)
    sched = warmup_cosine(opt, 6)
    train("mlp", m, opt, data[:3], clip=0.05, accum=2, sched=sched)
    before = params_bits(m)
    x, y = data[3]
    for xa, ya in zip(x.chunk(2), y.chunk(2)):
        (torch.nn.functional.mse_loss(m(xa), ya) / 2).backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 0.05)
    opt._inject_write_failure(0, 2)
    with pytest.raises(OSError, match=r"not committed.*intact.*retried"):
        opt.step()
    assert_bitwise(params_bits(m), before)  # the working copy is back at the committed step
    opt.step()  # the retry, with the same accumulated gradients
    sched.step()
    opt.zero_grad()
    train("mlp", m, opt, data[4:], clip=0.05, accum=2, sched=sched)
    assert_bitwise(params_bits(m), params_bits(m_ref))


@pytest.mark.parametrize("state,moments,dtype", [("dram", "fp32", torch.float32), ("nvme", "8bit", torch.float32),
                                                 ("nvme", "fp32", torch.bfloat16)])
def test_save_state_streams_and_resumes_bitwise(state, moments, dtype, tmp_path):
    """save_state/load_state move the state a chunk at a time (here 512 elements) and resume
    bitwise; a truncated or foreign file is refused with a message."""
    d = tmp_path / "nv"
    d.mkdir()
    data = batches("gpt", 10)

    def make(seed=0):
        m = make_gpt(seed).to(dtype)
        return m, memwall.torch.AdamW(gpt_groups(m, LR), lr=LR, state=state, nvme_dir=str(d), moment_dtype=moments,
                                      subgroup_size=1024, threads=THREADS)
    m, opt = make()
    train("gpt", m, opt, data)
    full = params_bits(m)
    opt.close()
    m, opt = make()
    train("gpt", m, opt, data[:5])
    path = tmp_path / "opt.mwstate"
    opt.save_state(path, chunk_elems=512)
    model_sd = {k: v.clone() for k, v in m.state_dict().items()}
    opt.close()
    m2, opt2 = make(seed=9)
    m2.load_state_dict(model_sd)
    opt2.load_state(path, chunk_elems=300)  # any chunk size (rounded to the 8-bit block)
    train("gpt", m2, opt2, data[5:])
    assert_bitwise(params_bits(m2), full)
    raw = path.read_bytes()
    (tmp_path / "cut").write_bytes(raw[:-10])
    with pytest.raises(ValueError, match="ends inside exp_avg_sq.* of param group 2 \\(truncated file\\)"):
        opt2.load_state(tmp_path / "cut")
    (tmp_path / "junk").write_bytes(b"not a state file at all")
    with pytest.raises(ValueError, match="is not a memwall.torch state file"):
        opt2.load_state(tmp_path / "junk")


@pytest.mark.parametrize("state,dtype", [("nvme", torch.float32), ("dram", torch.float32), ("nvme", torch.bfloat16)])
def test_release_grads_bitwise_and_zero_after_step(state, dtype, nvme_dir):
    """release_grads=True (gradient pages and staging given back after each update) trains
    bitwise as without it, overlapped from step 2 on, and leaves the gradients reading zero."""
    steps = 8
    res = []
    for release in (True, False):
        m = make_gpt().to(dtype)
        opt = memwall.torch.AdamW(gpt_groups(m, LR), lr=LR, state=state, nvme_dir=nvme_dir, subgroup_size=2048,
                                  buffer_count=2, release_grads=release, threads=THREADS)
        train("gpt", m, opt, batches("gpt", steps), accum=2, sched=warmup_cosine(opt, steps))
        assert opt.stats()["overlap"] is True
        res.append((params_bits(m), state_tensors(opt)))
        if release:  # after a step, before zero_grad: every gradient buffer reads zero
            x, y = batches("gpt", 1)[0]
            for xa, ya in zip(x.chunk(2), y.chunk(2)):
                (m(xa, ya)[1] / 2).backward()
            opt.step()
            assert all(float(g.g.abs().sum()) == 0.0 for g in opt._groups)
        opt.close()
    assert_bitwise(res[0][0], res[1][0])
    assert_bitwise(res[0][1], res[1][1])


def test_release_grads_failed_step_says_to_rerun_backward(nvme_dir):
    m = make_mlp()
    opt = memwall.torch.AdamW(mlp_groups(m, LR), lr=LR, state="nvme", nvme_dir=nvme_dir, subgroup_size=1024,
                              release_grads=True, threads=THREADS)
    x, y = batches("mlp", 1)[0]
    torch.nn.functional.mse_loss(m(x), y).backward()
    opt._inject_write_failure(0, 2)
    with pytest.raises(OSError, match=r"intact; run backward again, then retry the step: release_grads"):
        opt.step()
    opt.close()


def test_nvme_state_on_a_ramfs(tmp_path):
    """A file system that refuses O_DIRECT (ramfs; tmpfs before Linux 6.6): the optimizer's state is
    created there (opened once, buffered), trains bitwise as in DRAM, and leaves nothing behind."""
    import subprocess
    mnt = tmp_path / "ramfs"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "ramfs", "none", str(mnt)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a ramfs here (needs root with CAP_SYS_ADMIN)")
    try:
        m_d, o_d = run_mlp("dram", None, "fp32", steps=6)
        m_n, o_n = run_mlp("nvme", str(mnt), "fp32", steps=6, subgroup_size=1024, buffer_count=2)
        assert o_n.stats()["nvme_write_bytes"] > 0
        assert_bitwise(params_bits(m_n), params_bits(m_d))
        del o_n
        import gc
        gc.collect()
        left = [os.path.join(d, f) for d, _, fs in os.walk(mnt) for f in fs]
        assert not left, left
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
