"""Context parallelism on CPU (gloo, fp32): how far CP=2 (padded, packed) and TP=2 x CP=2 are from transformers' logits
and from CP=1's training (old log-probs, loss and grad norm of two Adam steps, the log-probs after them), with wall
times. The numbers of docs/backends.md "Context parallelism"; the same rank functions as
tests/megatron/test_context_parallel.py (which asserts the bounds).

    PYTHONPATH=$PWD .venv/bin/python bench/bench_context_parallel.py [qwen3_next | qwen3_5]

With an arch, the tiny checkpoint of tests/megatron/_dist.py's TINY for it (gated delta net layers: the numbers of
tests/megatron/test_linear_attention_cp.py, with its ARCH_FLAGS); the logits against transformers for qwen3_next only
(qwen3_5's checkpoint is the vision-language layout), TP=2 x CP=2 for qwen3_5 only (MoE under TP needs sequence
parallelism, which needs TransformerEngine).
"""
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "megatron"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from _dist import TINY, run_ranks  # noqa: E402
from test_context_parallel import CP2, PACKED, logits_rank  # noqa: E402
from test_trainer_common import flat  # noqa: E402
from test_trainer_parallel import parallel_case  # noqa: E402


def _max_diff(results, single, key):
    return max((flat(r[key]) - flat(single[key])).abs().max().item() for r in results)


def _metric_diff(results, single, key):
    return max(abs(r["metrics"][s][key] - single["metrics"][s][key]) for r in results for s in range(2))


def main(arch=None):
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    base = ()
    if arch is None:
        ckpt = build_tiny_checkpoint(tempfile.mkdtemp() + "/tiny")
    else:
        from test_linear_attention_cp import ARCH_FLAGS

        ckpt, base = build_tiny_checkpoint(tempfile.mkdtemp() + "/" + arch, init_std=0.1, **TINY[arch]), ARCH_FLAGS[arch]
    for packed in (False, True) if arch in (None, "qwen3_next") else ():
        print(f"CP=2 logits vs transformers, packed={packed}: {max(run_ranks(logits_rank, 2, ckpt, packed)):.2e}")
    start = time.time()
    single = run_ranks(parallel_case, 1, ckpt, 1, 1, base)[0]
    print(f"CP=1 {time.time() - start:.0f} s")
    layouts = [("CP=2", 2, 1, CP2), ("CP=2 packed", 2, 1, CP2 + PACKED)]
    if arch != "qwen3_next":
        layouts.append(("TP=2 x CP=2", 4, 2, CP2))
    for name, world, tp, extra in layouts:
        start = time.time()
        results = run_ranks(parallel_case, world, ckpt, tp, 1, extra + base, timeout=600)
        print(f"{name}: old log-probs {_max_diff(results, single, 'old'):.2e}, loss "
              f"{_metric_diff(results, single, 'loss'):.2e}, grad norm {_metric_diff(results, single, 'grad_norm'):.2e}, "
              f"log-probs after 2 Adam steps {_max_diff(results, single, 'new'):.2e} ({time.time() - start:.0f} s)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
