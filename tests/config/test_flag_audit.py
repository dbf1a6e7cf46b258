"""Never silently ignore a flag: every parser dest is read by product code or classified in config/support.py.

"Read" means the code train.py / train_async.py run, outside slime_like/config/ (the slime_like package,
train.py, train_async.py; not the converters slime_like/tools/convert_*.py, which skip validation), uses the
dest in its syntax tree
(comments and docstrings do not count) as `<...args>.<dest>`, `getattr/hasattr/_get(x, "<dest>")`,
`fuse("<dest>")`, `_custom_log("<dest>")`, `Option("<field>", "<dest>", ...)` or a `("<key>", "<dest>")` pair of a key table. A dest nobody reads
must sit in support.UNSUPPORTED (start-up error), support.NO_EFFECT_HERE (start-up warning),
support.INFORMATIONAL (consumed by the config layer), support.ALWAYS_ON (a switch whose behaviour is
always on) or be a slime-only flag of support.SLIME_ONLY_FLAGS.
"""
import argparse
import ast
import functools
import pathlib
import re

import pytest
import yaml

from cfg_helpers import parse, parse_report, refuse_at_launch
from slime_like.config import engines, support
from slime_like.registry import ROLLOUT_ENGINES
from slime_like.config.errors import ConfigError
from slime_like.config.types import ranged
from slime_like.config.parser import build_parser
from slime_like.config.types import json_value

ROOT = pathlib.Path(__file__).resolve().parents[2]
# UNSUPPORTED / NO_EFFECT_HERE dests that product code does read, only to refuse or warn at run time (the
# Megatron trainer's own guard). The start-up check says it earlier; any other overlap means the flag is
# now honoured and its table entry must go.
GUARDED_DOWNSTREAM = {"rotary_scaling_factor", "mscale", "mscale_all_dim", "use_unbiased_kl", "custom_tis_function_path",
                      "reset_optimizer_states", "log_probs_chunk_size", "recompute_loss_function",
                      "save_hf", "spec", "cp_comm_type",  # --save-hf: honoured by --train-backend fsdp, refused (APPLIES_WHEN) for megatron
                      # honoured by the Megatron trainer; refused (APPLIES_WHEN) with LayerNorm / multi-latent attention
                      "apply_layernorm_1p", "attention_output_gate", "use_gated_attention",
                      # built and trained with --enable-mtp-training; no effect (APPLIES_WHEN) without it
                      "mtp_num_layers", "mtp_loss_scaling_factor"}
# flags whose rule applies only in context (support.APPLIES_WHEN): the tokens that create it
CONTEXT = {"attention_output_gate": ["--multi-latent-attention"], "use_gated_attention": ["--multi-latent-attention"],
           "apply_layernorm_1p": ["--normalization", "LayerNorm"]}


def _name(node) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _str(node):
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _reads(tree) -> set:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _name(node.value).endswith("args"):
            found.add(node.attr)  # args.x, self.args.x, role_args.x
        elif isinstance(node, ast.Call):
            fn, pos = _name(node.func), node.args
            if fn in ("getattr", "hasattr", "_get") and len(pos) >= 2 and _str(pos[1]):
                found.add(_str(pos[1]))
            elif fn in ("fuse", "_custom_log") and pos and _str(pos[0]):
                found.add(_str(pos[0]))
            elif fn == "Option" and len(pos) >= 2 and _str(pos[1]):  # backends/megatron/kernels.py's table
                found.add(_str(pos[1]))
        elif isinstance(node, ast.Tuple) and len(node.elts) == 2 and all(_str(e) for e in node.elts):
            found.add(_str(node.elts[1]))  # (sampling key, dest) tables
    return found


@functools.lru_cache(maxsize=1)
def _read_dests() -> frozenset:
    files = [*ROOT.glob("slime_like/**/*.py"), ROOT / "train.py", ROOT / "train_async.py"]
    found = set()
    for f in files:
        if "slime_like/config/" not in f.as_posix() and not f.name.startswith("convert_"):  # the converters
            found |= _reads(ast.parse(f.read_text(), str(f)))
    return frozenset(found)


