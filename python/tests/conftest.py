"""Shared models, data and training loops for the memwall.torch tests.

The tests run against the build tree's libmemwall.so when MEMWALL_LIB is set (CTest sets it
and puts python/ first on PYTHONPATH), else against the installed package."""
import importlib.util
import os

import pytest
import torch

# One thread each for torch and the optimizer kernel: the suite must stay quick and quiet on a
# shared 2-core machine (results do not depend on thread counts: docs/optim.md).
torch.set_num_threads(1)
THREADS = 1

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def _load_example():
    spec = importlib.util.spec_from_file_location("torch_gpt", os.path.join(ROOT, "examples", "torch_gpt.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


torch_gpt = _load_example()


def make_mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(24, 96), torch.nn.GELU(), torch.nn.Linear(96, 96), torch.nn.GELU(),
                               torch.nn.Linear(96, 7))


def make_gpt(seed=0):
    torch.manual_seed(seed)
    return torch_gpt.GPT(torch_gpt.GPTConfig(block_size=16, vocab_size=61, n_layer=2, n_head=2, n_embd=32))


def mlp_groups(model, lr):
    """Three groups: 2-D weights of the first layers (decay 0.1), the last layer's weight at half the
    learning rate (decay 0.05), biases (no decay)."""
    w = [p for n, p in model.named_parameters() if n.endswith("weight")]
    b = [p for n, p in model.named_parameters() if n.endswith("bias")]
    return [{"params": w[:-1], "weight_decay": 0.1},
            {"params": w[-1:], "weight_decay": 0.05, "lr": lr * 0.5},
            {"params": b, "weight_decay": 0.0}]


def gpt_groups(model, lr):
    """nanoGPT's two groups plus the embeddings in their own group with a lower learning rate."""
    emb = {id(model.wte.weight), id(model.wpe.weight)}
    ps = list(model.parameters())
    return [{"params": [p for p in ps if p.dim() >= 2 and id(p) not in emb], "weight_decay": 0.1},
            {"params": [p for p in ps if id(p) in emb], "weight_decay": 0.01, "lr": lr * 0.3, "betas": (0.9, 0.95)},
            {"params": [p for p in ps if p.dim() < 2], "weight_decay": 0.0}]


def batches(kind, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        if kind == "mlp":
            out.append((torch.randn(32, 24, generator=g), torch.randn(32, 7, generator=g)))
        else:
            x = torch.randint(0, 61, (4, 16), generator=g)
            out.append((x, torch.roll(x, -1, dims=1)))
    return out


def loss_of(kind, model, x, y):
    if kind == "mlp":
        return torch.nn.functional.mse_loss(model(x), y)
    return model(x, y)[1]


def train(kind, model, opt, data, *, clip=None, accum=1, sched=None, zero_set_to_none=True):
    """The ordinary torch loop: forward, backward (accum micro-batches), clip, step, schedule."""
    for x, y in data:
        xs, ys = x.chunk(accum), y.chunk(accum)
        for xa, ya in zip(xs, ys):
            (loss_of(kind, model, xa, ya) / accum).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        if sched is not None:
            sched.step()
        opt.zero_grad(set_to_none=zero_set_to_none)


def warmup_cosine(opt, steps):
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / 10 if s < 10 else 0.1 + 0.45 * (1 + torch.cos(torch.tensor(
            3.14159265 * (s - 10) / (steps - 10))).item()))


def params_bits(model):
    return [p.detach().clone() for p in model.parameters()]


def assert_bitwise(a, b):
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert torch.equal(x.view(torch.int32) if x.dtype == torch.float32 else x,
                           y.view(torch.int32) if y.dtype == torch.float32 else y), f"tensor {i} differs"


@pytest.fixture
def nvme_dir(tmp_path):
    d = tmp_path / "nvme"
    d.mkdir()
    return str(d)
