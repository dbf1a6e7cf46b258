"""The Ray half of the colocated push across nodes (engine_api/node_handles.py): which trainer rank relays a sender's
buckets to the engine ranks of each other node, and the sender's handle on those relays.

A relay is a trainer rank on the engine ranks' node; its `relay_bucket` call runs in a concurrency group of its own
(TrainerActor), so it answers while the rank itself is still inside `update_weights` walking its own share of the
gathers. The bucket's bytes travel once per node through Ray's object store (one put per bucket, read by every
relay), and each relay answers with the serialized handles to its copy.
"""
from __future__ import annotations

import ray


def choose_relays(info: list, actors: list, sender: int, engine_rank_nodes: list) -> dict:
    """{node id: actor of the trainer rank relaying sender `sender`'s buckets there}, for every node other than the
    sender's with engine ranks on it. Ranks of a node take turns by pipeline stage, so the stages' senders spread
    their copies over the node's ranks (colocated: every engine node has actor ranks)."""
    own = info[sender]["node_id"]
    needed = sorted({n for nodes in engine_rank_nodes for n in nodes if n is not None and n != own})
    relays = {}
    for node in needed:
        here = [r for r, i in enumerate(info) if i["node_id"] == node]
        if not here:
            raise RuntimeError(f"colocated weight push: engine ranks on Ray node {node} but no actor rank there to "
                               "hand them a handle made on their node; colocated engines must sit on the actor's GPUs")
        relays[node] = actors[here[info[sender].get("pp_rank", 0) % len(here)]]
    return relays


class RayRelays:
    """The sender's side: `start(flat, counts)` puts the bucket's bytes into the object store once and asks every
    relay for its handles; the returned wait() gives {node id: [serialized entries]}."""

    def __init__(self, sender_rank: int, relays: dict):
        self.sender_rank, self.relays = sender_rank, dict(relays)

    def start(self, flat: dict, counts: dict):
        data = ray.put(flat["flattened_tensor"].detach().cpu().numpy())
        refs = {node: self.relays[node].relay_bucket.remote(self.sender_rank, data, flat["metadata"], count)
                for node, count in counts.items()}

        def wait() -> dict:
            return dict(zip(refs, ray.get(list(refs.values()))))
        return wait

    def close(self) -> None:
        """The relays free their copies (their buffers) of this sender's buckets."""
        try:
            ray.get([a.drop_relay.remote(self.sender_rank) for a in self.relays.values()], timeout=30)
        except Exception as e:  # noqa: BLE001 - a dead relay's buffers went with it (TrainerGroup.kill sweeps /dev/shm)
            print(f"weight sync: releasing the relays' buffers: {e}")
