"""Turn the placement plan into Ray reality: one placement group of GPU bundles, in a known order.

Ray numbers a placement group's bundles in creation order, but PACK may put bundle 5 on node A and bundle 6
on node B in any order. Trainer ranks must be laid out node by node (rank 0..7 on node 0, ...) and an engine's
GPUs must sit on one node, so we ask every bundle where it landed and sort bundles by (node IP, node id,
GPU id). Plan slot i then maps to the i-th sorted bundle.

On a CPU-only machine the GPU slots are declared Ray resources (`ray.init(num_gpus=N)`), so exactly this
code runs in tests and in the demo.
"""
from __future__ import annotations

from dataclasses import dataclass

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy



# OpenMP threads that wait for work sleep instead of spinning. Trainer and engine take turns on the same
# cores; with libgomp's default active wait, an idle team burns its slices spinning (measured: a tiny
# model's train step 5.5 s of CPU with 2 spinning threads vs 0.48 s passive; docs/benchmarks.md). Must be
# in the environment before the process starts OpenMP, hence an env var for every actor and engine.
QUIET_OPENMP = {"OMP_WAIT_POLICY": "PASSIVE"}


@ray.remote(num_cpus=0)
class _WhereAmI:
    """Occupies a sliver of one bundle just long enough to report its node and GPU slot."""

    def where(self):
        gpu_ids = ray.get_gpu_ids()
        ctx = ray.get_runtime_context()
        return ray.util.get_node_ip_address(), ctx.get_node_id(), int(gpu_ids[0]) if gpu_ids else -1


@dataclass
class BundleInfo:
    pg_index: int      # the bundle's index inside the Ray placement group
    node_ip: str
    node_id: str       # tells apart nodes that share an IP (several raylets on one host, as in tests)
    gpu_id: int        # the GPU slot Ray assigned on that node


@dataclass
class Placement:
    """A ready placement group plus the node-major order of its bundles."""

    pg: object
    bundles: list  # list[BundleInfo], sorted node-major: plan slot i -> bundles[i]

    def strategy(self, slot: int) -> PlacementGroupSchedulingStrategy:
        """Scheduling strategy that pins an actor to plan slot `slot`."""
        return PlacementGroupSchedulingStrategy(placement_group=self.pg,
                                                placement_group_bundle_index=self.bundles[slot].pg_index)

    def check_same_node(self, slot_groups: list, what: str = "engine"):
        """An engine's GPUs must share one node (tensor parallelism over the network is not supported)."""
        for i, slots in enumerate(slot_groups):
            nodes = {self.bundles[s].node_id for s in slots}
            if len(nodes) > 1:
                raise RuntimeError(
                    f"{what} {i} would span {len(nodes)} nodes (plan slots {slots}); make "
                    "--rollout-num-gpus-per-engine divide the GPUs each node contributes")

    def remove(self):
        remove_placement_group(self.pg)


def create_placement(num_slots: int, timeout_s: float = 120.0) -> Placement:
    """Reserve `num_slots` single-GPU bundles (PACK) and sort them node-major.

    Raises a clear error when the cluster cannot provide them within `timeout_s` (e.g. the recipe asks for
    16 GPUs on an 8-GPU cluster), instead of hanging forever as a pending placement group would.
    """
    pg = placement_group([{"GPU": 1, "CPU": 0}] * num_slots, strategy="PACK")
    try:
        ray.get(pg.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(pg)
        have = ray.cluster_resources().get("GPU", 0)
        raise RuntimeError(
            f"Ray could not reserve {num_slots} GPU slots within {timeout_s:.0f}s (the cluster has {have:g} GPUs). "
            "Start more nodes, lower --actor-num-gpus-per-node / --rollout-num-gpus, or use --colocate.") from None
    probes = [_WhereAmI.options(num_gpus=0.01, scheduling_strategy=PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=i)).remote() for i in range(num_slots)]
    where = ray.get([p.where.remote() for p in probes])
    for p in probes:
        ray.kill(p)
    bundles = [BundleInfo(i, ip, node, gpu) for i, (ip, node, gpu) in enumerate(where)]
    bundles.sort(key=lambda b: (_ip_key(b.node_ip), b.node_id, b.gpu_id))
    return Placement(pg, bundles)


def _ip_key(ip: str):
    """Sort IPv4 addresses numerically (10.0.0.9 before 10.0.0.10); anything else as text."""
    parts = ip.split(".")
    return tuple(int(p) for p in parts) if len(parts) == 4 and all(p.isdigit() for p in parts) else (ip,)
