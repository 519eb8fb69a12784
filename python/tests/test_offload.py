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
  an unknown activations= place, backward passes that do not match grad_accum, units that miss parameters,
  torch's clip_grad_norm_ on streamed gradients (they are on NVMe by then).
- A model built on the meta device with weights_from=DIR (fp32, bf16, fp16, sharded checkpoints): the
  logits, buffers (rotary inv_freq), losses and trained weights bitwise those of from_pretrained(DIR)
  offloaded the same way, each tensor read once; its refusals. The tied head's alias; the lean head and
  embedding (the head's weights trimmed chunk by chunk) against the path without them. The example
  examples/hf_finetune.py runs.
"""
import math

import pytest
import torch

import memwall
import memwall.torch as mt
from memwall._weights import SafetensorsWeights

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
    # With accumulation the gradients are in DRAM through the step: the update reads them there and
    # none goes to NVMe (same bits, above). Without accumulation they are written as backward finishes
    # them: the same code (src/train/stream.c) that tests/cli_train_stream.sh checks bitwise at 1.
    assert st["steps"] == STEPS + 1 and st["weight_bytes_fetched"] > 0 and st["grad_bytes_written"] == 0, st
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


def test_optimizer_max_grad_norm(tmp_path):
    """off.optimizer(max_grad_norm=c) clips every step inside the update (for loops such as transformers'
    Trainer that cannot call memwall.torch.clip_grad_norm_): bitwise the loop that calls it each step; a
    call in a step takes precedence; a bad value is refused."""
    finals = []
    for how in ("call", "optimizer"):
        m = make("llama")
        off = mt.offload(m, nvme_dir=tmp_path / how, weights="nvme", prefetch=1, threads=1, subgroup_size=4096)
        opt = off.optimizer(lr=LR, max_grad_norm=0.05 if how == "optimizer" else None)
        norms = []
        for x in batches(4):
            m(input_ids=x, labels=x).loss.backward()
            if how == "call":
                norms.append(float(mt.clip_grad_norm_(m.parameters(), 0.05)))
            opt.step()
        finals.append({k: v.clone() for k, v in m.state_dict().items()})
        if how == "call":
            assert min(norms) > 0.05  # the clipping acted in every step
        off.close(restore=False)
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])
    m = make("llama")
    off = mt.offload(m, nvme_dir=tmp_path / "bad", weights="nvme", threads=1)
    with pytest.raises(ValueError, match="max_grad_norm=0"):
        off.optimizer(max_grad_norm=0)
    off.close(restore=False)


def test_budget_picks_the_knobs(tmp_path):
    """dram_budget with subgroup_size/buffer_count left to memwall: a budget the defaults (4 Mi-element
    subgroups, 8 staging buffers) are over, but smaller knobs fit, runs with those (as memwall train
    --dram-budget does); the same numbers as the defaults' run."""
    T = transformers
    torch.manual_seed(0)
    cfg = T.LlamaConfig(vocab_size=32768, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                        tie_word_embeddings=True)  # 8.4 M parameters: two 4 Mi-element subgroups and more
    peaks = {}
    for name, kw in (("defaults", {}), ("small", dict(subgroup_size=256 << 10, buffer_count=3))):
        m = T.LlamaForCausalLM(cfg)
        off = mt.offload(m, nvme_dir=tmp_path / name, weights="nvme", prefetch=1, threads=1, **kw)
        st = off.stats()
        peaks[name] = (st["planned_dram_peak"], st["subgroup_size"])
        off.close(restore=False)
    assert peaks["defaults"][1] == 4 << 20 and peaks["small"][1] == 256 << 10
    (big, _), (small, _) = peaks["defaults"], peaks["small"]
    assert big - small > (64 << 20), peaks  # room for a budget between them, above the fit's margin
    budget = (big + small) // 2
    m = T.LlamaForCausalLM(cfg)
    off = mt.offload(m, nvme_dir=tmp_path / "budget", weights="nvme", prefetch=1, threads=1, dram_budget=budget)
    st = off.stats()
    assert small <= st["planned_dram_peak"] <= budget < big, (st, budget)  # fewer buffers or smaller subgroups
    x = torch.randint(0, 32768, (1, 8), generator=torch.Generator().manual_seed(0))
    opt = off.optimizer(lr=1e-3)
    m(input_ids=x, labels=x).loss.backward()
    opt.step()
    off.close(restore=False)
    with pytest.raises(memwall.MemwallError, match="too small"):  # given knobs are kept: the plan refuses
        mt.offload(T.LlamaForCausalLM(cfg), nvme_dir=tmp_path / "given", weights="nvme", prefetch=1, threads=1,
                   dram_budget=budget, subgroup_size=4 << 20, buffer_count=8)


def test_grads_kept_by_budget(tmp_path):
    """Without accumulation, a dram_budget with room keeps each step's gradients in DRAM for the update
    (no write to NVMe and read back; zeroed in place after it) and the update hands the next forward its
    new weights: bitwise the run without a budget (gradients through NVMe), an evaluation pass before a
    step and a skipped step (inf gradients) included."""
    runs = {}
    for name, budget in (("plain", None), ("kept", 8 << 30)):
        model = make("llama")
        off = mt.offload(model, nvme_dir=tmp_path / name, weights="nvme", prefetch=1, subgroup_size=4096,
                         threads=1, dram_budget=budget)
        opt = off.optimizer(lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
        data = batches(6)
        losses, norms = [], []
        for t in range(5):
            x = data[t]
            loss = model(input_ids=x, labels=x).loss
            if t == 3:
                loss = loss * float("inf")  # a skipped step: the gradients are not zeroed by an update
            loss.backward()
            losses.append(loss.item())
            if t == 1:  # a pass after the backward, before the step: the weights before the update
                with torch.no_grad():
                    losses.append(model(input_ids=data[-1], labels=data[-1]).loss.item())
            norms.append(mt.clip_grad_norm_(model.parameters(), CLIPS[t % 2]).item())
            opt.step()
            opt.zero_grad()
        runs[name] = (losses, norms, {k: v.clone() for k, v in model.state_dict().items()}, off.stats())
        off.close(restore=False)
    (la, na, wa, sa), (lb, nb, wb, sb) = runs["plain"], runs["kept"]
    assert [bits(torch.tensor(v)) for v in la] == [bits(torch.tensor(v)) for v in lb]
    assert [bits(torch.tensor(v)) for v in na] == [bits(torch.tensor(v)) for v in nb]
    for k in wa:
        assert torch.equal(bits(wa[k]), bits(wb[k])), k
    assert sa["grads_kept_in_dram"] == 0 and sa["grad_bytes_written"] > 0, sa
    assert sb["grads_kept_in_dram"] == 1 and sb["grad_bytes_written"] == 0, sb
    assert sa["weight_bytes_handed_over"] > 0 and sb["weight_bytes_handed_over"] > 0, (sa, sb)


def test_refusals(tmp_path):
    m = make("llama", layers=2)
    with pytest.raises(ValueError, match="activations='disk': use 'dram', 'nvme'"):
        mt.offload(m, nvme_dir=tmp_path, activations="disk")  # "nvme": test_offload_acts.py
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
    sd = opt.state_dict()  # by content (test_offload_trainer.py resumes through it)
    assert sd["memwall_offload"]["steps"] == 1 and [tuple(u) for u in sd["memwall_offload"]["units"]] == off.units
    with pytest.raises(ValueError, match="OffloadAdamW.state_dict"):
        opt.load_state_dict(torch.optim.AdamW(m.parameters()).state_dict())
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


# ---------------------------------------------------------------- a model built on the meta device

def meta_model(path):
    """The model of a checkpoint directory with no values anywhere: its parameters and buffers on the meta device."""
    cfg = transformers.AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)


def save_dir(kind, tmp_path, dtype, shard):
    m = make(kind)
    if kind == "llama":  # llama3 rope scaling: inv_freq is computed by a rope function, not the default one
        m.config.rope_parameters = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 16}
    path = tmp_path / f"{kind}-{str(dtype)[6:]}"
    m.to(dtype).save_pretrained(path, **({"max_shard_size": "20KB"} if shard else {}))
    return path


