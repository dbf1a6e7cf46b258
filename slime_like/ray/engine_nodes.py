"""Rollout engines that span nodes (--rollout-num-gpus-per-engine > --num-gpus-per-node, SGLang's --nnodes): the plan
gives such an engine whole nodes; here each node gets an engine actor starting that node's server process
(engine_api/engine.EngineNode). Node 0's process serves the HTTP API (its URL is the engine's); the others hold
their share of the tensor-parallel ranks and answer /health_generate. The ranks meet at --dist-init-addr, a free
port on node 0 that its actor picks before any process starts.
"""
from __future__ import annotations

import ray


def by_node(placement, slots: list) -> list:
    """An engine's plan slots grouped by the Ray node their bundle sits on, in plan order."""
    groups: dict = {}
    for s in slots:
        groups.setdefault(placement.bundles[s].node_id, []).append(s)
    return list(groups.values())


def start_engine_nodes(new_actor, index: int, node_slots: list, kind: str, role: str | None = None):
    """-> (node 0's actor, the other nodes' actors, the ref of node 0's start: the engine URL, its (role,
    bootstrap port) or None). Every node's process starts at once: node 0's is healthy only once every rank
    joined. `role`: prefill / decode in a disaggregated run; a prefill engine's bootstrap port is node 0's, and
    every node's process is told the same one."""
    from slime_like.backends.engine_api.engine import engine_nodes

    actors = [new_actor(index, slots) for slots in node_slots]
    addr = ray.get(actors[0].dist_init_addr.remote())
    pd = pd_of(actors[0], role)
    nodes = engine_nodes([list(range(len(s))) for s in node_slots], addr)
    starts = [a.start.remote(kind, True, node, pd) for a, (node, _) in zip(actors, nodes)]
    return actors[0], actors[1:], starts[0] if len(starts) == 1 else _first_after_all(starts), pd


def pd_of(actor, role: str | None):
    """(role, bootstrap port) of an engine of a disaggregated run (None otherwise); a prefill engine's port is
    picked on its (node 0's) node by `actor`."""
    if role is None:
        return None
    return role, ray.get(actor.bootstrap_port.remote()) if role == "prefill" else None


def _first_after_all(starts: list):
    """A ref resolving to node 0's URL once every node's start returned (a node that failed raises there)."""
    @ray.remote(num_cpus=0)
    def first(*urls):
        return urls[0]

    return first.remote(*starts)
