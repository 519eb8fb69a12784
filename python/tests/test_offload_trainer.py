"""memwall.torch.offload under transformers' Trainer (issue 25 item 4: "where users are"): the model
offloaded before training, `optimizers=(off.optimizer(...), scheduler)`, a checkpoint saved by the
Trainer and `train(resume_from_checkpoint=...)` into a fresh process-like setup (a new model, a new
offload on a new NVMe directory): OffloadAdamW.state_dict() holds the session's moments and step
count by content, load_state_dict() writes them back, the LR scheduler drives the session's lr
through the param group. Checked: the resumed run's final weights are the uninterrupted run's, bit
for bit, and its logged losses are the same; the learning rate the scheduler set is the one used
(a run whose scheduler keeps lr at 0 leaves the weights as they started).

Clipping by the global norm is the optimizer's (off.optimizer(max_grad_norm=0.5): the session clips
inside the update) and the Trainer's is off (max_grad_norm=0): the Trainer clips through accelerate,
which writes p.grad after backward; with streamed weights the gradients are on NVMe by then (offload
refuses it, docs/python.md)."""
import pytest
import torch

import memwall.torch as mt
import offload_child as child

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

STEPS, ACCUM, BATCH = 4, 2, 2


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(5)
        self.x = torch.randint(0, child.VOCAB, (n, 12), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def run(tmp_path, tag, resume_from=None, lr=3e-3):
    model = child.make_model()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    off = mt.offload(model, nvme_dir=tmp_path / f"nvme-{tag}", grad_accum=ACCUM, prefetch=1, subgroup_size=4096,
                     threads=1)
    opt = off.optimizer(lr=lr, betas=(0.9, 0.95), weight_decay=0.1, max_grad_norm=0.5)
    sched = transformers.get_linear_schedule_with_warmup(opt, 1, STEPS)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=BATCH, gradient_accumulation_steps=ACCUM,
        max_steps=STEPS, save_strategy="steps", save_steps=2, logging_steps=1, max_grad_norm=0.0, use_cpu=True,
        report_to=[], seed=0, dataloader_num_workers=0, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens(STEPS * ACCUM * BATCH),
                                   optimizers=(opt, sched))
    trainer.train(resume_from_checkpoint=resume_from)
    assert off.steps == STEPS
    final = {k: v.clone() for k, v in model.state_dict().items()}
    logged = {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}
    off.close()
    return start, final, logged


def test_trainer_checkpoint_resumes_bitwise(tmp_path):
    start, final, logged = run(tmp_path, "a")
    assert sorted(logged) == list(range(1, STEPS + 1)), logged
    assert any(not torch.equal(final[k], start[k]) for k in final)
    ckpt = tmp_path / "out" / "checkpoint-2"
    assert (ckpt / "optimizer.pt").exists()
    saved = torch.load(ckpt / "optimizer.pt", weights_only=True)
    assert saved["memwall_offload"]["steps"] == 2 and saved["memwall_offload"]["exp_avg_sq"].abs().sum() > 0
    _, resumed, logged2 = run(tmp_path, "b", resume_from=str(ckpt))
    for k, v in final.items():
        assert torch.equal(resumed[k].view(torch.int32), v.view(torch.int32)), k
    assert logged2 == logged  # steps 1-2 from the checkpoint's trainer_state.json, 3-4 run again


def test_scheduler_drives_the_session_lr(tmp_path):
    start, final, _ = run(tmp_path, "z", lr=0.0)  # lr 0 from the scheduler's base: AdamW moves nothing
    for k, v in final.items():
        assert torch.equal(v, start[k]), k
