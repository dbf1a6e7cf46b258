"""--enable-mtp-training / --mtp-num-layers / --mtp-loss-scaling-factor (config/mtp.check_mtp_training): MiMo's MTP
layers train (backends/megatron/mtp.py); what the trainer cannot build is refused at launch, naming the flag and the
checkpoint's model_type; without --enable-mtp-training the MTP flags warn that they change nothing."""
import pytest

from cfg_helpers import TINY_QWEN2, parse_report, write_hf_dir
from slime_like.config.errors import ConfigError

MIMO = dict(TINY_QWEN2, model_type="mimo", architectures=["MiMoForCausalLM"], num_nextn_predict_layers=1)
# GLM-4.7-Flash declares MTP layers (DeepSeek-V3's layout under glm4_moe_lite) whose weights are not mapped
GLM47_FLASH = dict(TINY_QWEN2, model_type="glm4_moe_lite", num_nextn_predict_layers=1)


def _run(tmp_path, cfg, *extra):
    hf = write_hf_dir(tmp_path / "hf", cfg)
    return parse_report(["--hf-checkpoint", hf, "--rollout-batch-size", "4", "--n-samples-per-prompt", "2",
                         "--num-rollout", "2", "--colocate", "--actor-num-gpus-per-node", "2",
                         "--num-gpus-per-node", "2", *extra])


@pytest.mark.parametrize("model_type", ["mimo", "deepseek_v3", "glm4_moe"])
def test_mtp_training_launches_and_the_flags_say_nothing(tmp_path, model_type):
    args, report = _run(tmp_path, dict(MIMO, model_type=model_type), "--enable-mtp-training", "--mtp-num-layers", "1",
                        "--mtp-loss-scaling-factor", "0.3", "--tensor-model-parallel-size", "2")
    assert report.launch_refusals == [] and not any("mtp" in w for w in report.warnings)
    assert (args.enable_mtp_training, args.mtp_num_layers, args.mtp_loss_scaling_factor) == (True, 1, 0.3)


def test_mtp_flags_without_training_warn_that_they_change_nothing(tmp_path):
    _, report = _run(tmp_path, MIMO, "--mtp-num-layers", "1", "--mtp-loss-scaling-factor", "0.3")
    warned = [w for w in report.warnings if "not honoured here" in w]
    assert any(w.startswith("--mtp-num-layers 1") for w in warned)
    assert any(w.startswith("--mtp-loss-scaling-factor 0.3") for w in warned)
    assert report.launch_refusals == []


def test_mtp_training_needs_the_layer_count(tmp_path):
    with pytest.raises(ConfigError, match="--enable-mtp-training needs --mtp-num-layers"):
        _run(tmp_path, MIMO, "--enable-mtp-training")


@pytest.mark.parametrize("cfg, extra, words", [
    (GLM47_FLASH, (), "model_type 'glm4_moe_lite'.*MTP weights of MiMo .* only; this model_type's MTP layers are "
                      "not mapped"),
    (dict(TINY_QWEN2), (), "model_type 'qwen2'.*not mapped"),
    (dict(MIMO, model_type="glm4_moe", n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
     ("--use-routing-replay",), "--use-routing-replay: the replayed routing covers the main model's MoE layers"),
    (MIMO, ("--mtp-num-layers", "2"), "--mtp-num-layers 2 .* declares 1 MTP layer"),
    (MIMO, ("--pipeline-model-parallel-size", "2"), "--pipeline-model-parallel-size 2: MTP training"),
    (MIMO, ("--context-parallel-size", "2"), "--context-parallel-size 2: MTP training"),
    (MIMO, ("--train-backend", "fsdp"), "--train-backend fsdp: the FSDP trainer builds no MTP layers"),
])
def test_what_the_trainer_cannot_build_is_refused_at_launch(tmp_path, cfg, extra, words):
    _, report = _run(tmp_path, cfg, "--enable-mtp-training", "--mtp-num-layers", "1", *extra)
    with pytest.raises(ConfigError, match=words):
        report.refuse_at_launch()
