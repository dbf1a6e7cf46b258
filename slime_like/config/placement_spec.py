"""`--placement`: explicit GPU sets per component, in RLinf's `component_placement` syntax.

    --placement actor,rollout:0-7                       # colocated on GPUs 0-7 (same as --colocate)
    --placement actor:0-3 rollout:4-7                   # disaggregated
    --placement actor:0-7 critic:8-15 rollout:16-23     # three disjoint groups across nodes
    --placement actor,critic,rollout:all --num-nodes 2  # everything shares both nodes

Components: actor, critic, reference, rollout. GPU ids are global and node-major (id = node *
--num-gpus-per-node + local GPU), so `8-15` is the second node of an 8-GPU cluster. Devices are written
`0-3`, `0,2,4-7`, `list(range(0,8))` or `all` (every GPU of --num-nodes x --num-gpus-per-node).

Rules (checked before Ray starts):
* ids inside the cluster (--num-nodes, when given; otherwise the nodes the ids reach);
* sharing only where memory can be handed over: the engines may share the actor's GPUs only as the whole
  set (the colocated offload choreography: trainer and engines take turns), the critic sits either on the
  actor's exact set or apart from everything, the reference either on the actor's set (computed inside the
  actor ranks) or apart (its own worker);
* the counts divisible by each component's parallel sizes (cluster.py checks TP x PP x CP per trainer
  and --rollout-num-gpus-per-engine per engine, and an engine never spans nodes).
This module only parses and checks; cluster.py derives --actor-num-*, --rollout-num-gpus, --colocate
from it and plan.py places the ranks on exactly these ids.
"""
from __future__ import annotations

import re

from slime_like.config.errors import ConfigError, did_you_mean

COMPONENTS = ("actor", "critic", "reference", "rollout")


def parse_placement(specs: list, gpus_per_node: int, num_nodes: int | None) -> dict:
    """['actor,rollout:0-3', 'critic:4-5'] -> {'actor': [0..3], 'rollout': [0..3], 'critic': [4, 5]}."""
    total = num_nodes * gpus_per_node if num_nodes else None
    out: dict = {}
    for spec in specs:
        where = f"--placement {spec!r}"
        if ":" not in spec:
            raise ConfigError(f"{where}: write COMPONENTS:DEVICES, e.g. actor,rollout:0-3 or critic:4-5")
        names, devices = spec.split(":", 1)
        ids = parse_devices(devices, where, total)
        for name in (n.strip() for n in names.split(",")):
            if name not in COMPONENTS:
                raise ConfigError(f"{where}: unknown component {name!r}{did_you_mean(name, COMPONENTS)}; "
                                  f"components are {', '.join(COMPONENTS)}")
            if name in out:
                raise ConfigError(f"{where}: {name} is placed twice; give each component one device set")
            out[name] = sorted(ids)
    check_placement(out, gpus_per_node, num_nodes)
    return out


