"""scripts/models/*.sh agree with `python -m slime_like.tools.model_args` on each model's published config.json."""
import json
import os
import subprocess
import sys

import pytest

from slime_like.config.hf_config import model_flags_from_hf, read_hf_config
from slime_like.config.parser import build_parser, group_of
from slime_like.tools.model_args import render

from published_configs import PUBLISHED

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = os.path.join(ROOT, "scripts", "models")
SHIPPED = sorted(f[:-3] for f in os.listdir(MODELS) if f.endswith(".sh"))
REQUIRED = ["qwen2.5-0.5B", "qwen2.5-1.5B", "qwen2.5-3B", "qwen2.5-7B", "qwen2.5-14B", "qwen2.5-32B", "qwen3-0.6B",
            "qwen3-1.7B", "qwen3-4B", "qwen3-8B", "qwen3-14B", "qwen3-32B", "qwen3-30B-A3B", "llama3.1-8B", "glm4-9B",
            "tiny-qwen2"]


def sourced_model_args(path):
    """MODEL_ARGS exactly as bash sees it after `source`."""
    out = subprocess.run(["bash", "-c", 'source "$1" && printf "%s\\0" "${MODEL_ARGS[@]}"', "_", path],
                         capture_output=True, text=True, check=True).stdout
    return [t for t in out.split("\0") if t]


def tool_model_args(tmp_path, cfg):
    """What the tool prints for `cfg` written as config.json, sourced by bash (in-process; the CLI is tested below)."""
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    text = render(model_flags_from_hf(read_hf_config(str(tmp_path))), "generated")
    script = tmp_path / "gen.sh"
    script.write_text(text)
    return sourced_model_args(str(script))


def model_view(tokens):
    """The values of every model-architecture dest after parsing `tokens` (defaults fill the rest)."""
    parser, _ = build_parser()
    args, extra = parser.parse_known_args(tokens)
    assert extra == []
    return {d: getattr(args, d) for d, g in group_of(parser).items() if g.startswith("model")}


def test_every_required_model_is_shipped():
    assert set(REQUIRED) <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_file_agrees_with_the_tool(tmp_path, name):
    assert name in PUBLISHED, f"scripts/models/{name}.sh has no published config in tests/config/published_configs.py"
    shipped = model_view(sourced_model_args(os.path.join(MODELS, name + ".sh")))
    generated = model_view(tool_model_args(tmp_path, PUBLISHED[name]))
    assert shipped == generated


def test_spot_values_of_published_configs():
    v = model_view(sourced_model_args(os.path.join(MODELS, "qwen2.5-7B.sh")))
    assert (v["num_layers"], v["hidden_size"], v["num_query_groups"], v["vocab_size"]) == (28, 3584, 4, 152064)
    assert v["add_qkv_bias"] and v["untie_embeddings_and_output_weights"] and v["rotary_base"] == 1000000
    v = model_view(sourced_model_args(os.path.join(MODELS, "qwen3-30B-A3B.sh")))
    assert (v["num_experts"], v["moe_router_topk"], v["moe_ffn_hidden_size"], v["kv_channels"]) == (128, 8, 768, 128)
    assert v["moe_layer_freq"] == [1] * 48 and v["qk_layernorm"] and not v["add_qkv_bias"]
    v = model_view(sourced_model_args(os.path.join(MODELS, "llama3.1-8B.sh")))
    assert v["use_rope_scaling"] and v["rope_scaling_factor"] == 8.0 and v["norm_epsilon"] == 1e-5


def test_tiny_model_file_matches_the_real_tiny_checkpoint(tiny_ckpt, tmp_path):
    """The file the tests and the demo source describes what build_tiny_checkpoint() really writes."""
    with open(os.path.join(tiny_ckpt, "config.json")) as f:
        real = json.load(f)
    assert model_view(sourced_model_args(os.path.join(MODELS, "tiny-qwen2.sh"))) == \
        model_view(tool_model_args(tmp_path, real))


def test_tool_cli_prints_a_sourceable_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(PUBLISHED["qwen3-4B"]))
    r = subprocess.run([sys.executable, "-m", "slime_like.tools.model_args", str(tmp_path)], capture_output=True,
                       text=True, check=True)
    (tmp_path / "m.sh").write_text(r.stdout)
    assert model_view(sourced_model_args(str(tmp_path / "m.sh"))) == \
        model_view(sourced_model_args(os.path.join(MODELS, "qwen3-4B.sh")))


