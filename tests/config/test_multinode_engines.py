"""Rollout engines spanning nodes (--rollout-num-gpus-per-engine > --num-gpus-per-node): the plan gives each whole
nodes; SGLang runs one over them (one server process per node: ray/engine_nodes.py; its per-node commands are checked
by SGLang's own ServerArgs in tests/sglang_peer); what is not built for such an engine is refused at launch, saying
why; the weight push reaches every rank of it (colocated: a handle made on each rank's node)."""
import argparse

import pytest

from cfg_helpers import parse_report
from slime_like.backends.engine_api.engine import EngineNode, engine_nodes
from slime_like.backends.engine_api.weight_sync import DistributedWeightSender
from slime_like.config.cluster import _multi_node_engine
from slime_like.config.report import ConfigReport
from slime_like.plan import build_plan


def run(hf_dir, *flags):
    return parse_report(["--hf-checkpoint", hf_dir, "--rollout-batch-size", "8", "--n-samples-per-prompt", "2",
                         "--num-rollout", "1", "--num-gpus-per-node", "2", *flags])


def test_the_plan_gives_an_engine_whole_nodes(hf_dir):
    args, _ = run(hf_dir, "--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "4",
                  "--rollout-num-gpus-per-engine", "4")
    p = build_plan(args)
    assert p.num_nodes == 3 and len(p.engines) == 1
    assert [(s.node, s.local_gpu) for s in p.engines[0]] == [(1, 0), (1, 1), (2, 0), (2, 1)]


def _args(engine="sglang", colocate=False, fault_tolerance=False, transport="nccl"):
    return argparse.Namespace(rollout_engine=engine, colocate=colocate, debug_rollout_only=False,
                              use_fault_tolerance=fault_tolerance, update_weight_transport=transport)


@pytest.mark.parametrize("kw,words", [
    ({}, None),
    ({"colocate": True}, None),   # each engine rank gets a handle made on its node (engine_api/node_handles.py)
    ({"colocate": True, "transport": "disk"}, None),  # every rank reloads the files (a filesystem all nodes see)
    ({"engine": "cpu"}, "the CPU engine runs each engine on one node; use --rollout-engine sglang"),
    ({"engine": "vllm"}, "the vLLM adapter runs each engine on one node"),
    ({"fault_tolerance": True}, "with --use-fault-tolerance: restarting an engine that spans nodes"),
])
def test_what_an_engine_over_nodes_needs(kw, words):
    report = ConfigReport()
    _multi_node_engine(_args(**kw), report, 16, 8)
    if words is None:
        assert report.launch_refusals == []
    else:
        (refusal,) = report.launch_refusals
        assert refusal.startswith("--rollout-num-gpus-per-engine 16 > --num-gpus-per-node 8 (one engine over 2 "
                                  "nodes)") and words in refusal, refusal


def test_a_cpu_run_plans_it_and_the_launch_names_the_engine(hf_dir):
    args, report = run(hf_dir, "--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "4",
                       "--rollout-num-gpus-per-engine", "4")
    assert [r for r in report.launch_refusals if "runs each engine on one node" in r]


def test_node_plan_and_the_push_to_every_rank():
    nodes = engine_nodes([[0, 1, 2, 3], [0, 1, 2, 3]], "10.0.0.5:5000")
    assert [n for n, _ in nodes] == [EngineNode(2, 0, "10.0.0.5:5000"), EngineNode(2, 1, "10.0.0.5:5000")]
    with pytest.raises(ValueError, match="the same number of GPUs on each"):
        engine_nodes([[0, 1], [0]], "h:1")
    # two engines of 8 ranks each: the trainer is rank 0, engine i's ranks start at 1 + 8 i
    sender = DistributedWeightSender(["http://a:1", "http://b:2"], engine_tp_size=8, master_address="10.0.0.1",
                                     master_port=29000)
    assert sender.world_size == 17
    assert [p["rank_offset"] for p in sender.init_payloads()] == [1, 9]
