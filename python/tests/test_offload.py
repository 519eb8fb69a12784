"""memwall.torch.offload: a transformers model's whole training state in the session (weights and
gradients as views of its arrays, the session's AdamW), docs/python.md "Whole-state offload".

- Offloaded == resident, bitwise: the same small random-initialised LlamaForCausalLM (tied head),
  Qwen2ForCausalLM (q/k/v biases, untied head) and GPT2LMHeadModel (tied head) trained 5 steps of 4
  micro-batches with clipping and an evaluation pass, then loaded back to their first weights
  (model.load_state_dict) and stepped once more, with the weights streamed from NVMe, with the
  weights resident, and with resident weights and the optimizer on NVMe (the update behind the next
  forward): the same losses, gradient norms, evaluation loss and weights (model.state_dict(),
  gathered from the session; again after close()), bit for bit. The streamed run never holds all
  the weights at once.
- The same loop with torch.optim.AdamW on the ordinary model: losses within 1e-5 (a sanity check of
  the session's AdamW and of the hooks' bracketing), gradient norms within 1e-5 relative.
- Refusals: a module order that changes after the first step (the error names the modules), a block
  skipped, a DRAM budget below the plan (up front, with the numbers, the model untouched),
  activations="nvme", backward passes that do not match grad_accum, units that miss parameters,
  torch's clip_grad_norm_ on streamed gradients (they are on NVMe by then).
"""
import math

import pytest
import torch

import memwall
import memwall.torch as mt

transformers = pytest.importorskip("transformers")

VOCAB, STEPS, ACCUM, LR, WD, BETAS, EPS = 128, 5, 4, 2e-3, 0.1, (0.9, 0.95), 1e-8
CLIPS = (0.5, 100.0)  # by step: clipping acts at even steps, not at odd ones


def make(kind, layers=3):
    T = transformers
    torch.manual_seed(0)
    if kind == "llama":
        cfg = T.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                            tie_word_embeddings=True)
        return T.LlamaForCausalLM(cfg)
    if kind == "qwen2":
        cfg = T.Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                            tie_word_embeddings=False, use_sliding_window=False)
        return T.Qwen2ForCausalLM(cfg)
    cfg = T.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=layers, n_head=4, n_positions=64, resid_pdrop=0.0,
                       embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return T.GPT2LMHeadModel(cfg)


def batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (2, 16), generator=g) for _ in range(n)]


def train(kind, mode, tmp_path):
    """mode: 'torch' (torch.optim.AdamW on the ordinary model), 'dram' or 'nvme' (offload's weights), 'dram+nvme'
    (resident weights, the optimizer state on NVMe: the update runs behind the next forward)."""
    model = make(kind)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    off = None
    if mode == "torch":
        opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, foreach=False)
    else:
        weights, _, optimizer = mode.partition("+")  # "dram+nvme": resident weights, the optimizer on NVMe
        off = mt.offload(model, nvme_dir=tmp_path / mode, weights=weights, optimizer=optimizer or None,
                         grad_accum=ACCUM, prefetch=1, subgroup_size=4096, threads=1)
        opt = off.optimizer(lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    data = batches((STEPS + 1) * ACCUM + 1)
    losses, norms, evals = [], [], []

    def step(t):
        for a in range(ACCUM):
            x = data[t * ACCUM + a]
            loss = model(input_ids=x, labels=x).loss
            (loss / ACCUM).backward()
            losses.append(loss.item())
        if mode == "torch":
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIPS[t % 2]).item())
        else:
            norms.append(mt.clip_grad_norm_(model.parameters(), CLIPS[t % 2]).item())
        opt.step()
        opt.zero_grad()

    for t in range(STEPS):
        step(t)
        if t == 2:  # an evaluation pass between steps (the update may still run behind it)
            with torch.no_grad():
                evals.append(model(input_ids=data[-1], labels=data[-1]).loss.item())
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(start)  # back to the first weights (the moments stay), then one more step
    reloaded = {k: v.clone() for k, v in model.state_dict().items()}
    step(STEPS)
    final = {k: v.clone() for k, v in model.state_dict().items()}
    stats = off.stats() if off is not None else None
    if off is not None:
        off.close()
        for k, v in model.state_dict().items():  # the model trains on without memwall
            assert torch.equal(v, final[k]), k
    return dict(losses=losses, norms=norms, evals=evals, trained=trained, reloaded=reloaded, final=final,
                start=start, stats=stats)


