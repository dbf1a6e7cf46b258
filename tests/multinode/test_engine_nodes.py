"""An engine spanning two Ray nodes (the test's two-node cluster from scripts/ray on this host, 2 GPU slots each):
EngineGroup.start gives it one engine actor per node, node 0's process serves /generate at the engine's URL, the
other node's process answers /health_generate, both got node 0's --dist-init-addr, and stop() ends both. The CPU
engine stands in for SGLang (its node ranks >= 1 serve the health routes only, as SGLang's do); the commands SGLang
itself gets are checked by its own ServerArgs in tests/sglang_peer."""
import json
import os
import subprocess
import sys

import pytest
from test_ray_scripts import run_script, two_node_ray  # noqa: F401  (fixture)

DRIVER = r"""
import json, os, sys, urllib.request
import ray
from slime_like.args import make_args
from slime_like.ray.placement import create_placement
from slime_like.ray.rollout_manager import EngineGroup

ray.init(address=os.environ["RAY_ADDRESS"])  # this test's cluster, not another one on the host
args = make_args("--hf-checkpoint", sys.argv[1], "--num-gpus-per-node", "2", "--rollout-num-gpus", "4",
                 "--rollout-num-gpus-per-engine", "4", "--save", sys.argv[2], engine_api_key="two-node-secret")
placement = create_placement(4)
group = EngineGroup.start(args, placement, [[0, 1, 2, 3]], 0.01, "cpu")
body = json.dumps({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4, "temperature": 0}}).encode()
req = urllib.request.Request(group.urls[0] + "/generate", body, {"Content-Type": "application/json",
                                                                  "Authorization": "Bearer two-node-secret"})
answer = json.loads(urllib.request.urlopen(req, timeout=120).read())
where = [ray.get(a.where.remote()) for a in group.actors + group.followers]
auth = {"Authorization": "Bearer two-node-secret"}
health = [urllib.request.urlopen(urllib.request.Request(url + "/health_generate", headers=auth), timeout=30).status
          for _, url in where]
group.stop()
print("RESULT " + json.dumps({"url": group.urls[0], "where": where, "health": health,
                              "tokens": len(answer["output_ids"]),
                              "nodes": sorted({b.node_id for b in placement.bundles})}))
"""


@pytest.mark.slow
def test_one_engine_over_two_ray_nodes(two_node_ray, tiny_ckpt, tmp_path):  # noqa: F811
    env = {k: v for k, v in two_node_ray.items() if k != "logs"}
    r = run_script("wait-for-nodes.sh", "2", "4", "150", env=env, timeout=200)
    assert r.returncode == 0, r.stderr
    out = subprocess.run([sys.executable, "-c", DRIVER, tiny_ckpt, str(tmp_path / "save")],
                         env=dict(os.environ, **env, RAY_AUTH_MODE="token"),  # the scripts' clusters authenticate
                         capture_output=True, text=True, timeout=400)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stdout[-2000:] + out.stderr[-4000:]
    result = json.loads(lines[-1][len("RESULT "):])
    (lead_node, lead_url), (other_node, other_url) = result["where"]
    assert len(result["nodes"]) == 2 and {lead_node, other_node} == set(result["nodes"])
    assert lead_url == result["url"] and other_url != lead_url
    assert result["health"] == [200, 200] and result["tokens"] == 4
    logs = sorted(p.name for p in (tmp_path / "save" / "engine_logs").iterdir())
    assert [n.split("_")[2] for n in logs] == ["node0", "node1"], logs
    node1 = next(p for p in (tmp_path / "save" / "engine_logs").iterdir() if "_node1_" in p.name).read_text()
    assert "--node-rank 1" in node1 and "--nnodes 2" in node1 and "--dist-init-addr" in node1
