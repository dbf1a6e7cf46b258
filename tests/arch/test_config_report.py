"""What the configuration layer finds (warnings, launch refusals, preflight notes, missing paths, the --config
translation, applied defaults) goes to the ConfigReport beside the Namespace, never onto it: after real parses of
configurations that warn, refuse and translate, no such attribute exists on `args`, and no module of
slime_like/config/ writes one onto anything but the report (an AST scan)."""
import ast
import json
import pathlib

import pytest

from slime_like.args import parse_run

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIG = ROOT / "slime_like" / "config"
FRONTEND_FILES = ROOT / "tests" / "config" / "frontend_files"
# the bookkeeping names that rode on args before the report existed, and the report's own field names
REPORT_NAMES = {"config_warnings", "launch_refusals", "preflight_notes", "config_path_problems", "config_translation",
                "warnings", "notes", "path_problems", "applied_defaults", "translation"}
TINY_QWEN2 = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 128,
              "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "hidden_act": "silu",
              "max_position_embeddings": 256}


@pytest.fixture
def base(tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(TINY_QWEN2))
    for name in ("tokenizer.json", "model.safetensors"):
        (hf / name).touch()
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    return {"hf": str(hf), "data": str(data),
            "argv": ["--hf-checkpoint", str(hf), "--rollout-batch-size", "4", "--n-samples-per-prompt", "2",
                     "--num-rollout", "2", "--colocate", "--actor-num-gpus-per-node", "2", "--num-gpus-per-node", "2",
                     "--prompt-data", str(data), "--input-key", "prompt"]}


def _configurations(base):
    argv, hf, data = base["argv"], base["hf"], base["data"]
    return {
        "plain": argv,
        "warns": argv + ["--use-flash-attn", "--sequence-parallel", "--kl-coef", "0.1", "--max-staleness", "2"],
        "refuses": argv + ["--use-slime-router", "--check-weight-update-equal", "--rollout-external-engine-addrs",
                           "127.0.0.1:1", "--use-fault-tolerance"],
        "ppo": argv + ["--num-rollout", "20", "--advantage-estimator", "ppo", "--megatron-config-path",
                       str(ROOT / "scripts" / "configs" / "ppo.yaml")],
        "rlinf file": ["--config", str(FRONTEND_FILES / "rlinf_seed001.yaml"), f"rollout.model_dir={hf}",
                       f"actor.tokenizer.tokenizer_model={hf}", f"data.train_data_paths=[{data}]",
                       f"data.val_data_paths=[{data}]", "data.answer_key=answer"],
    }


def test_parses_leave_no_report_attribute_on_the_namespace(base, capsys):
    seen = {"warnings": 0, "launch_refusals": 0, "translation": 0, "applied_defaults": 0}
    for name, argv in _configurations(base).items():
        for preflight in (False, True):
            args, _, report = parse_run(argv, exit_on_error=False, preflight=preflight)
            leaked = REPORT_NAMES & set(vars(args))
            assert not leaked, f"{name}: {sorted(leaked)} written onto args"
            for field in seen:
                seen[field] += bool(getattr(report, field))
    # the configurations really produced every kind of finding, so the check above means something
    assert all(seen.values()), seen
    capsys.readouterr()


def _receiver(node) -> str:
    return node.id if isinstance(node, ast.Name) else type(node).__name__


def test_no_config_module_writes_findings_onto_args():
    """Only the report itself (`self` in report.py) or a `report` variable may hold these attributes; nothing
    calls the old warn(args, ...) or setattr(args, "config_warnings", ...)."""
    offences = []
    for path in sorted(CONFIG.rglob("*.py")):
        tree = ast.parse(path.read_text())
        where = path.relative_to(ROOT)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in REPORT_NAMES:
                if _receiver(node.value) not in ("self", "report"):
                    offences.append(f"{where}:{node.lineno}: {_receiver(node.value)}.{node.attr}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr",
                                                                                                     "warn"):
                first = node.args[1] if node.func.id == "setattr" and len(node.args) > 1 else None
                if node.func.id == "warn" or (isinstance(first, ast.Constant) and first.value in REPORT_NAMES):
                    offences.append(f"{where}:{node.lineno}: {node.func.id}(...)")
    assert not offences, "findings written outside the ConfigReport:\n" + "\n".join(offences)


def test_the_report_is_what_the_launch_refuses_on(base):
    _, _, report = parse_run(base["argv"] + ["--use-slime-router"], exit_on_error=False)
    assert [r for r in report.launch_refusals if r.startswith("--use-slime-router is a slime flag")]
    from slime_like.config.errors import ConfigError

    with pytest.raises(ConfigError, match="this run cannot start: --use-slime-router"):
        report.refuse_at_launch()
