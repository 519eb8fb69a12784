"""The data path of CUDA parameters (host copies of weights and gradients, write-back after the
step), run here on CPU parameters with _copy_path=True: bitwise equal to the in-place path, for
fp32 and bf16 parameters, DRAM and NVMe state, with and without overlap, and through a resume.
test_cuda_matches_cpu runs the real CUDA path where a GPU is present (scripts/gpu_check.sh)."""
import io

import pytest
import torch

import memwall.torch
from conftest import THREADS, assert_bitwise, batches, gpt_groups, make_gpt, params_bits, train

LR = 3e-3


def run(copy, state, dtype, nvme_dir, clip, steps=8, data=None):
    m = make_gpt().to(dtype)
    opt = memwall.torch.AdamW(gpt_groups(m, LR), lr=LR, state=state, nvme_dir=nvme_dir, subgroup_size=1024,
                              threads=THREADS, _copy_path=copy)
    train("gpt", m, opt, data or batches("gpt", steps), clip=clip, accum=2)
    return m, opt


@pytest.mark.parametrize("state,dtype,clip", [("dram", torch.float32, None), ("nvme", torch.float32, 1.0),
                                              ("dram", torch.bfloat16, 1.0), ("nvme", torch.bfloat16, None)])
def test_copy_path_bitwise_equals_in_place(state, dtype, clip, nvme_dir):
    m1, o1 = run(False, state, dtype, nvme_dir, clip)
    m2, o2 = run(True, state, dtype, nvme_dir, clip)
    assert o2._groups[0].copy and not o1._groups[0].copy
    assert o2.stats()["overlap"] is (clip is None)
    assert_bitwise(params_bits(m2), params_bits(m1))
    s1, s2 = o1.state_dict(), o2.state_dict()
    for i in s1["state"]:
        for k in s1["state"][i]:
            assert torch.equal(s1["state"][i][k], s2["state"][i][k])


def test_copy_path_resume_and_outside_changes():
    data = batches("gpt", 8)
    full, _ = run(True, "dram", torch.float32, None, 1.0, data=data)
    m, opt = run(True, "dram", torch.float32, None, 1.0, data=data[:4])
    buf = io.BytesIO()
    torch.save({"model": m.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    ck = torch.load(buf)
    m2 = make_gpt(seed=3)
    opt2 = memwall.torch.AdamW(gpt_groups(m2, LR), lr=LR, subgroup_size=1024, threads=THREADS, _copy_path=True)
    opt2.load_state_dict(ck["opt"])
    m2.load_state_dict(ck["model"])  # after the optimizer: picked up at the next step (version counters)
    train("gpt", m2, opt2, data[4:], clip=1.0, accum=2)
    assert_bitwise(params_bits(m2), params_bits(full))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (scripts/gpu_check.sh runs this on a GPU)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_matches_cpu(dtype):
    """The same gradients into a CUDA model and a CPU model: the optimizers' results are bitwise
    equal (same C kernel; the CUDA side only adds the copies)."""
    mc, mg = make_gpt().to(dtype), make_gpt().to(dtype).cuda()
    oc = memwall.torch.AdamW(gpt_groups(mc, LR), lr=LR, threads=THREADS)
    og = memwall.torch.AdamW(gpt_groups(mg, LR), lr=LR, threads=THREADS)
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        for pc, pg in zip(mc.parameters(), mg.parameters()):
            gr = torch.randn(pc.shape, generator=g).to(dtype)
            pc.grad = gr.clone() if dtype != torch.float32 else pc.grad.copy_(gr)
            pg.grad = gr.cuda()
        oc.step()
        og.step()
    assert_bitwise(params_bits(mc), [p.cpu() for p in params_bits(mg)])