def check_placement(placement: dict, gpus_per_node: int, num_nodes: int | None, label: str = "--placement") -> None:
    if "actor" not in placement and "rollout" not in placement:
        raise ConfigError(f"{label}: place at least the actor and the rollout engines")
    if num_nodes:
        total = num_nodes * gpus_per_node
        for name, ids in placement.items():
            bad = [i for i in ids if i >= total]
            if bad:
                raise ConfigError(f"{label}: {name} on GPU {bad[0]}, outside the cluster of {num_nodes} node(s) x "
                                  f"{gpus_per_node} GPUs (ids 0-{total - 1})")
    actor, rollout = set(placement.get("actor", ())), set(placement.get("rollout", ()))
    _shared_whole_or_apart(label, "rollout", rollout, actor)
    for name in ("critic", "reference"):
        ids = set(placement.get(name, ()))
        if not ids or ids == actor:
            continue
        for other, other_ids in ((n, set(v)) for n, v in placement.items() if n != name):
            if ids & other_ids:
                raise ConfigError(f"{label}: {name} on GPUs {devices_text(sorted(ids))} overlaps {other} on "
                                  f"{devices_text(sorted(other_ids))}: a {name} shares GPUs only as the actor's "
                                  "exact set (memory is handed over between the actor's own models), else it "
                                  "needs GPUs of its own")
    for name, ids in placement.items():
        nodes = {}
        for i in ids:
            nodes.setdefault(i // gpus_per_node, []).append(i)
        sizes = {len(v) for v in nodes.values()}
        if name != "rollout" and len(sizes) > 1:
            raise ConfigError(f"{label}: {name} has a different GPU count on each node it uses "
                              f"({ {n: len(v) for n, v in nodes.items()} }); give it the same count per node")


def _shared_whole_or_apart(label: str, name: str, ids: set, actor: set) -> None:
    if ids and actor and ids & actor and ids != actor:
        raise ConfigError(f"{label}: {name} on GPUs {devices_text(sorted(ids))} overlaps the actor on "
                          f"{devices_text(sorted(actor))} only in part: engines and trainer can take turns only "
                          "on the same set of GPUs (colocated) or use disjoint ones (disaggregated)")


def per_node_counts(ids: list, gpus_per_node: int) -> tuple[int, int]:
    """(number of nodes used, GPUs per node used) of a trainer's device set (equal per node: checked above)."""
    nodes = {i // gpus_per_node for i in ids}
    return len(nodes), len(ids) // len(nodes)


def placement_text(placement: dict) -> list:
    """The `--placement` tokens that reproduce `placement` (components sharing a set are written together)."""
    by_set: dict = {}
    for name in COMPONENTS:
        if name in placement:
            by_set.setdefault(tuple(placement[name]), []).append(name)
    return [f"{','.join(names)}:{devices_text(list(ids))}" for ids, names in by_set.items()]


# ---- device lists: `list(range(0,16))`, `[0, 1, 2]`, `0-3`, `0,2,4-7`, `all` -----------------------------

_RANGE_CALL = re.compile(r"^list\(\s*range\(\s*(-?\d+)\s*(?:,\s*(-?\d+)\s*)?(?:,\s*(-?\d+)\s*)?\)\s*\)$")


def parse_devices(value, where: str, total: int | None = None) -> list:
    """A device list without eval: a YAML list of ints, `list(range(a[,b[,step]]))`, or `0-3,6`; `all` needs total."""
    if isinstance(value, list):
        out = []
        for v in value:
            if isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError(f"{where}: device ids must be integers, got {v!r}")
            out.append(v)
    elif isinstance(value, int) and not isinstance(value, bool):
        out = [value]
    elif isinstance(value, str):
        out = _parse_device_text(value.strip(), where, total)
    else:
        raise ConfigError(f"{where}: expected a device list such as list(range(0,8)), [0, 1] or 0-3, got {value!r}")
    if not out:
        raise ConfigError(f"{where}: {value!r} names no device")
    if len(set(out)) != len(out):
        raise ConfigError(f"{where}: {value!r} names a device twice")
    if min(out) < 0:
        raise ConfigError(f"{where}: {value!r}: device ids must be >= 0")
    return out


def _parse_device_text(text: str, where: str, total):
    m = _RANGE_CALL.match(text)
    if m:
        a, b, step = (int(x) if x is not None else None for x in m.groups())
        if step == 0:
            raise ConfigError(f"{where}: {text!r}: range step must not be 0")
        return list(range(a, b, step or 1)) if b is not None else list(range(a))
    if text == "all":
        if total is None:
            raise ConfigError(f"{where}: 'all' needs the cluster size (cluster.num_nodes x num_gpus_per_node)")
        return list(range(total))
    out = []
    for part in text.strip("[]").split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)\s*-\s*(\d+)", part) or re.fullmatch(r"(\d+)", part)
        if not m:
            raise ConfigError(f"{where}: cannot read {text!r} as devices; write list(range(0,8)), [0, 1, 2] or 0-3")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.lastindex == 2 else lo
        if hi < lo:
            raise ConfigError(f"{where}: {part!r}: the range is empty (end before start)")
        out += list(range(lo, hi + 1))
    return out


def devices_text(devices: list) -> str:
    """Compact text for a device list: 0-3,6."""
    parts, start = [], None
    for i, d in enumerate(devices):
        if start is None:
            start = d
        if i + 1 == len(devices) or devices[i + 1] != d + 1:
            parts.append(f"{start}-{d}" if d != start else f"{d}")
            start = None
    return ",".join(parts)
