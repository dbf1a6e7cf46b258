"""--train-backend fsdp and the LoRA flags: bad combinations fail while parsing, before Ray or torch start."""
import os

import pytest

from cfg_helpers import parse, parse_report
from slime_like.config.errors import ConfigError

FSDP = ["--train-backend", "fsdp"]


@pytest.mark.parametrize("flag", ["--tensor-model-parallel-size", "--pipeline-model-parallel-size"])
def test_megatron_parallelism_is_refused_with_fsdp(base, flag):
    with pytest.raises(ConfigError, match=f"{flag} 2 is Megatron parallelism; --train-backend fsdp"):
        parse(base + FSDP + [flag, "2"])


def test_a_torch_dist_ref_load_is_refused_with_fsdp(base, tmp_path):
    ckpt = tmp_path / "megatron_ckpt"
    os.makedirs(ckpt / "iter_0000003")
    (ckpt / "iter_0000003" / "common.pt").write_bytes(b"")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("3")
    with pytest.raises(ConfigError, match=r"--ref-load .*megatron_ckpt is a Megatron torch_dist checkpoint.*convert"):
        parse(base + FSDP + ["--ref-load", str(ckpt)])
    parse(base + ["--ref-load", str(ckpt)])  # fine for the Megatron trainer


def test_lora_needs_the_fsdp_backend(base):
    with pytest.raises(ConfigError, match="--lora-rank 8 needs --train-backend fsdp: the Megatron trainer has no LoRA"):
        parse(base + ["--lora-rank", "8"])
    args = parse(base + FSDP + ["--lora-rank", "8", "--lora-alpha", "16"])
    assert (args.train_backend, args.lora_rank, args.lora_target_modules) == ("fsdp", 8, ["all-linear"])


def test_unknown_lora_target_lists_the_models_linear_modules(base, tiny_ckpt):
    argv = [a if a != base[1] else tiny_ckpt for a in base] + FSDP + ["--lora-rank", "4"]
    with pytest.raises(ConfigError, match=r"--lora-target-modules qkv_proj: .* has no such linear module; its linear "
                                          r"modules are: down_proj gate_proj k_proj lm_head o_proj q_proj up_proj v_proj"):
        parse(argv + ["--lora-target-modules", "q_proj", "qkv_proj"])
    assert parse(argv + ["--lora-target-modules", "q_proj", "v_proj"]).lora_target_modules == ["q_proj", "v_proj"]


def test_megatron_only_performance_flags_warn_with_fsdp(base):
    _, report = parse_report(base + FSDP + ["--use-distributed-optimizer", "--overlap-grad-reduce"])
    assert any(w.startswith("--use-distributed-optimizer has no effect with --train-backend fsdp")
               for w in report.warnings)
    with pytest.raises(ConfigError, match="hybrid_shard needs --fsdp-size"):
        parse(base + FSDP + ["--fsdp-sharding-strategy", "hybrid_shard"])
    with pytest.raises(ConfigError, match="--recompute-granularity selective is Megatron's"):
        parse(base + FSDP + ["--recompute-granularity", "selective"])


def test_checkpoints_of_the_other_backend_are_refused(base, tmp_path):
    ckpt = tmp_path / "fsdp_ckpt"
    os.makedirs(ckpt / "iter_0000002")
    (ckpt / "iter_0000002" / "fsdp_meta.json").write_text("{}")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("2")
    with pytest.raises(ConfigError, match=r"--load .*fsdp_ckpt is a --train-backend fsdp \(DCP\) checkpoint"):
        parse(base + ["--load", str(ckpt)])
    assert parse(base + FSDP + ["--load", str(ckpt)]).load == str(ckpt)
    with pytest.raises(ConfigError, match="the FSDP reference model loads an HF directory"):
        parse(base + FSDP + ["--ref-load", str(ckpt), "--use-kl-loss"])


def test_fsdp_takes_the_batch_hooks_and_refuses_the_megatron_ones(base, tmp_path, monkeypatch):
    """The advantage function and the rollout-data post-process see args and the batch: both trainers call them
    (backends/training/base.py). The --custom-megatron-* and loss hooks are the Megatron trainer's only."""
    (tmp_path / "fsdp_hooks_mod.py").write_text("def adv(args, rollout_data):\n    pass\n\n"
                                                "def post(args, rollout_id, rollout_data):\n    pass\n\n"
                                                "def init(args):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    args = parse(base + FSDP + ["--custom-advantage-function-path", "fsdp_hooks_mod.adv",
                                "--rollout-data-postprocess-path", "fsdp_hooks_mod.post"])
    assert (args.custom_advantage_function_path, args.rollout_data_postprocess_path) == \
        ("fsdp_hooks_mod.adv", "fsdp_hooks_mod.post")
    with pytest.raises(ConfigError, match="--custom-megatron-init-path fsdp_hooks_mod.init: this trainer hook is "
                                          "called by the Megatron trainer only"):
        parse(base + FSDP + ["--custom-megatron-init-path", "fsdp_hooks_mod.init"])


def test_the_fsdp_opd_teacher_is_an_hf_directory(base, hf_dir, tmp_path):
    opd = ["--use-opd", "--opd-type", "megatron"]
    assert parse(base + FSDP + opd + ["--opd-teacher-load", hf_dir]).opd_teacher_load == hf_dir
    with pytest.raises(ConfigError, match="--opd-teacher-ckpt-step 3 picks an iteration of a torch_dist teacher"):
        parse(base + FSDP + opd + ["--opd-teacher-load", hf_dir, "--opd-teacher-ckpt-step", "3"])
    ckpt = tmp_path / "teacher_ckpt"
    os.makedirs(ckpt / "iter_0000003")
    (ckpt / "iter_0000003" / "common.pt").write_bytes(b"")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("3")
    with pytest.raises(ConfigError, match=r"--opd-teacher-load .*teacher_ckpt is a Megatron torch_dist checkpoint"):
        parse(base + FSDP + opd + ["--opd-teacher-load", str(ckpt)])