def test_tool_errors_cleanly(tmp_path):
    r = subprocess.run([sys.executable, "-m", "slime_like.tools.model_args", str(tmp_path / "missing")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "no such file or directory" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    r = subprocess.run([sys.executable, "-m", "slime_like.tools.model_args", str(tmp_path)], capture_output=True,
                       text=True)
    assert r.returncode == 2 and "config.json has no" in r.stderr and "Traceback" not in r.stderr


# ours -> slime's scripts/models file of the same model (flag lists recorded in slime_recipes/recipes.json)
SLIME_TWINS = {"glm4.5-106B-A12B": "glm4.5-106B-A12B.sh", "glm4.5-355B-A32B": "glm4.5-355B-A32B.sh",
               "qwen3-30B-A3B": "qwen3-30B-A3B.sh", "qwen3-4B": "qwen3-4B.sh", "deepseek-v3": "deepseek-v3.sh",
               "moonlight-16B-A3B": "moonlight.sh", "kimi-k2": "kimi-k2.sh", "glm4-9B": "glm4-9B.sh",
               "minimax-m2": "minimax-m2.sh", "qwen3-next-80B-A3B": "qwen3-next-80B-A3B.sh",
               "qwen3.5-35B-A3B": "qwen3.5-35B-A3B.sh", "qwen3.5-0.8B": "qwen3.5-0.8B.sh",
               "qwen3.5-4B": "qwen3.5-4B.sh",
               "qwen3.5-9B": "qwen3.5-9B.sh", "qwen3.5-27B": "qwen3.5-27B.sh"}


@pytest.mark.parametrize("name", sorted(SLIME_TWINS))
def test_shipped_file_agrees_with_slimes_own(name):
    """Every architecture value slime's model file sets (non-default) is the value our file sets."""
    recipes = json.load(open(os.path.join(ROOT, "tests", "config", "slime_recipes", "recipes.json")))["recipes"]
    theirs = model_view(recipes["models/" + SLIME_TWINS[name]]["argv"])
    ours = model_view(sourced_model_args(os.path.join(MODELS, name + ".sh")))
    defaults = model_view([])
    kernel_choices = {"moe_grouped_gemm", "moe_permute_fusion", "moe_token_dispatcher_type", "moe_router_dtype",
                      "moe_router_load_balancing_type", "moe_router_pre_softmax", "position_embedding_type",
                      "add_position_embedding", "apply_rope_fusion", "use_rotary_position_embeddings",
                      "moe_token_drop_policy",
                      "spec"}  # slime's GLM-4 spec plugin: the trainer builds the same layers from the flags
    if theirs["multi_latent_attention"]:  # MLA takes head widths from the --qk-* / --v-head-dim flags
        kernel_choices.add("kv_channels")
        if theirs["rotary_scaling_factor"] == 1.0:  # YaRN's attention scales mean nothing without YaRN
            kernel_choices |= {"mscale", "mscale_all_dim"}
    differ = {d: (theirs[d], ours[d]) for d in theirs
              if theirs[d] != defaults[d] and d not in kernel_choices and theirs[d] != ours[d]}
    assert differ == {}


def test_qwen3_5_text_model_is_read_from_the_vision_language_config(tmp_path):
    """Qwen3.5's config.json nests the text model under text_config (tie_word_embeddings and dtype at the top level);
    the trainer reads that text model, its layer_types and linear-attention sizes, and slime's spec name."""
    from slime_like.args import make_args
    from slime_like.config.hf_config import fill_args_from_hf

    cfg = dict(PUBLISHED["qwen3.5-35B-A3B"], dtype="bfloat16")
    cfg["text_config"] = dict(cfg["text_config"], linear_num_key_heads=16, linear_num_value_heads=32,
                              linear_key_head_dim=128, linear_value_head_dim=128, full_attention_interval=4)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    text = read_hf_config(str(tmp_path), for_training=True)
    assert (text["model_type"], text["dtype"], text["intermediate_size"]) == ("qwen3_5_moe_text", "bfloat16", 512)
    args = fill_args_from_hf(make_args("--hf-checkpoint", str(tmp_path)), str(tmp_path))
    assert args.spec == ["slime_plugins.models.qwen3_5", "get_qwen3_5_spec"] and args.hf_text_of_vlm
    assert args.attention_output_gate and args.apply_layernorm_1p and args.rotary_percent == 0.25
    layout = args.hf_linear_attention
    assert layout["layer_types"][:4] == ["linear_attention"] * 3 + ["full_attention"]
    assert len(layout["layer_types"]) == 40
    assert (layout["num_key_heads"], layout["num_value_heads"], layout["conv_kernel_dim"]) == (16, 32, 4)


def test_mtp_layers_are_dropped_with_a_note():
    """DeepSeek-V3 / GLM-4.5 / MiniMax-M2 checkpoints declare MTP layers the trainer does not build: the load says so."""
    from slime_like.config.hf_layer_layouts import dropped_mtp_note

    assert "1 multi-token-prediction layer(s)" in dropped_mtp_note(PUBLISHED["deepseek-v3"], "ckpt")
    assert "3 multi-token-prediction" in dropped_mtp_note({"num_mtp_modules": 3}, "ckpt")
    assert dropped_mtp_note(PUBLISHED["qwen3-4B"], "ckpt") is None
