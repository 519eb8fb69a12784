"""memwall.torch.AdamW behaves as torch.optim.AdamW where programs rely on it (issue "Whole-state
offload for any PyTorch model", part 0, found with transformers' Trainer):
  - a parameter whose gradient is None at step() is not touched (weights, moments, step count),
    and each parameter has its own step count for its bias correction (a branch unused after
    step 0, one skipped for a while and used again, a parameter frozen midway, one frozen at
    construction and unfrozen later), against torch.optim.AdamW, DRAM and NVMe, with and without
    overlap;
  - step() without any backward changes nothing;
  - empty and all-frozen param groups are accepted;
  - state_dict() / load_state_dict() round trip bitwise (per-parameter step counts kept) and
    read and write each subgroup once (the engine's NVMe byte counters);
  - staging stays within what the model needs;
  - state directories of dead processes are reported and swept;
  - transformers' Trainer (a tiny GPT-2 from a config) trains as with torch.optim.AdamW."""
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.nn as nn

import memwall.torch
from conftest import HERE, THREADS, assert_bitwise, params_bits

LR = 3e-3
STEPS = 10


class Net(nn.Module):
    """A trunk and head used at every step, and parts that are not: `branch` only at step 0,
    `gate` at steps 0-2 and again from step 6 (its step count lags the others' by 3), `late`
    from step 4 (built frozen, unfrozen then)."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.trunk = nn.Linear(16, 32)
        self.head = nn.Linear(32, 4)
        self.branch = nn.Linear(32, 4)
        self.gate = nn.Linear(32, 4)
        self.late = nn.Linear(32, 4)

    def forward(self, x, step):
        h = torch.tanh(self.trunk(x))
        y = self.head(h)
        if step == 0:
            y = y + self.branch(h)
        if step < 3 or step >= 6:
            y = y + self.gate(h)
        if step >= 4:
            y = y + self.late(h)
        return y


def net_groups(m):
    """Decay on weights, none on biases, the late layer in a group of its own (all frozen when
    the optimizer is built), and an empty group."""
    late = {id(p) for p in m.late.parameters()}
    ps = [p for p in m.parameters() if id(p) not in late]
    return [{"params": [p for p in ps if p.dim() == 2], "weight_decay": 0.1},
            {"params": [p for p in ps if p.dim() == 1], "weight_decay": 0.0},
            {"params": list(m.late.parameters()), "weight_decay": 0.05},
            {"params": []}]


def net_data(steps=STEPS):
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)) for _ in range(steps)]


def make_pair(state, nvme_dir, **kw):
    ref, mw = Net(), Net()
    for m in (ref, mw):  # frozen before the optimizers exist, as the loop above expects
        m.late.requires_grad_(False)
        m.head.bias.requires_grad_(False)
    o_ref = torch.optim.AdamW(net_groups(ref), lr=LR, foreach=False)
    o_mw = memwall.torch.AdamW(net_groups(mw), lr=LR, state=state, nvme_dir=nvme_dir, threads=THREADS, **kw)
    return ref, o_ref, mw, o_mw


def close(a, b, what):
    for i, (x, y) in enumerate(zip(a, b)):
        assert ((x - y).abs() <= 1e-6 + 1e-6 * y.abs()).all(), f"{what}: tensor {i}: {(x - y).abs().max()}"


@pytest.mark.parametrize("state,overlap,model_zero_grad", [("dram", False, False), ("dram", True, False),
                                                           ("nvme", True, False), ("nvme", False, True)])
def test_skipped_and_frozen_parameters_as_torch(state, overlap, model_zero_grad, nvme_dir):
    ref, o_ref, mw, o_mw = make_pair(state, nvme_dir, overlap=overlap, subgroup_size=64)
    data = net_data()
    branch0 = None
    l_ref, l_mw = [], []
    for step, (x, y) in enumerate(data):  # train_net's loop, one step at a time on both
        for m in (ref, mw):
            if step == 3:
                m.head.bias.requires_grad_(True)
            if step == 4:
                m.late.requires_grad_(True)
            if step == 5:
                m.trunk.bias.requires_grad_(False)
        for m, o, ls in ((ref, o_ref, l_ref), (mw, o_mw, l_mw)):
            loss = nn.functional.mse_loss(m(x, step), y)
            loss.backward()
            o.step()
            if model_zero_grad:
                m.zero_grad()
            else:
                o.zero_grad()
            ls.append(loss.item())
        if step == 0:
            branch0 = [p.detach().clone() for p in mw.branch.parameters()]
        if step == 5:
            trunk_bias5 = mw.trunk.bias.detach().clone()
    assert max(abs(a - b) for a, b in zip(l_mw, l_ref)) <= 1e-6, (l_mw, l_ref)
    close(params_bits(mw), params_bits(ref), "parameters")
    # untouched: the branch after step 0, the trunk's bias after it was frozen (bitwise)
    assert_bitwise([p.detach() for p in mw.branch.parameters()], branch0)
    assert_bitwise([mw.trunk.bias.detach()], [trunk_bias5])
    # per-parameter step counts and moments as torch's
    s_ref, s_mw = o_ref.state_dict(), o_mw.state_dict()
    assert sorted(s_mw["state"]) == sorted(s_ref["state"])
    for i, st in s_ref["state"].items():
        assert float(s_mw["state"][i]["step"]) == float(st["step"]), i
        close([s_mw["state"][i]["exp_avg"], s_mw["state"][i]["exp_avg_sq"]], [st["exp_avg"], st["exp_avg_sq"]],
              f"moments of parameter {i}")
    steps = {n: float(o_ref.state[p]["step"]) for n, p in ref.named_parameters()}
    assert steps["branch.weight"] == 1 and steps["gate.weight"] == STEPS - 3 and steps["late.weight"] == STEPS - 4
    assert steps["head.bias"] == STEPS - 3 and steps["trunk.bias"] == 5
    if overlap:
        assert o_mw.stats()["overlap"], o_mw.overlap_off_reason


def test_step_without_backward_changes_nothing(nvme_dir):
    for state in ("dram", "nvme"):
        m = Net()
        opt = memwall.torch.AdamW(m.parameters(), lr=LR, state=state, nvme_dir=nvme_dir, threads=THREADS)
        before = params_bits(m)
        opt.step()  # no gradient at all, as after construction in torch
        assert_bitwise(params_bits(m), before)
        nn.functional.mse_loss(m(torch.randn(4, 16), 0), torch.zeros(4, 4)).backward()
        opt.step()
        opt.zero_grad()
        after1, sd1 = params_bits(m), opt.state_dict()
        reads = opt.stats()["nvme_read_bytes"]
        opt.step()  # gradients None again (zero_grad): nothing moves, nothing is read
        opt.zero_grad(set_to_none=False)
        opt.step()
        assert_bitwise(params_bits(m), after1)
        assert opt.stats()["nvme_read_bytes"] == reads and opt.stats()["steps"] == 1
        sd2 = opt.state_dict()
        for i in sd1["state"]:
            assert_bitwise([sd2["state"][i][k] for k in ("exp_avg", "exp_avg_sq", "step")],
                           [sd1["state"][i][k] for k in ("exp_avg", "exp_avg_sq", "step")])
        opt.close()


def test_zero_grad_set_to_none_false_steps_with_zero_gradients():
    """torch keeps a zeroed gradient (not None) with set_to_none=False: the parameter is stepped
    with it (weight decay, decaying moments) at the next step, even without a backward."""
    ref, mw = Net(), Net()
    o_ref = torch.optim.AdamW(ref.parameters(), lr=LR, foreach=False)
    o_mw = memwall.torch.AdamW(mw.parameters(), lr=LR, threads=THREADS)
    x, y = torch.randn(4, 16), torch.randn(4, 4)
    for m, o in ((ref, o_ref), (mw, o_mw)):
        nn.functional.mse_loss(m(x, 0), y).backward()
        o.step()
        o.zero_grad(set_to_none=False)
        o.step()  # zero gradients: stepped
        o.zero_grad(set_to_none=True)
        o.step()  # None: not stepped
    close(params_bits(mw), params_bits(ref), "parameters")
    assert float(o_mw.state_dict()["state"][0]["step"]) == 2 == float(o_ref.state_dict()["state"][0]["step"])


def test_empty_and_all_frozen_groups():
    m = Net()
    m.late.requires_grad_(False)
    groups = net_groups(m)
    opt = memwall.torch.AdamW(groups, lr=LR, threads=THREADS)
    assert [len(g.params) for g in opt._groups] == [4, 4, 0, 0]
    opt.add_param_group({"params": []})
    frozen = nn.Parameter(torch.ones(3), requires_grad=False)
    opt.add_param_group({"params": [frozen], "lr": 1e-2})
    nn.functional.mse_loss(m(torch.randn(4, 16), 0), torch.zeros(4, 4)).backward()
    opt.step()
    opt.zero_grad()
    sd = opt.state_dict()
    assert len(sd["param_groups"]) == 6 and sd["param_groups"][5]["lr"] == 1e-2
    opt2 = memwall.torch.AdamW(net_groups(Net()) + [{"params": []}, {"params": [nn.Parameter(torch.ones(3),
                                                                                          requires_grad=False)]}],
                               lr=LR, threads=THREADS)
    opt2.load_state_dict(sd)
    assert opt2.param_groups[5]["lr"] == 1e-2
    assert torch.equal(frozen, torch.ones(3))


def frozen(m):
    """A matrix frozen midway: 3072 elements, so it shares no 8-bit block with its neighbours."""
    return m.h[0].attn.c_attn.weight


def run_gpt(opt_kw, steps, nvme_dir, sub):
    from conftest import batches, gpt_groups, loss_of, make_gpt
    m = make_gpt()
    d = os.path.join(nvme_dir, sub)
    os.makedirs(d, exist_ok=True)
    opt = memwall.torch.AdamW(gpt_groups(m, LR), lr=LR, state="nvme", nvme_dir=d, threads=THREADS, **opt_kw)
    data = batches("gpt", steps)
    for i, (x, y) in enumerate(data):
        if i == 2:
            frozen(m).requires_grad_(False)  # its step count stays at 2
        loss_of("gpt", m, x, y).backward()
        opt.step()
        opt.zero_grad()
    return m, opt


@pytest.mark.parametrize("moments", ["fp32", "8bit"])
def test_state_dict_round_trip_bitwise_and_reads_each_subgroup_once(moments, nvme_dir):
    kw = dict(subgroup_size=2048, moment_dtype=moments)
    m, opt = run_gpt(kw, 4, nvme_dir, "a")
    state_bytes = opt.stats()["nvme_bytes"] / 2  # one slot: master and moments
    s0 = opt.stats()
    sd = opt.state_dict()
    s1 = opt.stats()
    read = s1["nvme_read_bytes"] - s0["nvme_read_bytes"]
    assert 0 < read <= state_bytes * 1.05, (read, state_bytes)  # once (was once per parameter and region)
    steps = sorted({float(s["step"]) for s in sd["state"].values()})
    assert steps == [2.0, 4.0]  # one matrix frozen after 2 steps: its own count
    m2, opt2 = run_gpt(kw, 0, nvme_dir, "b")
    m2.load_state_dict(m.state_dict())
    w0 = opt2.stats()
    opt2.load_state_dict(sd)
    w1 = opt2.stats()
    assert w1["nvme_read_bytes"] == w0["nvme_read_bytes"]  # every region of each subgroup written whole
    assert 0 < w1["nvme_write_bytes"] - w0["nvme_write_bytes"] <= state_bytes * 1.05
    sd2 = opt2.state_dict()
    for i, st in sd["state"].items():
        assert_bitwise([sd2["state"][i][k] for k in st], [st[k] for k in st])
    if moments == "8bit":
        for a, b in zip(sd["memwall"]["groups"], sd2["memwall"]["groups"]):
            assert_bitwise([b[k] for k in a], [a[k] for k in a])
    # and training goes on identically from both
    from conftest import batches, loss_of
    for o, mm in ((opt, m), (opt2, m2)):
        frozen(mm).requires_grad_(False)
        for x, y in batches("gpt", 3, seed=5):
            loss_of("gpt", mm, x, y).backward()
            o.step()
            o.zero_grad()
    assert_bitwise(params_bits(m2), params_bits(m))


def test_save_state_keeps_per_parameter_steps(nvme_dir, tmp_path):
    m, opt = run_gpt(dict(subgroup_size=2048), 4, nvme_dir, "a")
    opt.save_state(tmp_path / "s.mwstate")
    m2, opt2 = run_gpt(dict(subgroup_size=2048), 0, nvme_dir, "b")
    m2.load_state_dict(m.state_dict())
    r0 = opt2.stats()["nvme_read_bytes"]
    opt2.load_state(tmp_path / "s.mwstate")
    assert opt2.stats()["nvme_read_bytes"] == r0
    sd, sd2 = opt.state_dict(), opt2.state_dict()
    assert {i: float(s["step"]) for i, s in sd["state"].items()} == {i: float(s["step"]) for i, s in sd2["state"].items()}
    for i, st in sd["state"].items():
        assert_bitwise([sd2["state"][i][k] for k in st], [st[k] for k in st])


def test_staging_bounded(nvme_dir):
    """A buffer beyond the subgroups is never used, and the default subgroup size fits the
    model: a small model's groups get one buffer each; 4.2M parameters two of half the size, not
    8 x 48 MiB."""
    m = Net()
    opt = memwall.torch.AdamW(m.parameters(), lr=LR, state="nvme", nvme_dir=nvme_dir, threads=THREADS)
    assert opt.stats()["staging_bytes"] <= 2 << 20  # one buffer (2 MiB-rounded); was 16 MiB
    opt.close()
    big = nn.Parameter(torch.zeros((1 << 22) + 100_000))
    opt = memwall.torch.AdamW([big], lr=LR, state="nvme", nvme_dir=nvme_dir, threads=THREADS)
    s = opt.stats()
    state = 12 * big.numel()  # master and fp32 moments
    assert s["n_subgroups"] == 2 and s["staging_bytes"] <= state * 1.05 + (4 << 20), s  # was 8 x 48 MiB
    opt.close()


_CHILD = r"""
import os, signal, sys, torch
sys.path.insert(0, {python!r})
import memwall.torch
p = torch.nn.Parameter(torch.ones(1000))
opt = memwall.torch.AdamW([p], state="nvme", nvme_dir={d!r})
p.grad = torch.ones(1000)
opt.step()
print("READY", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_state_dirs_of_dead_processes_are_swept(nvme_dir):
    py = os.path.abspath(os.path.join(HERE, ".."))
    r = subprocess.run([sys.executable, "-c", _CHILD.format(python=py, d=nvme_dir)], capture_output=True, text=True,
                       env=dict(os.environ), timeout=300)
    assert r.returncode == -signal.SIGKILL and "READY" in r.stdout, r.stderr
    dead = [os.path.join(nvme_dir, n) for n in os.listdir(nvme_dir)]
    assert len(dead) == 1 and os.path.exists(os.path.join(dead[0], "memwall.lock"))
    name = os.path.basename(dead[0])
    assert name.startswith("memwall-g0-p")
    with pytest.warns(RuntimeWarning, match=rf"removed the state directories .*{name} \(pid \d+, "):
        alive = memwall.torch.AdamW([nn.Parameter(torch.ones(10))], state="nvme", nvme_dir=nvme_dir)
    assert [p for p, _, _ in alive.swept_state_dirs] == dead and not os.path.exists(dead[0])
    # a live optimizer's directory (its lock held) and a young lockless one are left alone
    young = os.path.join(nvme_dir, "memwall-g0-p999999999-young")
    old = os.path.join(nvme_dir, "memwall-g3-p999999999-old")
    os.makedirs(young)
    os.makedirs(old)
    with open(os.path.join(old, "memwall-offload.0.dat"), "wb") as f:
        f.write(b"x" * 8192)
    t = time.time() - 3600
    os.utime(old, (t, t))
    mine = set(os.listdir(nvme_dir))
    with pytest.warns(RuntimeWarning, match=r"removed the state directories .*memwall-g3-p999999999-old \(pid 999999999"):
        other = memwall.torch.AdamW([nn.Parameter(torch.ones(10))], state="nvme", nvme_dir=nvme_dir)
    left = set(os.listdir(nvme_dir))
    assert os.path.exists(young) and not os.path.exists(old)
    assert mine - {"memwall-g3-p999999999-old"} <= left  # the live optimizer's directory stays
    assert [p for p, _, _ in other.swept_state_dirs] == [old]
    assert memwall.torch.sweep_stale_state(nvme_dir) == []
    alive.close()
    other.close()


def test_trainer_matches_torch(tmp_path):
    """transformers' Trainer with memwall's AdamW (optimizer_cls_and_kwargs, and as an
    instance) trains a tiny GPT-2 built from a config as with torch.optim.AdamW; a LoRA-style
    model (only some matrices trainable: the no-decay group is empty) too."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    class Recorder(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, **kw):
            out = super().compute_loss(model, inputs, return_outputs=return_outputs, **kw)
            self.losses.append(float((out[0] if return_outputs else out).detach()))
            return out

    g = torch.Generator().manual_seed(1)
    data = []
    for _ in range(24):
        x = torch.randint(0, 97, (16,), generator=g)
        data.append({"input_ids": x, "labels": x.clone()})

    def run(opt_cls, kw, lora, instance=False):
        transformers.set_seed(0)
        model = GPT2LMHeadModel(GPT2Config(vocab_size=97, n_positions=32, n_embd=32, n_layer=2, n_head=2))
        if lora:
            for n, p in model.named_parameters():
                p.requires_grad_(n.endswith("attn.c_attn.weight"))
        args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=5, per_device_train_batch_size=4,
                                 learning_rate=2e-3, weight_decay=0.1, logging_steps=1, report_to=[], use_cpu=True,
                                 save_strategy="no", seed=0, disable_tqdm=True, dataloader_num_workers=0)
        if instance:
            opt = opt_cls([p for p in model.parameters() if p.requires_grad], lr=2e-3, weight_decay=0.1, **kw)
            tr = Recorder(model=model, args=args, train_dataset=data, optimizers=(opt, None))
        else:
            tr = Recorder(model=model, args=args, train_dataset=data, optimizer_cls_and_kwargs=(opt_cls, kw))
        tr.losses = []
        tr.train()
        return tr.losses, [p.detach().clone() for p in model.parameters()]

    for lora in (False, True):
        l_ref, p_ref = run(torch.optim.AdamW, {"foreach": False}, lora)
        l_mw, p_mw = run(memwall.torch.AdamW, {"threads": THREADS}, lora)
        assert len(l_ref) == 5 and max(abs(a - b) for a, b in zip(l_ref, l_mw)) <= 1e-6, (lora, l_ref, l_mw)
        close(p_mw, p_ref, f"parameters, lora={lora}")
    l_mw, p_mw = run(memwall.torch.AdamW, {"threads": THREADS}, False, instance=True)
    l_ref, p_ref = run(torch.optim.AdamW, {"foreach": False}, False, instance=True)
    assert max(abs(a - b) for a, b in zip(l_ref, l_mw)) <= 1e-6


def test_failed_rebuild_leaves_the_group_as_it_was(monkeypatch):
    """The state copy of a rebuild (a parameter unfrozen) fails: step() raises with nothing
    stepped, the parameters are the old engine's views again, and the retried step trains on as
    torch does. (With overlap on the group's update has begun during backward; it is finished
    first, and the error says the others were stepped.)"""
    def make():
        torch.manual_seed(0)
        a, b = nn.Parameter(torch.randn(40)), nn.Parameter(torch.randn(24), requires_grad=False)
        return a, b
    a, b = make()
    ra, rb = make()
    opt = memwall.torch.AdamW([a, b], lr=LR, threads=THREADS, overlap=False)
    ref = torch.optim.AdamW([ra, rb], lr=LR, foreach=False)
    for o, x in ((opt, a), (ref, ra)):
        (x * x).sum().backward()
        o.step()
        o.zero_grad()
    b.requires_grad_(True)
    rb.requires_grad_(True)
    ptr = a.data_ptr()

    def fail(*args, **kw):
        raise OSError(28, "no space left (injected)")
    (a * a).sum().add((b * b).sum()).backward()
    with monkeypatch.context() as mp:
        mp.setattr(memwall.torch, "_write_regions", fail)
        with pytest.raises(OSError, match="injected"):
            opt.step()
    assert a.data_ptr() == ptr and len(opt._groups[0].params) == 1
    opt.step()  # the same gradients, now with the rebuild
    (ra * ra).sum().add((rb * rb).sum()).backward()
    ref.step()
    close([a.detach(), b.detach()], [ra.detach(), rb.detach()], "parameters")
    assert float(opt.state_dict()["state"][1]["step"]) == 1 == float(ref.state_dict()["state"][1]["step"])
    # overlap: the group's step had begun; the error says what was done
    a2 = nn.Parameter(torch.randn(40))
    b2 = nn.Parameter(torch.randn(24), requires_grad=False)
    opt2 = memwall.torch.AdamW([a2, b2], lr=LR, threads=THREADS)
    for _ in range(2):  # the probing step, then an overlapped one
        (a2 * a2).sum().backward()
        opt2.step()
        opt2.zero_grad()
    assert opt2.stats()["overlap"]
    b2.requires_grad_(True)
    (a2 * a2).sum().add((b2 * b2).sum()).backward()
    with monkeypatch.context() as mp:
        mp.setattr(memwall.torch, "_write_regions", fail)
        with pytest.raises(RuntimeError, match=r"took this step .* without parameters \[1\].*injected.*other "
                                               r"parameters are stepped"):
            opt2.step()
    opt2.zero_grad()
    (a2 * a2).sum().add((b2 * b2).sum()).backward()
    opt2.step()
    assert float(opt2.state_dict()["state"][1]["step"]) == 1
