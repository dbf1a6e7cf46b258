"""The placement plan: colocated and disaggregated layouts on 1 and 2 nodes (pure function, no Ray)."""
import pytest

from slime_like.config.errors import ConfigError
from slime_like.plan import build_plan

from cfg_helpers import parse


def run(hf_dir, *flags):
    return parse(["--hf-checkpoint", hf_dir, "--rollout-batch-size", "8", "--n-samples-per-prompt", "2",
                  "--num-rollout", "1", *flags])


def where(slots):
    return [(s.node, s.local_gpu, s.bundle) for s in slots]


def test_colocated_one_node(hf_dir):
    p = build_plan(run(hf_dir, "--colocate", "--actor-num-gpus-per-node", "4", "--num-gpus-per-node", "4",
                       "--rollout-num-gpus-per-engine", "2"))
    assert p.colocate and p.num_nodes == 1 and p.num_slots == 4
    assert where(p.actor) == [(0, 0, 0), (0, 1, 1), (0, 2, 2), (0, 3, 3)]
    assert p.engine_slots == [[0, 1], [2, 3]] and p.critic == []
    assert p.engine_kind == "cpu"


def test_colocated_two_nodes_with_critic(hf_dir):
    p = build_plan(run(hf_dir, "--colocate", "--actor-num-nodes", "2", "--actor-num-gpus-per-node", "4",
                       "--num-gpus-per-node", "4", "--rollout-num-gpus-per-engine", "2", "--advantage-estimator", "ppo"))
    assert p.num_nodes == 2 and p.num_slots == 8
    assert p.actor_slots == list(range(8)) and p.critic_slots == p.actor_slots
    assert where(p.actor)[4] == (1, 0, 4)
    assert p.engine_slots == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert all(len({s.node for s in e}) == 1 for e in p.engines)


def test_disaggregated_one_node(hf_dir):
    p = build_plan(run(hf_dir, "--actor-num-gpus-per-node", "2", "--num-gpus-per-node", "8", "--rollout-num-gpus", "4",
                       "--rollout-num-gpus-per-engine", "2", "--advantage-estimator", "ppo",
                       "--critic-num-gpus-per-node", "2"))
    assert not p.colocate and p.num_nodes == 1 and p.num_slots == 8
    assert p.actor_slots == [0, 1] and p.critic_slots == [2, 3]  # critic on its own GPUs, after the actor
    assert p.engine_slots == [[4, 5], [6, 7]]
    used = p.actor_slots + p.critic_slots + [b for e in p.engine_slots for b in e]
    assert len(used) == len(set(used))  # nobody shares a GPU when disaggregated


def test_disaggregated_two_nodes_engines_never_span(hf_dir):
    # actor 6 GPUs on node 0; 2 slots left there, engines of 4 GPUs must start on node 1.
    p = build_plan(run(hf_dir, "--actor-num-gpus-per-node", "6", "--num-gpus-per-node", "8", "--rollout-num-gpus", "8",
                       "--rollout-num-gpus-per-engine", "4", "--global-batch-size", "6", "--rollout-batch-size", "3"))
    assert p.num_nodes == 2 and p.num_slots == 16
    assert p.actor_slots == [0, 1, 2, 3, 4, 5]
    assert p.engine_slots == [[8, 9, 10, 11], [12, 13, 14, 15]]
    assert [s.node for e in p.engines for s in e] == [1] * 8


def test_disaggregated_two_node_actor_then_engines(hf_dir):
    p = build_plan(run(hf_dir, "--actor-num-nodes", "2", "--actor-num-gpus-per-node", "2", "--num-gpus-per-node", "2",
                       "--rollout-num-gpus", "2", "--rollout-num-gpus-per-engine", "1"))
    assert p.num_nodes == 3 and where(p.actor) == [(0, 0, 0), (0, 1, 1), (1, 0, 2), (1, 1, 3)]
    assert p.engine_slots == [[4], [5]]
    assert p.by_node()[2] == {0: ["engine0"], 1: ["engine1"]}


def test_debug_modes(hf_dir):
    p = build_plan(run(hf_dir, "--debug-rollout-only", "--actor-num-gpus-per-node", "2", "--num-gpus-per-node", "2"))
    assert p.actor == [] and p.engine_slots == [[0], [1]]
    p = build_plan(run(hf_dir, "--debug-train-only", "--actor-num-gpus-per-node", "2", "--num-gpus-per-node", "2"))
    assert p.actor_slots == [0, 1] and p.engines == []


def test_colocated_critic_must_match_actor(hf_dir):
    with pytest.raises(ConfigError, match="the critic shares the actor's GPUs"):
        run(hf_dir, "--colocate", "--actor-num-gpus-per-node", "2", "--num-gpus-per-node", "2",
            "--advantage-estimator", "ppo", "--critic-num-gpus-per-node", "1")