def bits(x):
    return x.view(torch.int32) if x.dtype == torch.float32 else x


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gpt2"])
def test_offloaded_equals_resident(kind, tmp_path):
    ref = train(kind, "torch", tmp_path)
    dram = train(kind, "dram", tmp_path)
    nvme = train(kind, "nvme", tmp_path)
    behind = train(kind, "dram+nvme", tmp_path)
    assert len(dram["losses"]) == (STEPS + 1) * ACCUM
    assert min(dram["norms"]) > CLIPS[0] and max(dram["norms"]) < CLIPS[1], dram["norms"]
    for other, name in ((nvme, "streamed"), (behind, "optimizer on NVMe")):
        assert dram["losses"] == other["losses"], f"{name}: losses differ from the resident run's"
        assert dram["norms"] == other["norms"] and dram["evals"] == other["evals"], name
        for what in ("trained", "reloaded", "final"):
            assert dram[what].keys() == other[what].keys() == ref[what].keys()
            for k in dram[what]:
                assert torch.equal(bits(dram[what][k]), bits(other[what][k])), f"{name}: {what} {k} differs"
    for k in dram["start"]:
        assert torch.equal(dram["reloaded"][k], dram["start"][k]) and torch.equal(nvme["reloaded"][k],
                                                                                   nvme["start"][k]), k
    moved = sum(not torch.equal(dram["trained"][k], dram["start"][k]) for k in dram["start"])
    assert moved >= len(dram["start"]) * 3 // 4, f"only {moved} of {len(dram['start'])} tensors moved"
    # Sanity: the session's AdamW and hooks against torch.optim.AdamW on the ordinary model.
    for a, b in zip(ref["losses"], dram["losses"]):
        assert abs(a - b) <= 1e-5, (ref["losses"], dram["losses"])
    for a, b in zip(ref["norms"], dram["norms"]):
        assert abs(a - b) <= 1e-5 * a, (ref["norms"], dram["norms"])
    assert abs(ref["evals"][0] - dram["evals"][0]) <= 1e-5
    assert dram["losses"][-ACCUM] < dram["losses"][0] + 0.5
    st = nvme["stats"]
    n = st["n_params"]
    assert st["steps"] == STEPS + 1 and st["weight_bytes_fetched"] > 0 and st["grad_bytes_written"] > 0
    assert 0 < st["weights_resident_peak"] < 4 * n, f"the streamed run held all weights at once: {st}"
    assert dram["stats"]["weight_bytes_fetched"] == 0


def test_schedule(tmp_path):
    """Units, tied heads and the orders the session checks."""
    m = make("llama")
    off = mt.offload(m, nvme_dir=tmp_path / "a", weights="dram", threads=1)
    assert [u for u, _ in off.units] == ["model.embed_tokens", "model.layers.0", "model.layers.1", "model.layers.2",
                                         "model.norm"]
    assert off.schedule == ([0, 1, 2, 3, 4, 0], [0, 4, 3, 2, 1])  # the tied head: unit 0 again, its lookups: not
    off.close()
    m = make("qwen2")
    off = mt.offload(m, nvme_dir=tmp_path / "b", weights="dram", threads=1)
    assert off.units[-1][0] == "model.norm+lm_head" and off.schedule == ([0, 1, 2, 3, 4], [4, 3, 2, 1])
    off.close()
    m = make("gpt2")
    off = mt.offload(m, nvme_dir=tmp_path / "c", weights="dram", threads=1)
    assert off.units[0][0] == "transformer.wte+transformer.wpe" and off.schedule[0] == [0, 1, 2, 3, 4, 0]
    assert sum(n for _, n in off.units) == sum(p.numel() for p in m.parameters())
    off.close()


def one_step(model, opt, accum=1):
    for x in batches(accum):
        (model(input_ids=x, labels=x).loss / accum).backward()
    opt.step()
    opt.zero_grad()


@pytest.mark.parametrize("weights", ["dram", "nvme"])
def test_changed_module_order(weights, tmp_path):
    m = make("llama")
    off = mt.offload(m, nvme_dir=tmp_path, weights=weights, threads=1)
    opt = off.optimizer(lr=1e-3)
    one_step(m, opt)
    layers = m.model.layers
    layers[0], layers[1] = layers[1], layers[0]
    x = batches(1)[0]
    with pytest.raises(RuntimeError, match=r"module 'model\.layers\.1' ran where the schedule expected "
                                           r"'model\.layers\.0'"):
        m(input_ids=x, labels=x)
    with pytest.raises(RuntimeError, match="unusable after an earlier error"):
        m(input_ids=x, labels=x)
    trained = {k: v.clone() for k, v in m.state_dict().items()}  # reading the weights still works
    off.close()  # and they come back into the model
    assert all(p.numel() > 0 and p.grad is None for p in m.parameters())
    assert all(torch.equal(v, trained[k]) for k, v in m.state_dict().items())
    fresh = make("llama").state_dict()
    assert not all(torch.equal(v, fresh[k]) for k, v in trained.items())  # the step's weights
    m(input_ids=x, labels=x).loss.backward()  # an ordinary model again, in its new order


