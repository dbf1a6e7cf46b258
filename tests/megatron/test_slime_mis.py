"""slime's examples/train_infer_mismatch_helper runs unchanged: mis.py through --custom-tis-function-path, its
mis.yaml through --custom-config-path (slime's keys become attributes the function reads, use_tis a flag), and the
`slime.backends.megatron_utils.cp_utils` import inside it resolved to slime_like's names. Needs a slime checkout
(SLIME_SRC=/path/to/slime): its code is not part of this repository."""
import math
import os
import sys

import pytest
from _dist import run_ranks
from test_trainer_common import BASE_FLAGS, make_args, make_batch

SLIME_SRC = os.environ.get("SLIME_SRC", "")
MIS_DIR = os.path.join(SLIME_SRC, "examples", "train_infer_mismatch_helper")
pytestmark = pytest.mark.skipif(not os.path.isfile(os.path.join(MIS_DIR, "mis.py")),
                                reason="set SLIME_SRC to a checkout of THUDM/slime (examples/ are read unchanged)")


def _flags():
    return ["--global-batch-size", "8", "--micro-batch-size", "4", "--lr", "3e-3",
            "--custom-config-path", os.path.join(MIS_DIR, "mis.yaml"),
            "--custom-tis-function-path", "mis.compute_mis_weights_with_cp"]


def _args(ckpt):
    if MIS_DIR not in sys.path:
        sys.path.insert(0, MIS_DIR)
    return make_args(ckpt, *_flags())


def mis_case(rank, world_size, port, ckpt):
    from slime_like.args import role_args
    from slime_like.backends.megatron.trainer import MegatronTrainer

    args = _args(ckpt)
    t = MegatronTrainer(role_args(args, "actor"), role="actor", rank=rank, world_size=world_size, master_port=port)
    batch = make_batch(8, seed=7)
    batch.update(t.compute_log_probs(batch))
    batch.update(t.compute_advantages(batch))
    old = [[float(v) for v in lp] for lp in batch["log_probs"]]
    metrics = t.train_step(0, batch)
    return {"metrics": metrics, "old": old, "rollout": batch["rollout_log_probs"], "masks": batch["loss_masks"]}


def test_yaml_keys_become_attributes_and_flags(tiny_ckpt):
    args = _args(tiny_ckpt)
    assert args.use_tis is True                                   # a flag, set by the file
    assert (args.tis_mode, args.tis_level, args.tis_upper_bound, args.use_rs) == ("truncate", "token", 2.0, True)
    from slime_like.args import parse_run

    _, _, report = parse_run(["--hf-checkpoint", tiny_ckpt, *BASE_FLAGS, *_flags()], exit_on_error=False)
    assert any("attributes for custom functions" in w and "tis_mode" in w for w in report.warnings)


def test_mis_py_weights_the_policy_loss(tiny_ckpt):
    out = run_ranks(mis_case, 1, tiny_ckpt)[0]
    m = out["metrics"]
    # mis.py's metric: exp(train - rollout) per token before any bound, averaged over the valid tokens
    ratios = [math.exp(max(-20.0, min(20.0, o - r))) for os_, rs, ms in zip(out["old"], out["rollout"], out["masks"])
              for o, r, k in zip(os_, rs, ms) if k]
    assert m["mis_tis_weight_before_bound"] == pytest.approx(sum(ratios) / len(ratios), rel=1e-3)
    assert any(k.startswith("mis_") and "ppl" in k for k in m)    # add_ppl_metrics ran
    assert math.isfinite(m["loss"]) and m["grad_norm"] > 0
