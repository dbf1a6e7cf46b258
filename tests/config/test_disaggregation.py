"""Prefill / decode disaggregation (--prefill-num-servers, or prefill / decode groups of slime's --sglang-config
layout): which engines prefill and which decode, slime's rules, the launch refusals, the roles in the dry run and in
the engines' and router's commands. SGLang's own ServerArgs and sglang_router's parser read those commands in
tests/sglang_peer (test_prefill_and_decode_engines_and_their_router_as_sglang_reads_them)."""
import argparse

import pytest

from cfg_helpers import parse, parse_report
from slime_like.backends.engine_api.engine import pd_role
from slime_like.backends.sglang.engine import SGLangEngine
from slime_like.backends.sglang.router import build_router_command
from slime_like.config.errors import ConfigError


@pytest.fixture
def four_engines(hf_dir, gpu_machine):
    """Four SGLang engines of 2 GPUs on their own 8 GPUs (disaggregated from the 2 actor GPUs), on a GPU plan."""
    return ["--hf-checkpoint", hf_dir, "--rollout-batch-size", "4", "--n-samples-per-prompt", "2",
            "--num-rollout", "2", "--actor-num-gpus-per-node", "2", "--num-gpus-per-node", "8",
            "--rollout-num-gpus", "8", "--rollout-num-gpus-per-engine", "2", "--rollout-engine", "sglang"]


def _pd_refusals(report):
    return [r for r in report.launch_refusals if r.startswith("--prefill-num-servers")]


def test_first_engines_prefill_the_rest_decode_and_the_dry_run_says_so(four_engines, capsys):
    from slime_like.plan import print_dry_run

    args, report = parse_report(four_engines + ["--prefill-num-servers", "1", "--dry-run"])
    assert args.prefill_num_servers == 1 and _pd_refusals(report) == []
    assert [pd_role(args, i) for i in range(4)] == ["prefill", "decode", "decode", "decode"]
    print_dry_run(args, report)
    assert "engines: 4 x 2 GPU(s) (1 prefill, 3 decode: prefill / decode disaggregation)" in capsys.readouterr().out
    plain, _ = parse_report(four_engines)
    assert plain.prefill_num_servers is None and pd_role(plain, 0) is None


@pytest.mark.parametrize("extra,words", [
    (["--prefill-num-servers", "4"], "--prefill-num-servers 4: the run has 4 rollout engine(s) of 2 GPU(s) "
                                     "(--rollout-num-gpus 8), so none would decode"),
    (["--prefill-num-servers", "0"], "--prefill-num-servers"),
    (["--prefill-num-servers", "1", "--sglang-router-ip", "10.0.0.1", "--sglang-router-port", "8000"],
     "the router in front of prefill and decode engines must run with --pd-disaggregation"),
    (["--prefill-num-servers", "1", "--sglang-disaggregation-mode", "prefill"],
     "--sglang-disaggregation-mode is set by the engine launcher"),
])
def test_what_slime_rules_out_is_an_error_before_launch(four_engines, extra, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse(four_engines + extra)


def test_external_engines_cannot_take_roles(hf_dir):
    argv = ["--hf-checkpoint", hf_dir, "--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--num-rollout",
            "1", "--rollout-external-engine-addrs", "127.0.0.1:30000", "127.0.0.1:30001", "--prefill-num-servers", "1"]
    with pytest.raises(ConfigError, match="with --rollout-external-engine-addrs: the engines' prefill / decode roles"):
        parse(argv)


def test_the_cpu_engine_and_fault_tolerance_are_refused_at_launch(four_engines):
    cpu = [a if a != "sglang" else "cpu" for a in four_engines]
    _, report = parse_report(cpu + ["--prefill-num-servers", "1"])
    (refusal,) = _pd_refusals(report)
    assert "prefills and decodes in one process and has no KV-cache transfer" in refusal
    _, report = parse_report(four_engines + ["--prefill-num-servers", "1", "--use-fault-tolerance"])
    assert [r for r in _pd_refusals(report) if "with --use-fault-tolerance: restarting a prefill" in r]


def _layout(tmp_path, groups: str) -> str:
    path = tmp_path / "layout.yaml"
    path.write_text("sglang:\n  - name: actor\n    server_groups:\n" + groups)
    return str(path)


def test_slime_layout_prefill_and_decode_groups_set_the_roles(four_engines, tmp_path):
    groups = ("      - {worker_type: prefill, num_gpus: 4}\n"
              "      - {worker_type: decode, num_gpus: 4}\n")
    argv = [a for a in four_engines]
    i = argv.index("--rollout-num-gpus")
    del argv[i:i + 2]
    args, _ = parse_report(argv + ["--sglang-config", _layout(tmp_path, groups)])
    assert args.prefill_num_servers == 2 and args.rollout_num_gpus == 8
    with pytest.raises(ConfigError, match=r"prefill / decode groups and --prefill-num-servers 1 set the same thing"):
        parse(argv + ["--sglang-config", _layout(tmp_path, groups), "--prefill-num-servers", "1"])
    mixed = groups + "      - {worker_type: regular, num_gpus: 2}\n"
    with pytest.raises(ConfigError, match=r"worker types \['decode', 'prefill', 'regular'\]; prefill / decode"):
        parse(argv + ["--sglang-config", _layout(tmp_path, mixed)])
    with pytest.raises(ConfigError, match=r"worker types \['prefill'\]"):
        parse(argv + ["--sglang-config", _layout(tmp_path, "      - {worker_type: prefill, num_gpus: 8}\n")])


def test_engine_and_router_commands_carry_the_roles():
    engine = SGLangEngine()
    assert engine.disaggregation_args("prefill", 9000) == ["--disaggregation-mode", "prefill",
                                                           "--disaggregation-bootstrap-port", "9000"]
    assert engine.disaggregation_args("decode", None) == ["--disaggregation-mode", "decode"]
    with pytest.raises(ValueError, match="needs its bootstrap port"):
        engine.disaggregation_args("prefill", None)
    args = argparse.Namespace(router_args={}, sglang_router_request_timeout_secs=None, engine_api_key=None)
    cmd = build_router_command(args, ["http://a:1", "http://b:2"], pd=([("http://a:1", 9000)], ["http://b:2"]))
    assert "--worker-urls" not in cmd
    assert cmd[cmd.index("--pd-disaggregation"):] == ["--pd-disaggregation", "--prefill", "http://a:1", "9000",
                                                      "--decode", "http://b:2"]
