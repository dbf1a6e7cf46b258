"""The colocated weight push when engine ranks sit on other nodes than the sending trainer rank: each engine rank's
entry of serialized_named_tensors must be a handle made on its own node (a shared-memory segment here, a CUDA IPC
handle on GPUs: neither opens on another machine). engine_api/node_handles.py, ray/weight_relay.py.

End to end on the two-node local Ray cluster (scripts/ray on this host, 2 GPU slots per node): two actor ranks, one
per node, and two CPU engines colocated with them, one per node. The sender (rank 0) is on node A; engine 1 on
node B gets its entry from rank 1, the relay there. The engines' weights are overwritten with noise first, so the
push must carry every tensor; afterwards both equal the trainer's (the checkpoint) bit for bit (/weights_checker).
The segment each entry names was made by a trainer process on the engine's node (its creator pid, in the name).
The same with a Megatron actor at PP 2 (stage 0 on node A, stage 1 on node B: two senders, each relaying to the
other node). An engine over both nodes (the CPU engine: its node 0 process is the one rank) is pushed the same way.
"""
import json
import os
import subprocess
import sys

import pytest
from test_ray_scripts import run_script, two_node_ray  # noqa: F401  (fixture)

from slime_like.backends.engine_api import node_handles

DRIVER = r"""
import json, os, sys
import ray
from slime_like.args import make_args
from slime_like.backends.engine_api.client import post
from slime_like.backends.engine_api.node_handles import segment_owner
from slime_like.plan import build_plan
from slime_like.ray.placement import create_placement
from slime_like.ray.rollout_manager import EngineGroup
from slime_like.ray.trainer_group import TrainerGroup

ray.init(address=os.environ["RAY_ADDRESS"])
ckpt, save, prompts, gpe, *trainer = sys.argv[1:]
args = make_args(*trainer, "--hf-checkpoint", ckpt, "--prompt-data", prompts, "--input-key", "prompt", "--rollout-batch-size",
                 "4", "--n-samples-per-prompt", "1", "--num-rollout", "1", "--global-batch-size", "4",
                 "--num-gpus-per-node", "2", "--actor-num-nodes", "2", "--actor-num-gpus-per-node", "2",
                 "--colocate", "--rollout-num-gpus-per-engine", gpe, "--save", save,
                 "--update-weight-buffer-size", str(1 << 17), validate=True)
args.engine_api_key = "two-node-secret"
plan = build_plan(args)
placement = create_placement(plan.num_slots)
actor = TrainerGroup(args, "actor", placement, plan.actor_slots, 0.2)
engines = EngineGroup.start(args, placement, plan.engine_slots, 0.2, "cpu")
for url in engines.urls:   # noise in every weight: only a complete push brings them back
    for action in ("snapshot", "reset_tensors"):
        post(url, "/weights_checker", {"action": action}, 60, args.engine_api_key)
actor.connect_engines(engines.urls, colocate=True, engine_node_groups=engines.node_groups(engines.urls))
sent = ray.get(actor.start_update_weights(1))
compare = [post(url, "/weights_checker", {"action": "compare"}, 60, args.engine_api_key) for url in engines.urls]
entries = [e for e in ray.get([a.last_push_entries.remote() for a in actor.actors]) if e]   # one list per sender
where = [ray.get(a.where.remote())[0] for a in engines.actors]
actor.kill()
engines.stop()
print("RESULT " + json.dumps({"sent": sent, "compare": compare, "owners": [[[segment_owner(b) for b in e] for e in sender] for sender in entries],
                              "ranks": [(i["pid"], i["node_id"]) for i in actor.info], "engine_nodes": where,
                              "node_groups": engines.nodes}))
"""


def _push(env, tiny_ckpt, tmp_path, gpe, *trainer):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "1+1=", "label": "2"}) + "\n")
    save = tmp_path / f"save{len(list(tmp_path.iterdir()))}"
    out = subprocess.run([sys.executable, "-c", DRIVER, tiny_ckpt, str(save), str(prompts), gpe, *trainer],
                         env=dict(os.environ, **env, RAY_AUTH_MODE="token"), capture_output=True, text=True,
                         timeout=500)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stdout[-3000:] + out.stderr[-5000:]
    return json.loads(lines[-1][len("RESULT "):])


