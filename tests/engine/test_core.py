"""The decoding core in-process (no HTTP): continuous batching must not change any request's result.

Requests arrive while others decode, so rows are prefilled separately, merged into the running cache with
different left padding, and dropped as they finish; every greedy output must still equal transformers'
own greedy continuation of that prompt alone. Run for several architectures.
"""
import threading
import time

import pytest
import torch

from engine_helpers import hf_greedy
from slime_like.backends.cpu_engine.engine import CPUEngine, Request
from slime_like.backends.cpu_engine.sampling import SamplingParams

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22], [3], [40, 41, 42]]
# The first request decodes long enough that every other one arrives while it runs (on a quiet machine a tiny
# model finishes 6 tokens faster than a fixed sleep); the lengths differ so rows finish at different steps.
LENGTHS = [200, 6, 9, 12, 15]


def _wait_for(condition, seconds=30.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the engine made no progress"
        time.sleep(0.001)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama"])
def test_staggered_arrivals_match_transformers(arch, tmp_path):
    from transformers import AutoModelForCausalLM

    from slime_like.tools.tiny_model import build_tiny_checkpoint

    ckpt = build_tiny_checkpoint(str(tmp_path / arch), arch=arch, init_std=0.2, seed=3)
    eng = CPUEngine(ckpt, max_running_requests=3)  # fewer slots than requests: some wait for a free row
    done, lock, all_done = [], threading.Lock(), threading.Event()

    def on_done(r):
        with lock:
            done.append(r)
            if len(done) == len(PROMPTS):
                all_done.set()
    try:
        for i, p in enumerate(PROMPTS):
            steps = eng.stats["decode_steps"]
            eng.submit(Request(p, SamplingParams(temperature=0, max_new_tokens=LENGTHS[i], ignore_eos=True),
                               rid=str(i), on_done=on_done))
            _wait_for(lambda: eng.stats["decode_steps"] > steps)  # the next one arrives mid-decode
        assert all_done.wait(60)
    finally:
        eng.shutdown()
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    assert eng.stats["prefill_calls"] >= 2 and eng.stats["max_batch_size"] >= 2
    for r in sorted(done, key=lambda r: int(r.rid)):
        p = PROMPTS[int(r.rid)]
        assert r.output_ids == hf_greedy(model, p, len(r.output_ids)), (arch, r.rid)
        assert r.finish_reason == {"type": "length", "length": LENGTHS[int(r.rid)]}