def _actions():
    return [a for a in build_parser()[0]._actions if a.dest != "help"]


def _tables():
    return {"UNSUPPORTED": support.UNSUPPORTED, "NO_EFFECT_HERE": support.NO_EFFECT_HERE,
            "INFORMATIONAL": support.INFORMATIONAL, "ALWAYS_ON": support.ALWAYS_ON, "SLIME_ONLY": support.SLIME_ONLY}


def test_every_dest_is_read_or_classified():
    classified = set().union(*_tables().values())
    unread = sorted(a.dest for a in _actions() if a.dest not in _read_dests() and a.dest not in classified)
    assert unread == [], ("these flags are accepted but nothing outside slime_like/config/ reads them; honour them or "
                          f"add them to a table in slime_like/config/support.py: {unread}")


def test_tables_name_real_dests_once_with_a_reason():
    dests = {a.dest for a in _actions()}
    seen = {}
    for name, table in _tables().items():
        for dest, why in table.items():
            assert dest in dests, f"support.{name} names {dest!r}, which is not a parser dest"
            assert dest not in seen, f"{dest!r} is in both {seen.get(dest)} and {name}"
            assert isinstance(why, str) and len(why) > 10, f"support.{name}[{dest!r}] needs a reason"
            seen[dest] = name
    assert set(support.APPLIES_WHEN) <= set(support.UNSUPPORTED) | set(support.NO_EFFECT_HERE)


def test_no_table_entry_refuses_a_flag_the_product_now_honours():
    overlap = (set(support.UNSUPPORTED) | set(support.NO_EFFECT_HERE)) & _read_dests()
    assert overlap <= GUARDED_DOWNSTREAM, (f"{sorted(overlap - GUARDED_DOWNSTREAM)} are read by product code now: "
                                           "delete their entries from slime_like/config/support.py")


def test_informational_dests_are_consumed_by_the_config_layer():
    config = ROOT / "slime_like" / "config"
    text = "\n".join(f.read_text() for f in config.rglob("*.py") if f.name != "support.py")
    actions = {a.dest: a for a in _actions()}
    for dest in support.INFORMATIONAL:
        single_choice = actions[dest].choices is not None and len(actions[dest].choices) == 1
        assert single_choice or re.search(rf"args\.{dest}\b|[\"']{dest}[\"']", text), dest


def _non_default_tokens(action) -> list:
    """Command-line tokens that set `action` to a valid value different from its default."""
    flag, default = action.option_strings[0], action.default
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return [flag]
    if action.choices is not None:
        value = next(c for c in action.choices if c != default and [c] != default)
    elif action.type is json_value:
        value = '{"A": "1"}'
    elif ranged(action) is not None:  # a valid number other than the default
        candidates = [(default or 1) + 1, 2, 1, 0] if ranged(action).kind == "int" else \
            [(default or 0.25) * 2, (default or 0.25) / 2, 0.5, 1.5]
        value = next(v for v in candidates if v != default and _accepts(ranged(action), v))
    else:
        value = "x"
    return [flag, str(value)]


def _accepts(converter, value) -> bool:
    try:
        converter(value)
        return True
    except argparse.ArgumentTypeError:
        return False


def _action(dest):
    return next(a for a in _actions() if a.dest == dest)


@pytest.mark.parametrize("table", ["UNSUPPORTED", "NO_EFFECT_HERE"])
def test_every_table_entry_fires_at_startup(base, table, capsys):
    """Each UNSUPPORTED flag set to a non-default value errors naming it; each NO_EFFECT_HERE one warns."""
    for dest in getattr(support, table):
        tokens = _non_default_tokens(_action(dest))
        if table == "UNSUPPORTED":  # parses (--dry-run plans it); the launch refuses it
            refusals = parse_report(base + CONTEXT.get(dest, []) + tokens)[1].launch_refusals
            mine = [r for r in refusals if r.startswith(tokens[0] + " ")]
            assert len(mine) == 1 and "not honoured" in mine[0], (tokens, refusals)
        else:
            _, report = parse_report(base + tokens)
            assert any(w.startswith(tokens[0] + " ") and "no effect" in w for w in report.warnings), tokens
    if table == "NO_EFFECT_HERE":
        assert "WARNING: --use-flash-attn is accepted but not honoured" in capsys.readouterr().err


