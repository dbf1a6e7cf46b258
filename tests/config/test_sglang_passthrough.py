"""--sglang-* passthrough (generic mode: sglang is not installed here) and --sglang-config."""
import sys

import pytest

from slime_like.config.errors import ConfigError
from slime_like.config.sglang_passthrough import extract_generic

from cfg_helpers import parse


def test_generic_forms(base):
    args = parse(base + ["--sglang-mem-fraction-static", "0.7", "--sglang-enable-dp-attention",
                         "--sglang-context-length=4096", "--sglang-attention-backend", "fa3",
                         "--sglang-log-level", "-1", "--sglang-server-concurrency", "64"])
    assert args.sglang_server_args == {"mem_fraction_static": 0.7, "enable_dp_attention": True,
                                       "context_length": 4096, "attention_backend": "fa3", "log_level": -1}
    assert args.sglang_mem_fraction_static == 0.7 and args.sglang_enable_dp_attention is True
    assert args.sglang_server_concurrency == 64  # slime's own flag, not passed to the server
    assert args.sglang_passthrough_mode == "generic"


def test_launcher_owned_fields_rejected(base):
    with pytest.raises(ConfigError, match="--sglang-tp-size is set by the engine launcher"):
        parse(base + ["--sglang-tp-size", "2"])


def test_sglang_config_file_and_cli_wins(base, tmp_path):
    cfg = tmp_path / "sgl.yaml"
    cfg.write_text("mem_fraction_static: 0.5\nchunked_prefill_size: 4096\n")
    args = parse(base + ["--sglang-config", str(cfg), "--sglang-mem-fraction-static", "0.8"])
    assert args.sglang_server_args == {"mem_fraction_static": 0.8, "chunked_prefill_size": 4096}
    cfg.write_text("- not a mapping\n")
    with pytest.raises(ConfigError, match="expected a mapping of SGLang ServerArgs fields"):
        parse(base + ["--sglang-config", str(cfg)])
    cfg.write_text("port: 3000\n")
    with pytest.raises(ConfigError, match="'port' is set by the engine launcher"):
        parse(base + ["--sglang-config", str(cfg)])


def test_generic_list_values(base):
    args = parse(base + ["--sglang-cuda-graph-bs", "1", "2", "4", "--sglang-log-level", "info"])
    assert args.sglang_server_args == {"cuda_graph_bs": [1, 2, 4], "log_level": "info"}


def test_extract_keeps_other_tokens_in_order():
    rest, found = extract_generic(["--lr", "1", "--sglang-a", "x", "--seed", "3", "--sglang-b"], {"--lr", "--seed"})
    assert rest == ["--lr", "1", "--seed", "3"] and found == {"a": "x", "b": True}


STUB = '''
class ServerArgs:
    @staticmethod
    def add_cli_args(parser):
        parser.add_argument("--model-path", type=str, required=True)
        parser.add_argument("--tp-size", type=int, default=1)
        g = parser.add_argument_group("memory")
        g.add_argument("--mem-fraction-static", type=float, default=None)
        g.add_argument("--enable-dp-attention", action="store_true")
        parser.add_argument("--schedule-policy", type=str, default="fcfs", choices=["fcfs", "lpm"])
'''


@pytest.fixture
def stub_sglang(tmp_path, monkeypatch):
    """A stand-in `sglang` package (third-party, absent here) exposing ServerArgs.add_cli_args."""
    pkg = tmp_path / "stub" / "sglang" / "srt"
    pkg.mkdir(parents=True)
    (tmp_path / "stub" / "sglang" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "server_args.py").write_text(STUB)
    monkeypatch.syspath_prepend(str(tmp_path / "stub"))
    monkeypatch.delenv("SLIME_LIKE_SGLANG_PASSTHROUGH", raising=False)
    yield
    for name in [m for m in sys.modules if m.split(".")[0] == "sglang"]:  # later tests must not see the stub
        del sys.modules[name]