@pytest.mark.parametrize("kind,dtype,shard", [("llama", torch.bfloat16, False), ("qwen2", torch.float32, True),
                                              ("gpt2", torch.float16, False)])
def test_meta_model_weights_from(kind, dtype, shard, tmp_path, monkeypatch):
    """offload(meta model, weights_from=DIR) == offload(from_pretrained(DIR)), bitwise: the logits before
    training (also against the ordinary model), 3 steps of losses, the trained weights; the buffers
    (rotary inv_freq) as from_pretrained computes them; tied weights read once; never whole in DRAM."""
    path = save_dir(kind, tmp_path, dtype, shard)
    assert (path / "model.safetensors.index.json").exists() == shard
    x = batches(1, seed=3)[0]
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        want = ref.eval()(input_ids=x).logits
    ref_bufs = {k: v.clone() for k, v in ref.named_buffers()}
    reads = {}
    orig = SafetensorsWeights.read_into

    def counting(self, key, dst):
        reads[key] = reads.get(key, 0) + 1
        return orig(self, key, dst)

    monkeypatch.setattr(SafetensorsWeights, "read_into", counting)
    runs = {}
    for how in ("from_pretrained", "meta"):
        for weights in ("nvme", "dram"):
            reads.clear()
            if how == "meta":
                m = meta_model(path)
                assert all(p.is_meta for p in m.parameters())
                off = mt.offload(m, nvme_dir=tmp_path / f"{how}-{weights}", weights=weights, weights_from=path,
                                 prefetch=1, subgroup_size=4096, threads=1)
                assert len(reads) == len(list(m.parameters())) and set(reads.values()) == {1}, reads  # tied: once
                assert all(not p.is_meta for p in m.parameters()) and not any(b.is_meta for b in m.buffers())
                for k, v in m.named_buffers():
                    assert torch.equal(v, ref_bufs[k]), k
            else:
                m = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
                off = mt.offload(m, nvme_dir=tmp_path / f"{how}-{weights}", weights=weights, prefetch=1,
                                 subgroup_size=4096, threads=1)
                assert not reads
            if kind != "qwen2":
                assert m.lm_head.weight is m.get_input_embeddings().weight
            m.eval()
            with torch.no_grad():
                logits = m(input_ids=x).logits
            m.train()
            opt = off.optimizer(lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
            losses = []
            for xb in batches(1, seed=4) * 3:  # one batch thrice: the loss falls
                loss = m(input_ids=xb, labels=xb).loss
                loss.backward()
                losses.append(loss.item())
                opt.step()
            trained = {k: v.clone() for k, v in m.state_dict().items()}
            st = off.stats()
            if weights == "nvme":
                assert 0 < st["weights_resident_peak"] < 4 * st["n_params"], st
            off.close(restore=False)
            runs[how, weights] = (logits, losses, trained)
    base = runs["from_pretrained", "nvme"]
    assert torch.equal(base[0], want)
    assert base[1][-1] < base[1][0]
    for key, (logits, losses, trained) in runs.items():
        assert torch.equal(logits, want), f"{key}: logits differ from from_pretrained's"
        assert losses == base[1], f"{key}: losses {losses} != {base[1]}"
        assert trained.keys() == base[2].keys()
        for k in trained:
            assert torch.equal(bits(trained[k]), bits(base[2][k])), f"{key}: {k}"


def test_meta_model_refusals(tmp_path):
    path = save_dir("qwen2", tmp_path, torch.bfloat16, False)
    m = meta_model(path)
    with pytest.raises(ValueError, match=r"parameters are on the meta device .*weights_from=DIR"):
        mt.offload(m, nvme_dir=tmp_path / "a")
    assert all(p.is_meta for p in m.parameters())
    with pytest.raises(FileNotFoundError, match="does not exist"):
        mt.offload(m, nvme_dir=tmp_path / "a", weights_from=tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="neither model.safetensors nor model.safetensors.index.json"):
        mt.offload(m, nvme_dir=tmp_path / "a", weights_from=tmp_path / "empty")
    # A checkpoint of another configuration: refused before anything is written, the model as it was.
    other = make("qwen2", layers=2)
    other.save_pretrained(tmp_path / "other")
    with pytest.raises(ValueError, match=r"2 parameters are not in weights_from|not in weights_from"):
        mt.offload(m, nvme_dir=tmp_path / "a", weights_from=tmp_path / "other")
    assert all(p.is_meta for p in m.parameters())
    wide = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=False, use_sliding_window=False))
    wide.save_pretrained(tmp_path / "wide")
    with pytest.raises(ValueError, match=r"is \[128, 64\] in the model but .* is \[256, 64\]"):
        mt.offload(m, nvme_dir=tmp_path / "a", weights_from=tmp_path / "wide")
    assert all(p.is_meta for p in m.parameters())
    # A budget too small: refused up front, the parameters back on the meta device.
    with pytest.raises(memwall.MemwallError, match="DRAM budget"):
        mt.offload(m, nvme_dir=tmp_path / "a", weights_from=path, dram_budget=1 << 20)
    assert all(p.is_meta for p in m.parameters())
    # An extra tensor in the checkpoint: warned about, not silently dropped.
    from safetensors.torch import load_file, save_file
    sd = load_file(path / "model.safetensors")
    sd["stray.weight"] = torch.zeros(3)
    (tmp_path / "extra").mkdir()
    save_file(sd, tmp_path / "extra" / "model.safetensors", metadata={"format": "pt"})
    with pytest.warns(RuntimeWarning, match=r"1 tensors of .* match no parameter or buffer .*stray\.weight"):
        off = mt.offload(m, nvme_dir=tmp_path / "a", weights_from=tmp_path / "extra", threads=1)
    off.close(restore=False)


