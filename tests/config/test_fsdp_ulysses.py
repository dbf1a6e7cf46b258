"""--context-parallel-size N with --train-backend fsdp: Ulysses sequence parallelism (backends/fsdp/ulysses.py). What
it cannot run is refused before launch, naming the flag, the checkpoint and the fix; ROLL's
actor_train.model_args.ulysses_size maps onto it. The parity of SP=2 with SP=1 is tests/fsdp/test_ulysses.py."""
import os

import pytest

from cfg_helpers import TINY_QWEN2, parse, parse_report, refuse_at_launch, write_hf_dir
from slime_like.config.errors import ConfigError

FSDP = ["--train-backend", "fsdp", "--context-parallel-size", "2"]
HERE = os.path.dirname(os.path.abspath(__file__))
ROLL3 = os.path.join(HERE, "frontend_files", "roll_seed003.yaml")
ROLL_MATH = "roll.pipeline.rlvr.rewards.math_rule_reward_worker.MathRuleRewardWorker"


def with_config(base, tmp_path, **changes):
    hf = write_hf_dir(tmp_path / "model", dict(TINY_QWEN2, **changes))
    return [hf if a == base[1] else a for a in base]


def test_sequence_parallel_fsdp_runs_and_counts_data_parallel_ranks(base, capsys):
    from slime_like.plan import print_dry_run

    args, report = parse_report(base + FSDP + ["--dry-run"])
    assert args.context_parallel_size == 2 and report.launch_refusals == []
    print_dry_run(args, report)
    out = capsys.readouterr().out
    assert "actor parallelism     = 2 GPUs = DP 1 x TP 1 x PP 1 x CP 2" in out
    # Megatron's CP refusals (the loss split over CP ranks) do not apply: the FSDP loss sees whole responses
    _, report = parse_report(base + FSDP + ["--early-stop-imp-ratio", "2.0"])
    assert report.launch_refusals == []
    # slime's sizes rule: the world must split into DP x SP
    with pytest.raises(ConfigError, match=r"not divisible by .*--context-parallel-size 4"):
        parse(base + ["--train-backend", "fsdp", "--context-parallel-size", "4"])


def test_heads_not_divisible_is_an_error_naming_the_fix(base, tmp_path):
    argv = with_config(base, tmp_path, num_attention_heads=3, num_key_value_heads=1, hidden_size=48)
    with pytest.raises(ConfigError, match=r"--context-parallel-size 2 \(Ulysses sequence parallelism\) with "
                                          r"--hf-checkpoint .*: num_attention_heads 3 is not divisible by 2"):
        parse(argv + FSDP)
    parse(argv + ["--train-backend", "fsdp"])  # fine without sequence parallelism


@pytest.mark.parametrize("changes, words", [
    ({"vision_config": {"depth": 1}}, "a vision-language model"),
    ({"use_sliding_window": True, "sliding_window": 4}, "sliding-window attention layers"),
    ({"layer_types": ["linear_attention", "full_attention"]}, "layers other than attention (linear_attention)"),
    ({"attn_logit_softcapping": 50.0}, "attention logit softcapping"),
])
def test_what_the_ulysses_attention_does_not_run_is_refused_at_launch(base, tmp_path, changes, words):
    argv = with_config(base, tmp_path, **changes) + FSDP
    args, report = parse_report(argv + ["--dry-run"])  # the dry run still plans it
    with pytest.raises(ConfigError, match="--context-parallel-size 2") as err:
        refuse_at_launch(argv)
    assert words in str(err.value) and "use --context-parallel-size 1" in str(err.value)


def roll(paths, *extra):
    return ["--config", ROLL3, f"pretrain={paths[0]}", f"actor_train.data_args.file_name={paths[1]}", "max_steps=10",
            f"rewards={{math: {{worker_cls: {ROLL_MATH}}}}}", "adv_estimator=grpo", "--rollout-engine", "cpu",
            "--num-nodes", "2", *extra]


@pytest.fixture
def roll_paths(tmp_path, hf_dir):
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    return hf_dir, str(data)


def test_roll_ulysses_size_maps_to_context_parallel_size_with_fsdp2(roll_paths):
    fsdp2 = ["actor_train.strategy_args.strategy_name=fsdp2_train", "actor_train.strategy_args.strategy_config={}"]
    args = parse(roll(roll_paths, *fsdp2, "actor_train.model_args.ulysses_size=2"))
    assert args.train_backend == "fsdp" and args.context_parallel_size == 2
    # ROLL's global batch: per_device 1 x accumulation 32 x 16 GPUs / ulysses_size 2
    assert args.global_batch_size == 256
    assert parse(roll(roll_paths, *fsdp2)).context_parallel_size == 1
    with pytest.raises(ConfigError, match=r"actor_train.model_args.ulysses_size 2: Ulysses sequence parallelism runs "
                                          r"with strategy_name fsdp2_train.*context_parallel_size instead"):
        parse(roll(roll_paths, "actor_train.model_args.ulysses_size=2"))  # megatron_train
    with pytest.raises(ConfigError, match=r"critic.model_args.ulysses_size"):
        parse(roll(roll_paths, *fsdp2, "critic.model_args.ulysses_size=2"))