def test_generated_from_server_args(base, stub_sglang):
    args = parse(base + ["--sglang-mem-fraction-static", "0.6", "--sglang-schedule-policy", "lpm"])
    assert args.sglang_passthrough_mode == "generated"
    assert args.sglang_server_args == {"mem_fraction_static": 0.6, "schedule_policy": "lpm"}
    assert args.sglang_enable_dp_attention is False  # registered with sglang's own default
    with pytest.raises(ConfigError, match="invalid choice: 'lifo'"):
        parse(base + ["--sglang-schedule-policy", "lifo"])
    with pytest.raises(ConfigError, match=r"unknown flag --sglang-mem-fraction \(did you mean --sglang-mem-fraction-static"):
        parse(base + ["--sglang-mem-fraction", "0.5"])
    with pytest.raises(ConfigError, match="unknown flag --sglang-tp-size"):  # launcher-owned: not registered
        parse(base + ["--sglang-tp-size", "2"])
    # A run that cannot use SGLang never imports it: generic mode.
    assert parse(base + ["--rollout-engine", "cpu", "--sglang-foo", "1"]).sglang_passthrough_mode == "generic"


def test_slime_engine_layout_file(base, tmp_path):
    """slime's --sglang-config engine layout (sglang: [{name, server_groups: [...]}]): its regular groups become
    the engines (GPUs summed, engine size, shared overrides as server settings); what is not built is refused by
    the key that asks for it, instead of a bogus --sglang-sglang server argument."""
    import yaml

    def layout(*groups, **model):
        cfg = tmp_path / f"layout{len(list(tmp_path.iterdir()))}.yaml"
        cfg.write_text(yaml.safe_dump({"sglang": [{"name": "actor", **model, "server_groups": list(groups)}]}))
        return str(cfg)

    disagg = [a for a in base if a != "--colocate"]  # engines on GPUs of their own
    args = parse(disagg + ["--sglang-config", layout(
        {"worker_type": "regular", "num_gpus": 2, "num_gpus_per_engine": 2, "overrides": {"mem_fraction_static": 0.6}},
        {"worker_type": "regular", "num_gpus": 4, "num_gpus_per_engine": 2, "overrides": {"mem_fraction_static": 0.6}}),
        "--num-gpus-per-node", "8"])
    assert (args.rollout_num_gpus, args.rollout_num_gpus_per_engine) == (6, 2)
    assert args.sglang_server_args == {"mem_fraction_static": 0.6} and "sglang" not in args.sglang_server_args
    colocated = parse(base + ["--sglang-config", layout({"worker_type": "regular", "num_gpus": 2})])
    assert colocated.rollout_num_gpus_per_engine == 1
    refused = {
        r"server_groups\[0\].worker_type: encoder: encoder / prefill / decode disaggregation is not built":
            layout({"worker_type": "encoder", "num_gpus": 1}, {"worker_type": "decode", "num_gpus": 1}),
        r"server_groups\[0\].worker_type: placeholder: GPU slots reserved without engines are not built":
            layout({"worker_type": "placeholder", "num_gpus": 2}),
        "engines of \\[1, 2\\] GPUs; the engines here are all one size":
            layout({"worker_type": "regular", "num_gpus": 2, "num_gpus_per_engine": 1},
                   {"worker_type": "regular", "num_gpus": 2, "num_gpus_per_engine": 2}),
        "server_groups hold 4 GPUs, but --colocate puts the engines on the actor's 2":
            layout({"worker_type": "regular", "num_gpus": 4}),
        "sglang\\[0\\].update_weights: false":
            layout({"worker_type": "regular", "num_gpus": 2}, update_weights=False),
    }
    for message, path in refused.items():
        with pytest.raises(ConfigError, match=message):
            parse(base + ["--sglang-config", path])
    two = tmp_path / "two.yaml"
    two.write_text(yaml.safe_dump({"sglang": [{"name": "actor", "server_groups": [{"worker_type": "regular",
                                                                                   "num_gpus": 2}]},
                                              {"name": "ref", "update_weights": False,
                                               "server_groups": [{"worker_type": "regular", "num_gpus": 2}]}]}))
    with pytest.raises(ConfigError, match=r"sglang: 2 models \(actor, ref\); one is served here"):
        parse(base + ["--sglang-config", str(two)])
