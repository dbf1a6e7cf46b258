"""FP8 training flags at parse and launch: on a machine that shows no GPU, --fp8-format is a launch refusal (the dry
run plans it; valid on GPUs, so never a parse error); FP8 with the FSDP trainer or the FP8 sub-flags without a format
are errors anywhere. What the GPU stack needs is tests/megatron/test_fp8_kernels.py's."""
import pytest

from cfg_helpers import TINY_QWEN2, parse, parse_report, write_hf_dir
from slime_like.config.errors import ConfigError

FP8 = ("--fp8-format", "e4m3")


@pytest.fixture
def base(tmp_path):
    hf = write_hf_dir(tmp_path / "hf", TINY_QWEN2)
    data = tmp_path / "p.jsonl"
    data.write_text('{"input": "1+1=", "label": "2"}\n')
    return ["--hf-checkpoint", hf, "--prompt-data", str(data), "--rollout-batch-size", "2", "--n-samples-per-prompt",
            "2", "--num-rollout", "1", "--colocate", "--actor-num-gpus-per-node", "1", "--num-gpus-per-node", "1"]


def test_no_gpu_here_refuses_at_launch_not_at_parse(base):
    args, report = parse_report(base + list(FP8) + ["--fp8-recipe", "tensorwise"])
    assert args.fp8_format == "e4m3" and args.fp8_recipe == "tensorwise"
    assert [r for r in report.launch_refusals if r.startswith("--fp8-format e4m3 --fp8-recipe tensorwise: FP8")]
    with pytest.raises(ConfigError, match="this run cannot start: .*shows none"):
        report.refuse_at_launch()


def test_invalid_everywhere_is_a_parse_error(base):
    with pytest.raises(ConfigError, match="--fp8-param-gather keeps FP8 parameters, but no --fp8-format"):
        parse(base + ["--fp8-param-gather"])
    with pytest.raises(ConfigError, match="--fp8-recipe mxfp8 without --fp8-format"):
        parse(base + ["--fp8-recipe", "mxfp8"])
    with pytest.raises(ConfigError, match="--train-backend fsdp does not build them"):
        parse(base + list(FP8) + ["--train-backend", "fsdp"])
