"""A one-node run listens on loopback only: every listening socket of train.py and its descendants (Ray's
servers, the trainer ranks' torch.distributed store and gloo groups, the engine and its weight-sync group) is
on 127.0.0.1, and none takes one of Ray's fixed default ports.

The run is disaggregated (two trainer ranks, one engine): the trainer's default group, megatron-core's gloo
subgroups and the weight-sync group to the engine all start. GLOO_SOCKET_IFNAME names the host's routable
interface, standing in for the usual host whose name resolves to its routable address (gloo's default device
listens there; on this test machine the hostname resolves to 127.0.0.1, which would hide it): a one-node run
must pin gloo to loopback whatever the environment says.
"""
import os

import pytest

from conftest import loop_argv
from listeners import RAY_FIXED_PORTS, is_loopback, listening, routable_interface, train

pytestmark = pytest.mark.slow


def test_one_node_run_listens_on_loopback_only(tiny_ckpt, toy_prompts, tmp_path):
    env = dict(os.environ)
    iface = routable_interface()
    if iface:
        env["GLOO_SOCKET_IFNAME"] = iface
    argv = loop_argv(tiny_ckpt, toy_prompts[0], tmp_path, "--actor-num-gpus-per-node", "2", "--rollout-num-gpus",
                     "1", "--num-rollout", "1", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
                     "--micro-batch-size", "8")
    sockets: dict = {}
    rc, out = train(env, argv, timeout=300, watch=lambda pid: listening(pid, sockets))
    assert rc == 0, out[-3000:]
    names = [name for name, _ in sockets.values()]
    # the watch saw the servers it is about: Ray's, both trainer ranks' (store + gloo), the engine's
    assert {"gcs_server", "raylet"} <= set(names), sockets
    assert len({pid for (pid, _), (name, _) in sockets.items() if name.startswith("ray::TrainerAct")}) == 2, sockets
    wide = {k: v for k, v in sockets.items() if not is_loopback(v[1])}
    assert wide == {}, f"listening beyond loopback (pid, port): (process, address): {wide}"
    fixed = {port: RAY_FIXED_PORTS[port] for (_, port) in sockets if port in RAY_FIXED_PORTS}
    assert fixed == {}, f"the run took Ray's fixed default ports: {fixed}"
