"""The training loop the resume tests run in a child process (and the reference in the test's own):
a small random-initialised LlamaForCausalLM offloaded with its weights streamed and the optimizer on
NVMe, accumulation 2, trained to step N from wherever the session's committed state is.

Why a script: a test kills it with SIGKILL at an arbitrary instant, which only a separate process
allows. Every loss is printed as float.hex() the moment it is known, and "stepped s" once step()
returned (the update of step s then runs behind the next forward pass), so the test can compare the
bits of every segment's losses with an uninterrupted run and aim kills at the update in flight.

    python3 offload_child.py NVME_DIR N OUT.pt [fresh|resume|auto] [TRACE]

MEMWALL_TEST_KILL="F,G" (the tests): the child kills itself with SIGKILL after the line at fraction F
of the lines it has still to print before its last step, G times its own average line time later
(G < 1), and never once its last step is done. In the child, not in the reader: a reader on a loaded
machine reads the lines late, and a kill it times from them could land after the run's end.
"""
import os
import signal
import sys
import threading
import time

import torch

VOCAB, ACCUM, LR, WD, BETAS = 96, 2, 3e-3, 0.1, (0.9, 0.95)


def make_model():
    import transformers as T
    torch.manual_seed(0)
    cfg = T.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                        tie_word_embeddings=True)
    return T.LlamaForCausalLM(cfg)


def batch(step, micro):
    """The data of micro-batch `micro` of step `step` (0-based): a function of the position only, so a
    resumed run draws what the uninterrupted one drew."""
    g = torch.Generator().manual_seed(1000 * step + micro)
    return torch.randint(0, VOCAB, (2, 12), generator=g)


def open_offload(model, nvme_dir, resume=False, trace=None, weights="nvme"):
    import memwall.torch as mt
    return mt.offload(model, nvme_dir=nvme_dir, weights=weights, optimizer="nvme", grad_accum=ACCUM, prefetch=1,
                      subgroup_size=4096, threads=1, resume=resume, trace=trace)


def train(model, off, n_steps, say=print):
    """Steps off.steps .. n_steps-1; say(line) for every loss (float.hex) and finished step."""
    opt = off.optimizer(lr=LR, betas=BETAS, eps=1e-8, weight_decay=WD)
    for t in range(off.steps, n_steps):
        for a in range(ACCUM):
            x = batch(t, a)
            loss = model(input_ids=x, labels=x).loss
            (loss / ACCUM).backward()
            say(f"loss {t} {a} {loss.item().hex()}")
        opt.step()
        say(f"stepped {t + 1}")
    off.finish()


def main():
    torch.set_num_threads(1)
    nvme, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    mode = sys.argv[4] if len(sys.argv) > 4 else "fresh"
    trace = sys.argv[5] if len(sys.argv) > 5 else None
    model = make_model()
    off = open_offload(model, nvme, resume={"fresh": False, "resume": True, "auto": "auto"}[mode], trace=trace)

    kill = os.environ.get("MEMWALL_TEST_KILL")
    state = {"seen": -1, "target": None, "timer": None, "gap": 0.0, "t0": time.monotonic()}
    if kill:
        frac, state["gap"] = (float(x) for x in kill.split(","))
        state["target"] = int(frac * max((n - 1 - off.steps) * (1 + ACCUM), 1))

    def say(line):
        print(line, flush=True)
        state["seen"] += 1
        if state["target"] is not None and state["seen"] == state["target"] + 1:  # line 0 is "start"
            pace = (time.monotonic() - state["t0"]) / state["seen"]
            state["timer"] = threading.Timer(state["gap"] * pace, os.kill, (os.getpid(), signal.SIGKILL))
            state["timer"].start()
        if line == f"stepped {n}" and state["timer"] is not None:
            state["timer"].cancel()  # the end of the run is not what the tests are about

    say(f"start {off.steps}")
    train(model, off, n, say)
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, out)
    off.close()
    say("done")


if __name__ == "__main__":
    main()
