"""The run says what it ran: RUN_DIR/config.yaml with each non-default value's source, the role values that
differ from the shared ones, and --dry-run showing a role value a YAML entry set even when it is the default."""
import os

import yaml

import train
from cfg_helpers import parse, parse_report
from slime_like.config.provenance import start_lines, write_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PPO_YAML = os.path.join(REPO, "scripts", "configs", "ppo.yaml")  # actor lr 1e-6 (the default), critic lr 1e-5


def _ppo(base, tmp_path):
    return [*base, "--advantage-estimator", "ppo", "--megatron-config-path", PPO_YAML, "--lr", "1e-4",
            "--num-rollout", "20", "--run-dir", str(tmp_path / "run")]


def test_config_yaml_names_every_source_and_a_resume_appends(base, tmp_path):
    argv = _ppo(base, tmp_path)
    args, report = parse_report(argv)
    path = write_config(args, report, argv)
    doc = yaml.safe_load(open(path))
    shared, roles = doc["shared"], doc["roles"]
    assert shared["lr"] == {"value": 1e-4, "source": "CLI"}
    assert shared["hidden_size"] == {"value": 64, "source": "config.json"}  # no MODEL_ARGS: filled from the HF dir
    assert shared["global_batch_size"] == {"value": 8, "source": "derived"}
    assert roles["actor"]["lr"] == {"value": 1e-6, "source": f"YAML {PPO_YAML} megatron[0], over the CLI's --lr 0.0001"}
    assert roles["critic"]["lr_warmup_iters"] == {"value": 10, "source": f"YAML {PPO_YAML} megatron[1]"}
    assert "--lr 1e-4" in doc["command"]
    # every value, defaults included, so a later change of a default cannot change what a re-run means
    from slime_like.config.dry_run import _INTERNAL
    from slime_like.config.parser import defaults_of, shared_parser

    everything = doc["all_values"]
    assert everything["lr"] == 1e-4 and everything["global_batch_size"] == 8
    assert everything["lr_decay_style"] == "linear" and everything["seed"] == 1234  # defaults, absent from `shared`
    assert "lr_decay_style" not in shared and "seed" not in shared
    dests = [d for d in defaults_of(shared_parser()) if d in vars(args) and not d.startswith("sglang_")]
    assert [d for d in dests if d not in everything and d not in _INTERNAL] == []
    assert any(line.startswith("role actor: lr=1e-06 (YAML") for line in start_lines(args, report))
    write_config(*parse_report(argv), argv)  # the same run directory again (a resume): a 2nd document, the 1st kept
    docs = list(yaml.safe_load_all(open(path)))
    assert len(docs) == 2 and docs[0] == doc


def test_dry_run_shows_a_yaml_value_equal_to_the_default(base, tmp_path, capsys):
    assert train.main(_ppo(base, tmp_path) + ["--dry-run"]) == 0
    out = capsys.readouterr().out
    actor = out.split("-- role actor: values not shared by every role --")[1].split("\n-- ")[0]
    assert "lr = 1e-06    <- YAML megatron[0], over the CLI's --lr 0.0001" in actor
    assert "(all defaults)" not in actor
