"""SFT as a mode of train.py (slime's sft_rollout recipe flags): the NLL of the answers falls."""
import pytest

import train
from conftest import loop_argv
from slime_like.utils.metrics import read_metrics

pytestmark = pytest.mark.slow


def test_sft_with_train_py_lowers_the_answer_nll(tiny_ckpt, toy_prompts, tmp_path):
    argv = loop_argv(tiny_ckpt, toy_prompts[0], tmp_path, "--colocate", "--actor-num-gpus-per-node", "1",
                     "--rollout-function-path", "slime.rollout.sft_rollout.generate_rollout",
                     "--loss-type", "sft_loss", "--disable-compute-advantages-and-returns", "--debug-train-only",
                     "--n-samples-per-prompt", "1", "--rollout-batch-size", "16", "--micro-batch-size", "16",
                     "--num-rollout", "4")
    assert train.main(argv) == 0
    rows = [r for r in read_metrics(str(tmp_path / "metrics.jsonl")) if r["rollout_id"] >= 0]
    losses = [r["actor/sft_loss"] for r in rows]
    assert len(losses) == 4 and losses[-1] < losses[0] - 0.3, losses
    assert all("rollout/logprob_abs_diff" not in r for r in rows)     # no RL passes with --disable-compute-...
