"""slime's precision and optimizer defaults on a GPU machine (issue #25 item 3): slime's _set_default_megatron_args
sets bf16 = not fp16 and the distributed optimizer, so its recipes (no --bf16) train in bf16. Here the same when an
NVIDIA GPU is visible (a stand-in nvidia-smi on PATH), for both trainers and the RLinf / ROLL front-ends; a CPU
machine keeps fp32 unless asked; the dry run says which precision and why."""
import os

import pytest

from cfg_helpers import parse, write_hf_dir
from slime_like.config.dry_run import dry_run_text
from slime_like.config.report import ConfigReport
from slime_like.plan import build_plan

HERE = os.path.dirname(os.path.abspath(__file__))
ROLL3 = os.path.join(HERE, "frontend_files", "roll_seed003.yaml")


@pytest.fixture
def cpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # hides any GPU: cluster.cuda_visible() is False


def _base(tmp_path, *extra):
    return ["--hf-checkpoint", write_hf_dir(tmp_path / "hf"), "--rollout-batch-size", "2", "--num-rollout", "1",
            "--colocate", "--actor-num-gpus-per-node", "1", *extra]


def _precision(args):
    text = dry_run_text(args, build_plan(args), ConfigReport())  # the precision line reads args alone
    return next(ln for ln in text.splitlines() if ln.strip().startswith("precision"))


def test_gpu_recipe_without_precision_flags_trains_megatron_in_bf16_with_the_distributed_optimizer(gpu_visible, tmp_path):
    args = parse(_base(tmp_path))
    assert args.bf16 and not args.fp16 and args.use_distributed_optimizer
    line = _precision(args)
    assert "bf16 parameters" in line and "distributed optimizer" in line and "slime's default" in line


def test_gpu_fp16_stays_fp16(gpu_visible, tmp_path):
    args = parse(_base(tmp_path, "--fp16"))
    assert args.fp16 and not args.bf16 and "--fp16 on the command line" in _precision(args)


def test_gpu_fsdp_trains_bf16_compute_over_fp32_shards(gpu_visible, tmp_path):
    args = parse(_base(tmp_path, "--train-backend", "fsdp"))
    assert args.bf16 and not args.use_distributed_optimizer  # FSDP shards its optimizer state itself
    assert "bf16 compute over fp32 sharded parameters" in _precision(args)


def test_cpu_keeps_fp32_unless_asked(cpu, tmp_path):
    args = parse(_base(tmp_path))
    assert not args.bf16 and not args.fp16 and not args.use_distributed_optimizer
    assert "= fp32 (no GPU visible" in _precision(args)
    asked = parse(_base(tmp_path, "--bf16"))
    assert asked.bf16 and "--bf16 on the command line" in _precision(asked)


@pytest.mark.parametrize("dtype,bf16,fp16", [("bf16", True, False), ("fp16", False, True)])
def test_roll_dtype_keys_go_through_the_same_default(gpu_visible, tmp_path, dtype, bf16, fp16):
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    argv = ["--config", ROLL3, f"pretrain={write_hf_dir(tmp_path / 'hf')}", f"actor_train.data_args.file_name={data}",
            "max_steps=10", f"actor_train.model_args.dtype={dtype}", "--rollout-engine", "cpu",
            # a ROLL file must say how rewards are computed and (ROLL's default gae needs a critic) its estimator
            "rewards={math: {worker_cls: roll.pipeline.rlvr.rewards.math_rule_reward_worker.MathRuleRewardWorker}}",
            "adv_estimator=grpo"]
    args = parse(argv)
    assert (args.bf16, args.fp16, args.use_distributed_optimizer) == (bf16, fp16, True)


def test_fsdp_warns_that_megatron_kernel_flags_change_nothing(cpu, tmp_path):
    from slime_like.args import parse_run

    _, _, report = parse_run(_base(tmp_path, "--train-backend", "fsdp", "--attention-backend", "flash",
                                   "--no-rope-fusion"), exit_on_error=False)
    assert any(w.startswith("attention_backend, apply_rope_fusion (set on the command line) have no effect with "
                            "--train-backend fsdp") for w in report.warnings), report.warnings
    _, _, quiet = parse_run(_base(tmp_path, "--train-backend", "fsdp"), exit_on_error=False)
    assert not any("megatron-core's layer spec" in w for w in quiet.warnings)


def test_cpu_warns_that_te_spec_flags_are_not_honoured(cpu, tmp_path):
    from slime_like.args import parse_run

    _, _, report = parse_run(_base(tmp_path, "--attention-backend", "flash", "--transformer-impl",
                                   "transformer_engine"), exit_on_error=False)
    assert ("--transformer-impl transformer_engine, --attention-backend flash accepted but not honoured on this "
            "machine") in " ".join(report.warnings), report.warnings