FSDP = ("--train-backend", "fsdp")
# Megatron PP 2 over the two nodes (stage 0 on node A, stage 1 on node B): two senders, each relaying to the other node
MEGATRON_PP2 = ("--train-backend", "megatron", "--pipeline-model-parallel-size", "2")


@pytest.mark.slow
def test_each_engine_gets_handles_made_on_its_node(two_node_ray, tiny_ckpt, tmp_path):  # noqa: F811
    env = {k: v for k, v in two_node_ray.items() if k != "logs"}
    r = run_script("wait-for-nodes.sh", "2", "4", "150", env=env, timeout=200)
    assert r.returncode == 0, r.stderr
    # two one-node engines on different nodes (FSDP; Megatron PP 2); one engine over both nodes
    for gpe, trainer in (("2", FSDP), ("2", MEGATRON_PP2), ("4", FSDP)):
        result = _push(env, tiny_ckpt, tmp_path, gpe, *trainer)
        node_of_pid = dict(result["ranks"])
        assert len(set(node_of_pid.values())) == 2 and result["sent"][0] > 0
        assert all(c["success"] for c in result["compare"]), result["compare"]   # bit for bit the trainer's
        senders = result["owners"]
        assert len(senders) == (2 if trainer == MEGATRON_PP2 else 1), result
        for owners_per_engine in senders:   # every sender: each engine's entry made on that engine's node
            for engine_node, owners in zip(result["engine_nodes"], owners_per_engine):
                assert len(owners) == 1 and node_of_pid[owners[0]] == engine_node, (result, engine_node, owners)
        if gpe == "2":   # the engine on the other node than a sender got its entry from a relay there
            assert result["engine_nodes"][0] != result["engine_nodes"][1]
            assert all(len(set(owners_per_engine[0] + owners_per_engine[1])) == 2 for owners_per_engine in senders)
        else:
            assert len(result["node_groups"][0]) == 2   # the engine spans both nodes


def test_entries_follow_each_engine_ranks_node():
    """SGLang's layout of an engine over n nodes (node k holds TP ranks k*t/n ..): every entry of its list comes
    from its rank's node, each relay blob used once, the sender's own node served by local handles."""
    assert node_handles.rank_nodes(["A", "B"], 4) == ["A", "A", "B", "B"]
    assert node_handles.rank_nodes(["A", "B"], 1) == ["A"]   # the CPU engine: one rank, its node 0 process
    assert node_handles.rank_nodes(["B"], 2) == ["B", "B"]
    engines = [["A", "A", "B", "B"], ["B", "B"], [None]]   # None: an engine started elsewhere
    assert node_handles.relay_counts(engines, "A") == {"B": 4}
    local = iter(f"a{i}" for i in range(10))
    got = node_handles.order_entries(engines, "A", lambda: next(local), {"B": ["b0", "b1", "b2", "b3"]})
    assert got == [["a0", "a1", "b0", "b1"], ["b2", "b3"], ["a2"]]


def test_a_relay_serializes_handles_to_its_own_segment():
    """The relay's copy: a shared-memory segment of this process, holding the sender's bytes; one entry per rank."""
    import numpy as np
    import torch

    from slime_like.backends.engine_api import tensor_serializer
    from slime_like.backends.engine_api.weight_sync import TensorWeightSender

    bucket = [("w", torch.arange(12, dtype=torch.float32).reshape(3, 4)), ("b", torch.ones(5, dtype=torch.bfloat16))]
    flat = TensorWeightSender(["http://x"]).flatten(bucket)
    relay = node_handles.BucketRelay()
    blobs = relay.handles(flat["flattened_tensor"].numpy().copy(), flat["metadata"], 2)
    assert [node_handles.segment_owner(b) for b in blobs] == [os.getpid()] * 2
    for blob in blobs:
        got = tensor_serializer.deserialize(blob, 1 << 20)
        assert got["flattened_tensor"].data_ptr() != flat["flattened_tensor"].data_ptr()
        m = got["metadata"][0]
        assert torch.equal(got["flattened_tensor"][m.start_idx:m.end_idx].view(torch.float32).reshape(3, 4),
                           bucket[0][1])
    relay.close()
    assert np.array_equal(flat["flattened_tensor"].numpy()[:48], bucket[0][1].numpy().view(np.uint8).reshape(-1))
