"""slime's own recipes parse unchanged: every scripts/run-*.sh (and scripts/low_precision/run-*.sh) of slime's
repository at the commit in slime_recipes/recipes.json goes through `train.py --dry-run` and prints its plan.

recipes.json holds, per script, the argv its `python3 train.py` call passes (slime_recipes/extract.py records
it by running the script with every command stubbed). Here its paths become placeholders: a prompt file for
data paths, an empty directory for checkpoints, and for --hf-checkpoint a config.json written from the
recipe's own model flags (the model check against config.json stays on). What slime_like cannot run is
refused at launch, never here: the dry run lists it.
"""
import json
import pathlib
import re

import pytest

from cfg_helpers import parse, parse_report, refuse_at_launch
from slime_like.config.errors import ConfigError

DATA = pathlib.Path(__file__).parent / "slime_recipes" / "recipes.json"
DOC = (pathlib.Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
RECIPES = json.loads(DATA.read_text())["recipes"]
RUNS = sorted(k for k in RECIPES if not k.startswith("models/"))
# Recipes megatron-core itself refuses as written (not a slime_like limit): the reason, and our error's words.
INVALID_ON_GPUS = {
    # 8 actor GPUs with PP 2, EP 8, ETP 1: megatron.core.parallel_state.initialize_model_parallel needs world_size
    # divisible by ETP x EP x PP = 16 and raises "world_size (8) is not divisible by ..." on the GPUs too
    "run-glm4.7-30B-A3B.sh": "actor GPUs = 8, not divisible by expert TP 1 x EP 8 x PP 2 = 16",
}
PATH_FLAGS = {"--hf-checkpoint", "--ref-load", "--load", "--save", "--prompt-data", "--critic-load", "--critic-save"}


def _value(argv, flag, default=None):
    return argv[argv.index(flag) + 1] if flag in argv else default


def placeholder_hf_config(argv) -> dict:
    """config.json keys for the architecture the recipe's model flags describe (what a real checkpoint holds)."""
    heads, hidden = int(_value(argv, "--num-attention-heads")), int(_value(argv, "--hidden-size"))
    cfg = {"model_type": "placeholder", "hidden_size": hidden, "num_hidden_layers": int(_value(argv, "--num-layers")),
           "num_attention_heads": heads, "intermediate_size": int(_value(argv, "--ffn-hidden-size")),
           "vocab_size": int(_value(argv, "--vocab-size")), "rms_norm_eps": float(_value(argv, "--norm-epsilon", 1e-5)),
           "rope_theta": float(_value(argv, "--rotary-base", 10000)),
           "tie_word_embeddings": "--untie-embeddings-and-output-weights" not in argv}
    if "--multi-latent-attention" in argv:
        cfg.update(kv_lora_rank=int(_value(argv, "--kv-lora-rank", 32)), q_lora_rank=_value(argv, "--q-lora-rank"),
                   qk_nope_head_dim=int(_value(argv, "--qk-head-dim", 128)),
                   qk_rope_head_dim=int(_value(argv, "--qk-pos-emb-head-dim", 64)),
                   v_head_dim=int(_value(argv, "--v-head-dim", 128)), num_key_value_heads=heads)
        if cfg["q_lora_rank"] is not None:
            cfg["q_lora_rank"] = int(cfg["q_lora_rank"])
        factor = float(_value(argv, "--rotary-scaling-factor", 1.0))
        if factor != 1.0:  # YaRN, as the DeepSeek-V3 / Kimi-K2 checkpoints publish it
            cfg["rope_scaling"] = {"type": "yarn", "factor": factor, "mscale": float(_value(argv, "--mscale", 1.0)),
                                   "mscale_all_dim": float(_value(argv, "--mscale-all-dim", 0.0)),
                                   "original_max_position_embeddings": 4096}
    else:
        cfg["num_key_value_heads"] = int(_value(argv, "--num-query-groups", 1)) \
            if "--group-query-attention" in argv else heads
        cfg["head_dim"] = int(_value(argv, "--kv-channels", hidden // heads))
    if "--mtp-num-layers" in argv:  # the checkpoint's own MTP layers; Qwen2's layout with them is MiMo's
        cfg["num_nextn_predict_layers"] = int(_value(argv, "--mtp-num-layers"))
        if "--add-qkv-bias" in argv and "--num-experts" not in argv and "--multi-latent-attention" not in argv:
            cfg["model_type"] = "mimo"
    if "--num-experts" in argv:
        cfg.update(n_routed_experts=int(_value(argv, "--num-experts")),
                   num_experts_per_tok=int(_value(argv, "--moe-router-topk", 2)),
                   moe_intermediate_size=int(_value(argv, "--moe-ffn-hidden-size")))
    return cfg


def _parquet_prompts(tmp_path):
    """A Parquet placeholder (slime's SFT recipes read Parquet, and count its rows for --num-epoch)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "prompts.parquet"
    pq.write_table(pa.table({"prompt": ["1+1="], "label": ["2"], "input": ["1+1="],
                             "messages": [[{"role": "user", "content": "1+1="}]]}), path)
    return path


def placeholder_argv(argv, tmp_path) -> list:
    """The recipe's argv with every path replaced by something that exists under tmp_path."""
    out, made = list(argv), {}
    prompt = tmp_path / "prompts.jsonl"
    prompt.write_text(json.dumps({"prompt": "1+1=", "label": "2", "input": "1+1=", "messages": []}) + "\n")
    for i, tok in enumerate(argv[:-1]):
        flag, value = tok, argv[i + 1]
        if flag == "--hf-checkpoint":
            hf = tmp_path / "hf"
            hf.mkdir(exist_ok=True)
            (hf / "config.json").write_text(json.dumps(placeholder_hf_config(argv)))
            out[i + 1] = str(hf)
        elif flag == "--sglang-config":  # the recipe writes its own file; an empty mapping stands in for it
            (tmp_path / "sglang.yaml").write_text("{}\n")
            out[i + 1] = str(tmp_path / "sglang.yaml")
        elif flag == "--prompt-data":
            out[i + 1] = str(_parquet_prompts(tmp_path) if value.endswith(".parquet") else prompt)
        elif flag in PATH_FLAGS:
            out[i + 1] = made.setdefault(value, str(tmp_path / f"dir{len(made)}"))
            pathlib.Path(out[i + 1]).mkdir(exist_ok=True)
        elif flag == "--eval-prompt-data":  # [NAME] PATH [NAME PATH ...]
            j = i + 1
            while j < len(argv) and not argv[j].startswith("--"):
                out[j] = str(prompt) if "/" in argv[j] else argv[j]
                j += 1
    return out


def test_every_slime_run_script_is_recorded():
    assert len(RUNS) >= 29 and "run-glm4.7-30B-A3B.sh" in RUNS and "low_precision/run-qwen3-4b-fp8.sh" in RUNS
    assert all(len(RECIPES[r]["argv"]) > 90 for r in RUNS)  # the whole command, not a line cut short


@pytest.mark.parametrize("name", RUNS)
def test_slime_recipe_dry_run_prints_the_plan(name, tmp_path, capsys, gpu_machine):
    from slime_like.plan import print_dry_run

    if name in INVALID_ON_GPUS:
        with pytest.raises(ConfigError, match=INVALID_ON_GPUS[name]):
            parse(placeholder_argv(RECIPES[name]["argv"], tmp_path) + ["--dry-run"])
        return
    args, report = parse_report(placeholder_argv(RECIPES[name]["argv"], tmp_path) + ["--dry-run"])
    print_dry_run(args, report)
    out = capsys.readouterr().out
    assert "== slime_like dry run: configuration valid ==" in out and "placement" in out.lower()
    # the launch refusals the dry run lists are exactly what the launch would stop on
    assert out.count("REFUSED AT LAUNCH: ") == len(report.launch_refusals)
    # docs/configuration.md's table of slime's recipes names every flag the launch refuses
    row = next(line for line in DOC.splitlines() if line.startswith(f"| `{name}` |"))
    assert set(re.findall(r"`(--[a-z0-9-]+)`", row.split("|")[3])) == {r.split(" ")[0] for r in report.launch_refusals}
    assert ("runs as written" in row) == (not report.launch_refusals)


def test_slime_builtin_function_paths_resolve_to_ours(base):
    from slime_like.rollout.filters import check_reward_nonzero_std
    from slime_like.rollout.hooks import load_function

    slime_filter = "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"
    assert load_function(slime_filter) is check_reward_nonzero_std
    refuse_at_launch(base + ["--dynamic-sampling-filter-path", slime_filter])
    refuse_at_launch(base + ["--rollout-function-path", "slime.rollout.sft_rollout.generate_rollout"])
    argv = base + ["--rollout-function-path", "slime_plugins.rollout.my_rollout.generate_rollout"]
    with pytest.raises(ConfigError, match="--rollout-function-path slime_plugins.rollout.my_rollout.generate_rollout "
                                          "names slime's own code"):
        refuse_at_launch(argv)


MODEL_SCRIPTS = sorted(k for k in RECIPES if k.startswith("models/"))
RUN_BASE = ["--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--num-rollout", "1", "--colocate",
            "--actor-num-gpus-per-node", "8", "--num-gpus-per-node", "8", "--dry-run"]


@pytest.mark.parametrize("name", MODEL_SCRIPTS)
def test_slime_model_script_dry_run(name, tmp_path, capsys):
    """Each of slime's scripts/models/*.sh MODEL_ARGS plans a run against a config.json of that architecture."""
    from slime_like.plan import print_dry_run

    model = RECIPES[name]["argv"]
    args, report = parse_report(model + placeholder_argv(["--hf-checkpoint", "X"] + model, tmp_path)[:2] + RUN_BASE)
    print_dry_run(args, report)
    assert "configuration valid" in capsys.readouterr().out
    assert args.num_layers == int(_value(model, "--num-layers"))