def test_tied_head_alias(tmp_path):
    """A tied head uses its unit's weights through an alias: autograd gives the embedding's parameter the
    lookup's gradient only (it does not hold the head's, vocabulary x width, through the whole backward
    to sum it), the offload adds the head's in, and p.grad is torch's sum. The model's parameters are its
    own again after the head's forward, and after a forward that raised inside the head."""
    ref = make("llama")
    x = batches(1)[0]
    ref(input_ids=x, labels=x).loss.backward()
    want = ref.model.embed_tokens.weight.grad.clone()
    m = make("llama")
    W = m.model.embed_tokens.weight
    off = mt.offload(m, nvme_dir=tmp_path, weights="dram", threads=1)
    in_head, arrived = [], []
    h = m.lm_head.register_forward_pre_hook(lambda mod, args: in_head.append(mod.weight is W))
    W.register_hook(lambda g: arrived.append(g.clone()))
    m(input_ids=x, labels=x).loss.backward()
    assert in_head == [False] and m.lm_head.weight is W
    # the lookup's part only, sparse (the lean host path: nn.Embedding.sparse while offloaded)
    assert len(arrived) == 1 and arrived[0].is_sparse and not torch.allclose(arrived[0].to_dense(), want)
    torch.testing.assert_close(W.grad, want, rtol=1e-5, atol=1e-7)
    opt = off.optimizer(lr=1e-3)
    opt.step()
    h.remove()

    def boom(mod, args):
        raise ValueError("boom")

    h = m.lm_head.register_forward_pre_hook(boom)
    with pytest.raises(ValueError, match="boom"):
        m(input_ids=x, labels=x)
    assert m.lm_head.weight is not W  # the alias, until the next forward or close()
    h.remove()
    m(input_ids=x, labels=x).loss.backward()  # the next forward puts the parameter back first
    assert m.lm_head.weight is W
    opt.step()
    h = m.lm_head.register_forward_pre_hook(boom)
    with pytest.raises(ValueError, match="boom"):
        m(input_ids=x, labels=x)
    off.close()  # and close() does
    assert m.lm_head.weight is W and not any(hasattr(p, "_memwall_alias_of") for p in m.parameters())
    assert "forward" not in m.lm_head.__dict__ and not m.model.embed_tokens.sparse  # the model's own again
    h.remove()
    m(input_ids=x, labels=x).loss.backward()  # an ordinary model again


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_lean_head_and_embedding(kind, tmp_path, monkeypatch):
    """The lean host path (_offload.py's design note) against the path without it (MEMWALL_OFFLOAD_LEAN=0),
    for a tied head (llama) and an untied one (qwen2): the head's backward in vocabulary chunks (24 rows
    here: 6 chunks of the 128), its weights trimmed chunk by chunk when streamed, the embedding's gradient
    sparse. The same losses within 1e-5 and weights within 1 % of how far they moved (the rounding
    differs); each trim has left the whole subgroups it covers reading zeros (gone) and the rest of the
    head's weights in place, before the unit's release; close() gives the modules back as they were.
    Without accumulation the forward drops the head's weights too, and streamed == resident, bitwise."""
    from memwall import _lib, _offload
    monkeypatch.setattr(_offload, "_HEAD_CHUNK_BYTES", 4 * 64 * 24)
    monkeypatch.setattr(_offload, "_HEAD_OVER_LOSS", 0.5)  # 64 of the 128 rows: llama's first subgroup
    L = _lib.lib()
    trim, seen, cur = L.mw_pysession_unit_trim, [], []

    def spy(h, u, first, n, flags):
        rc = trim(h, u, first, n, flags)
        off, head = cur
        w, end = off._flat_params, off._grad_off(head) + head.numel()
        lo, hi = -(-first // 4096) * 4096, (first + n) // 4096 * 4096  # the 4096-element subgroups inside,
        if first + n == w.numel():  # and the model's last one, shorter
            hi = first + n
        seen.append((u, first - off._grad_off(head), n, int((w[lo:hi] != 0).sum()), int((w[max(hi, lo):end] != 0).sum()),
                     hi < end))
        return rc

    monkeypatch.setattr(L, "mw_pysession_unit_trim", spy)
    out = {}
    for lean in (True, False):
        monkeypatch.setenv("MEMWALL_OFFLOAD_LEAN", "1" if lean else "0")
        m = make(kind)
        off = mt.offload(m, nvme_dir=tmp_path / str(lean), weights="nvme", grad_accum=2, prefetch=1,
                         subgroup_size=4096, threads=1)
        head = m.lm_head.weight
        cur[:] = [off, head]
        assert m.model.embed_tokens.sparse == lean and ("forward" in m.lm_head.__dict__) == lean
        opt = off.optimizer(lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
        losses = []
        for x in batches(6):
            loss = m(input_ids=x, labels=x).loss
            (loss / 2).backward()
            losses.append(loss.item())
            if len(losses) % 2 == 0:
                opt.step()
                opt.zero_grad()
        out[lean] = (losses, {k: v.clone() for k, v in m.state_dict().items()})
        units = off.units
        off.close()
        assert not m.model.embed_tokens.sparse and "forward" not in m.lm_head.__dict__
    head_unit = 0 if kind == "llama" else len(units) - 1
    assert len(seen) == 6 * 6, seen  # 6 chunks in each of the 6 backward passes, none without lean
    assert [(u, f, n) for u, f, n, _, _, _ in seen[:6]] == [(head_unit, 0, 64 * r) for r in (24, 48, 72, 96, 120, 128)]
    for u, first, n, left, kept, more in seen:
        assert left == 0, f"a trim of {n} weights left {left} in its whole subgroups"
        assert kept > 0 or not more, f"a trim of {n} weights took those after it too"
    assert any(left == 0 and n >= 4096 for _, _, n, left, _, _ in seen)  # some subgroup went
    torch.testing.assert_close(out[True][0], out[False][0], rtol=1e-5, atol=1e-6)
    # Without accumulation the head's weights also go at the end of its forward (MW_PYSESSION_TRIM_NOW), and its
    # backward reads them again: bitwise the resident run still.
    seen.clear()
    monkeypatch.setenv("MEMWALL_OFFLOAD_LEAN", "1")
    acc1 = {}
    for weights in ("nvme", "dram"):
        m = make(kind)
        off = mt.offload(m, nvme_dir=tmp_path / f"acc1-{weights}", weights=weights, prefetch=1, subgroup_size=4096,
                         threads=1)
        cur[:] = [off, m.lm_head.weight]
        opt = off.optimizer(lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
        losses = []
        for x in batches(3):
            losses.append(m(input_ids=x, labels=x).loss)
            losses[-1].backward()
            opt.step()
            opt.zero_grad()
        acc1[weights] = ([v.item() for v in losses], {k: v.clone() for k, v in m.state_dict().items()})
        off.close()
    assert acc1["nvme"][0] == acc1["dram"][0], acc1
    assert all(torch.equal(bits(v), bits(acc1["dram"][1][k])) for k, v in acc1["nvme"][1].items())
    assert len(seen) == 3 * 7 and all(left == 0 for _, _, _, left, _, _ in seen), seen  # 3 x (forward, 6 chunks)
    assert [n for _, _, n, _, _, _ in seen[:7]] == [4096] + [64 * r for r in (24, 48, 72, 96, 120, 128)], seen[:7]
    if kind == "llama":  # the forward's trim took a whole subgroup (its rows read zeros until the backward)
        assert seen[0][:2] == (0, 0) and seen[0][4] > 0, seen[0]
    start = make(kind).state_dict()
    for k, v in out[False][1].items():  # AdamW moves a weight whose gradient is ~0 by lr either way: relative
        moved, apart = (v - start[k]).abs().max().item(), (out[True][1][k] - v).abs().max().item()
        assert moved > 0 and apart <= 0.01 * moved, f"{k}: {apart:.3g} apart, moved {moved:.3g}"


def test_hf_finetune_example(tmp_path):
    """examples/hf_finetune.py runs (the model on the meta device, weights_from its directory), streamed,
    and its saved model loads in transformers."""
    pytest.importorskip("tokenizers")
    import os
    import subprocess
    import sys
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    model = tmp_path / "tiny"
    text = tmp_path / "text.txt"
    with open(os.path.join(root, "data", "kjv_excerpt.txt"), encoding="utf-8") as f:
        text.write_text(f.read(60000), encoding="utf-8")
    torch.manual_seed(0)  # a directory as scripts/make_hf_model.py writes it: bf16 weights, a byte-level BPE
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True)).to(torch.bfloat16).save_pretrained(model)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train([str(text)], trainers.BpeTrainer(vocab_size=512, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                               show_progress=False))
    tok.save(str(model / "tokenizer.json"))
    env = dict(os.environ, OMP_NUM_THREADS="1")

    def example(steps, nvme, save, *more):
        r = subprocess.run([sys.executable, os.path.join(root, "examples", "hf_finetune.py"), "--model", str(model),
                            "--data", str(text), "--steps", str(steps), "--seq", "32", "--grad-accum", "2", "--threads",
                            "1", "--nvme-dir", str(tmp_path / nvme), "--save", str(tmp_path / save), *more],
                           capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        return r.stdout

    out = example(2, "nvme", "tuned")
    assert "step    2  loss" in out and "loaded into memwall" in out
    tuned = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "tuned", dtype=torch.float32)
    start = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    assert not torch.equal(tuned.model.embed_tokens.weight, start.model.embed_tokens.weight)
    # --resume continues the committed run in --nvme-dir: steps 3-4 after steps 1-2 == 4 steps at once
    out = example(4, "nvme", "resumed", "--resume")
    assert "resumed at step 2" in out and "step    3  loss" in out and "step    1  loss" not in out
    example(4, "nvme-once", "once")
    a = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "resumed", dtype=torch.float32).state_dict()
    b = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "once", dtype=torch.float32).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in b)