def test_skipped_module(tmp_path):
    """A block skipped in forward (not the order planned): refused at the next module, naming both."""
    m = make("qwen2")
    off = mt.offload(m, nvme_dir=tmp_path, weights="nvme", threads=1)
    opt = off.optimizer(lr=1e-3)
    one_step(m, opt)
    m.config.num_hidden_layers = 1  # transformers runs layers[:num_hidden_layers]
    x = batches(1)[0]
    with pytest.raises(RuntimeError, match=r"module 'model\.norm' ran where the schedule expected 'model\.layers\.1'"):
        m(input_ids=x, labels=x)
    off.close(restore=False)


def test_budget_refused_up_front(tmp_path):
    m = make("llama")
    before = {k: v.clone() for k, v in m.state_dict().items()}
    ptrs = [p.data_ptr() for p in m.parameters()]
    with pytest.raises(memwall.MemwallError, match=r"DRAM budget 1\.00 MiB is too small .*needs [0-9.]+ MiB at its "
                                                   r"peak \(runtime"):
        mt.offload(m, nvme_dir=tmp_path, weights="nvme", dram_budget=1 << 20, threads=1)
    assert [p.data_ptr() for p in m.parameters()] == ptrs  # the model is untouched
    assert all(torch.equal(v, before[k]) for k, v in m.state_dict().items())
    assert getattr(m, "_memwall_offload", None) is None
    x = batches(1)[0]
    m(input_ids=x, labels=x).loss.backward()  # and trains as before


def test_refusals(tmp_path):
    m = make("llama", layers=2)
    with pytest.raises(NotImplementedError, match="activations='nvme'.*later item"):
        mt.offload(m, nvme_dir=tmp_path, activations="nvme")
    with pytest.raises(ValueError, match="nvme_dir= is needed"):
        mt.offload(m)
    with pytest.raises(ValueError, match="in no unit"):
        mt.offload(m, nvme_dir=tmp_path, units=[m.model.embed_tokens, *m.model.layers])
    m.model.norm.weight.requires_grad_(False)
    with pytest.raises(ValueError, match="frozen"):
        mt.offload(m, nvme_dir=tmp_path)
    m.model.norm.weight.requires_grad_(True)
    off = mt.offload(m, nvme_dir=tmp_path, weights="nvme", grad_accum=2, threads=1)
    with pytest.raises(ValueError, match="offloaded already"):
        mt.offload(m, nvme_dir=tmp_path)
    opt = off.optimizer(lr=1e-3)
    x = batches(1)[0]
    m(input_ids=x, labels=x).loss.backward()
    with pytest.raises(RuntimeError, match=r"step\(\) after 1 backward passes.*grad_accum=2"):
        opt.step()
    m(input_ids=x, labels=x).loss.backward()
    with pytest.raises(RuntimeError, match=r"backward pass 3 before step\(\).*grad_accum=2"):
        m(input_ids=x, labels=x).loss.backward()
    off.close(restore=False)
    # Named units: the same schedule as the default ones.
    m = make("llama", layers=2)
    units = [m.model.embed_tokens, *m.model.layers, [m.model.norm, m.lm_head]]
    off = mt.offload(m, nvme_dir=tmp_path / "named", weights="nvme", units=units, threads=1)
    assert off.schedule == ([0, 1, 2, 3, 0], [0, 3, 2, 1])
    opt = off.optimizer(lr=1e-3)
    one_step(m, opt)
    assert math.isfinite(off.stats()["planned_dram_peak"])
    with pytest.raises(NotImplementedError, match="optimizer's state"):
        opt.state_dict()
    off.close()


def test_torch_clip_refused_when_streamed(tmp_path):
    """torch's clip_grad_norm_ reads streamed gradients as zeros (they are on NVMe): refused at step()."""
    m = make("gpt2", layers=2)
    off = mt.offload(m, nvme_dir=tmp_path, weights="nvme", threads=1)
    opt = off.optimizer(lr=1e-3)
    x = batches(1)[0]
    m(input_ids=x, labels=x).loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    with pytest.raises(RuntimeError, match=r"written after the last backward.*memwall\.torch\.clip_grad_norm_"):
        opt.step()
    off.close(restore=False)
    # Resident weights: the gradients are in DRAM at step(), so torch's clipping applies as usual.
    m = make("gpt2", layers=2)
    off = mt.offload(m, nvme_dir=tmp_path / "r", weights="dram", threads=1)
    opt = off.optimizer(lr=1e-3)
    m(input_ids=x, labels=x).loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1e-3)
    opt.step()
    off.close()