def test_defaults_and_recipe_values_pass_silently(base):
    _, report = parse_report(base + ["--context-parallel-size", "1", "--ckpt-format", "torch_dist",
                                     "--kv-lora-rank", "32", "--accumulate-allreduce-grads-in-fp32"])
    assert not any("not honoured" in w for w in report.warnings)


def test_rules_apply_only_where_the_value_is_really_ignored(base, hf_dir):
    args, report = parse_report(base + ["--position-embedding-type", "rope", "--no-position-embedding",
                                        "--tokenizer-model", hf_dir])
    assert args.add_position_embedding is False
    assert not any("not honoured" in w for w in report.warnings)
    with pytest.raises(ConfigError, match="--no-position-embedding is accepted .* not honoured"):
        refuse_at_launch(base + ["--no-position-embedding"])


def test_refused_flags_stop_the_launch_not_the_dry_run(base, capsys):
    """A GPU-valid configuration plans; train.py refuses it before Ray starts, exit status 2."""
    from train import main

    argv = base + ["--fp8-format", "e4m3", "--context-parallel-size", "2", "--early-stop-imp-ratio", "2.0"]
    assert main(argv + ["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "REFUSED AT LAUNCH: --fp8-format e4m3 --fp8-recipe delayed: FP8 training needs TransformerEngine" in out
    # context parallelism runs; a per-micro-batch early stop would differ between CP ranks
    assert "REFUSED AT LAUNCH: --context-parallel-size 2 with --early-stop-imp-ratio" in out
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error: this run cannot start: " in err and "--fp8-format e4m3 --fp8-recipe delayed: FP8" in err
    assert "its per-micro-batch stop would differ between CP ranks" in err


def _overlay(tmp_path, overrides, role="critic") -> str:
    path = tmp_path / "roles.yaml"
    path.write_text(yaml.safe_dump({"megatron": [{"role": role, "overrides": overrides}]}))
    return str(path)


def test_yaml_overlay_follows_the_same_rules(base, tmp_path):
    ppo = base + ["--advantage-estimator", "ppo"]
    with pytest.raises(ConfigError, match=r"roles.yaml \(role critic\): key 'squared_relu'.*not honoured"):
        overlay = _overlay(tmp_path, {"squared_relu": True})
        refuse_at_launch(ppo + ["--megatron-config-path", overlay])
    with pytest.raises(ConfigError, match=r"key 'use_slime_router' is a slime setting for slime's own router"):
        parse(ppo + ["--megatron-config-path", _overlay(tmp_path, {"use_slime_router": True})])
    with pytest.raises(ConfigError, match=r"key 'use_routing_replay' is a slime extras setting of the whole run"):
        parse(ppo + ["--megatron-config-path", _overlay(tmp_path, {"use_routing_replay": True})])
    with pytest.raises(ConfigError, match=r"key 'use_opd' is a slime extras setting of the whole run"):
        parse(ppo + ["--megatron-config-path", _overlay(tmp_path, {"use_opd": True})])
    _, report = parse_report(ppo + ["--megatron-config-path", _overlay(tmp_path, {"overlap_param_gather": True,
                                                                                  "lr": 1e-5})])
    assert any("key 'overlap_param_gather'" in w and "no effect" in w for w in report.warnings)
    # shared settings are not per-role: only the trainers see role overrides
    for key, value in (("rollout_temperature", 0.5), ("use_wandb", True), ("global_batch_size", 4)):
        with pytest.raises(ConfigError, match=rf"key '{key}' is a .* setting of the whole run"):
            parse(ppo + ["--megatron-config-path", _overlay(tmp_path, {key: value})])
    args = parse(ppo + ["--megatron-config-path", _overlay(tmp_path, {"micro_batch_size": 2, "save": str(tmp_path)})])
    assert args.megatron_role_overrides["critic"]["micro_batch_size"] == 2
    # a key at its default is not an error (the CLI baseline already has that value)
    args = parse(ppo + ["--megatron-config-path", _overlay(tmp_path, {"context_parallel_size": 1})])
    assert args.megatron_role_overrides["critic"] == {"context_parallel_size": 1}


def test_rollout_flags_are_real_flags_with_the_rollout_defaults(base):
    from slime_like.rollout import multi_turn_example

    args = parse(base)
    assert (args.rm_timeout, args.rm_max_retries, args.rm_retry_backoff) == (60.0, 10, 0.5)
    assert (args.tool_call_end, args.max_tool_turns, args.disable_tqdm) == (multi_turn_example.TOOL_END, 4, False)
    args = parse(base + ["--rm-timeout", "5", "--rm-max-retries", "2", "--rm-retry-backoff", "0.1", "--disable-tqdm",
                         "--tool-call-end", "</call>", "--max-tool-turns", "2"])
    assert (args.rm_timeout, args.rm_max_retries, args.rm_retry_backoff) == (5.0, 2, 0.1)
    assert (args.tool_call_end, args.max_tool_turns, args.disable_tqdm) == ("</call>", 2, True)


@pytest.mark.parametrize("extra, message", [
    (["--rm-max-retries", "0"], "--rm-max-retries: 0: must be >= 1"),   # the flag's range (config/types.py)
    (["--rm-timeout", "0"], "--rm-timeout: 0: must be > 0"),
    (["--rm-retry-backoff", "-1"], "--rm-retry-backoff: -1: must be > 0"),
    (["--max-tool-turns", "-1"], "--max-tool-turns: -1: must be >= 0"),
    (["--tool-call-end", ""], "--tool-call-end must be a non-empty"),
])
def test_rollout_flag_values_are_checked(base, extra, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse(base + extra)


def test_docs_list_every_refused_and_no_effect_flag():
    doc = (ROOT / "docs" / "configuration.md").read_text()
    section = doc[doc.index("## Accepted flags we do not honour"):doc.index("## All flags")]
    flags = [_action(d).option_strings[0] for d in [*support.UNSUPPORTED, *support.NO_EFFECT_HERE]]
    assert [f for f in flags if f"| `{f}` |" not in section] == []


def test_sglang_values_the_cpu_engine_cannot_use_warn(base):
    _, report = parse_report(base + ["--rollout-engine", "cpu", "--sglang-mem-fraction-static", "0.7",
                                     "--sglang-context-length", "512"])
    notes = [w for w in report.warnings if "--sglang-" in w]
    assert len(notes) == 1 and "--sglang-mem-fraction-static 0.7: no effect on the cpu rollout engine" in notes[0]
    assert "--sglang-context-length 512" not in notes[0]
    _, report = parse_report(base + ["--rollout-engine", "cpu", "--sglang-context-length", "512",
                                     "--sglang-server-concurrency", "8"])
    assert not any("--sglang-" in w for w in report.warnings)


def test_cpu_engine_keys_agree_with_the_launcher(base):
    """The CPU engine's command line carries exactly the --sglang-* values support.py says it understands."""
    from slime_like.backends.cpu_engine.launch import build_cpu_engine_command
    from slime_like.backends.engine_api.launcher import CLIENT_SIDE

    assert set(engines.SGLANG_CLIENT_SIDE) == set(CLIENT_SIDE)
    args = parse(base + ["--rollout-engine", "cpu", "--sglang-dtype", "bfloat16", "--sglang-max-running-requests", "3",
                         "--sglang-context-length", "512", "--sglang-mem-fraction-static", "0.7"])
    cmd = " ".join(build_cpu_engine_command(args, port=1))
    for key in ROLLOUT_ENGINES.fact("cpu", "sglang_keys"):
        assert "--" + key.replace("_", "-") in cmd, key
    assert "mem-fraction" not in cmd
