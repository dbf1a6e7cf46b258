"""The placement plan: which GPU slot every trainer rank and every rollout engine gets. Pure; no Ray.

Slots are numbered node-major: slot = node * gpus_per_node + local_gpu, and slot i is Ray bundle i
(slime_like/ray/placement.py sorts the bundles by (node, GPU) so that this holds).

Layout rules
* colocated (--colocate): the actor takes slots 0 .. A-1 (A = actor GPUs, whole nodes when multi-node);
  the critic, if any, shares exactly the actor's slots (rank i on the actor's slot i); the engines take
  the same slots, engine e on slots [e*g, (e+1)*g) with g = --rollout-num-gpus-per-engine.
* disaggregated: one cursor walks the slots in order. The actor comes first, then the critic on its own
  GPUs (slime's placement; we never let a disaggregated critic share the actor's GPUs), then the engines.
  A group that needs whole nodes (multi-node) starts on a fresh node; a single-node group starts on a fresh
  node when the rest of the current one is too small; an engine spans nodes only as whole nodes (slime's
  multi-node SGLang engines, GPUs per engine a multiple of GPUs per node; refused at launch here).
* --debug-rollout-only: engines only; --debug-train-only / external engines: trainers only.
* explicit (--placement, or the placement of an RLinf / ROLL --config): each component on exactly its GPU ids
  (parsed and checked in config/placement_spec.py, the counts derived in config/cluster.py); colocated when the
  engines sit on the actor's exact set; a reference placed apart is its own worker (Plan.reference).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from slime_like.config.errors import ConfigError


@dataclass(frozen=True)
class Slot:
    node: int
    local_gpu: int
    bundle: int      # index of the Ray placement-group bundle (node-major)


@dataclass
class Plan:
    num_nodes: int
    gpus_per_node: int
    colocate: bool
    engine_kind: str                                     # the resolved --rollout-engine (slime_like/registry.py)
    actor: list = field(default_factory=list)            # list[Slot], one per actor rank
    critic: list = field(default_factory=list)           # list[Slot], one per critic rank
    engines: list = field(default_factory=list)          # list[list[Slot]], one list per engine
    reference: list = field(default_factory=list)        # list[Slot]: a reference worker on GPUs of its own

    @property
    def num_slots(self) -> int:
        """Bundles to reserve: whole nodes on a multi-node run (so bundle order matches node order); on one
        node only up to the highest slot used."""
        if self.num_nodes > 1:
            return self.num_nodes * self.gpus_per_node
        used = [s.bundle for s in self.actor + self.critic + self.reference] + \
            [s.bundle for e in self.engines for s in e]
        return max(used) + 1 if used else 0

    @property
    def actor_slots(self) -> list:
        return [s.bundle for s in self.actor]

    @property
    def critic_slots(self) -> list:
        return [s.bundle for s in self.critic]

    @property
    def reference_slots(self) -> list:
        return [s.bundle for s in self.reference]

    @property
    def engine_slots(self) -> list:
        return [[s.bundle for s in e] for e in self.engines]

    def by_node(self) -> dict:
        """node -> {local_gpu: [labels]} for printing."""
        out = {n: {g: [] for g in range(self.gpus_per_node)} for n in range(self.num_nodes)}
        for r, s in enumerate(self.actor):
            out[s.node][s.local_gpu].append(f"actor{r}")
        for r, s in enumerate(self.critic):
            out[s.node][s.local_gpu].append(f"critic{r}")
        for e, slots in enumerate(self.engines):
            for s in slots:
                out[s.node][s.local_gpu].append(f"engine{e}")
        for r, s in enumerate(self.reference):
            out[s.node][s.local_gpu].append(f"ref{r}")
        return out


class _Cursor:
    def __init__(self, per_node: int):
        self.per_node, self.pos = per_node, 0

    def take(self, count: int, whole_nodes: bool) -> list:
        """`count` consecutive slots; starting a fresh node when they would otherwise straddle a boundary."""
        offset = self.pos % self.per_node
        if offset and (whole_nodes or offset + count > self.per_node):
            self.pos += self.per_node - offset
        slots = [Slot(p // self.per_node, p % self.per_node, p) for p in range(self.pos, self.pos + count)]
        self.pos += count
        return slots


def _engines_on(slots: list, per_engine: int, per_node: int) -> list:
    """Engines on consecutive slots: each within one node, or (a multiple of the node size) on whole nodes."""
    engines = [slots[i:i + per_engine] for i in range(0, len(slots), per_engine)]
    for e in engines:
        nodes = len({s.node for s in e})
        whole = per_engine % per_node == 0 and nodes == per_engine // per_node
        if len(e) != per_engine or not (nodes == 1 or whole):
            raise ConfigError(f"rollout engine on slots {[s.bundle for s in e]} would span nodes; make "
                              "--rollout-num-gpus-per-engine divide the GPUs per node")
    return engines


def _slots(ids: list, per_node: int) -> list:
    return [Slot(i // per_node, i % per_node, i) for i in ids]


def _explicit_plan(args, placement: dict) -> Plan:
    """--placement (or an RLinf / ROLL file's placement): every component on exactly the GPU ids given."""
    per_node = args.num_gpus_per_node
    train = not args.debug_rollout_only
    actor = _slots(placement.get("actor", []), per_node) if train else []
    critic = _slots(placement.get("critic", []), per_node) if train and args.use_critic else []
    engines = []
    if args.rollout_num_gpus:
        engines = _engines_on(_slots(placement.get("rollout", []), per_node), args.rollout_num_gpus_per_engine,
                             per_node)
    reference = []
    if train and args.reference_worker:
        reference = _slots(placement["reference"], per_node)
    used = actor + critic + reference + [s for e in engines for s in e]
    num_nodes = max(args.num_nodes or 0, max((s.node for s in used), default=0) + 1)
    return Plan(num_nodes=num_nodes, gpus_per_node=per_node, colocate=bool(args.colocate),
                engine_kind=args.rollout_engine, actor=actor, critic=critic, engines=engines, reference=reference)


def build_plan(args) -> Plan:
    placement = args.placement_map
    if placement:
        return _explicit_plan(args, placement)
    per_node, gpe = args.num_gpus_per_node, args.rollout_num_gpus_per_engine
    cur = _Cursor(per_node)
    actor, critic, engines = [], [], []
    train = not args.debug_rollout_only
    if train:
        actor = cur.take(args.actor_num_nodes * args.actor_num_gpus_per_node, whole_nodes=args.actor_num_nodes > 1)
        if args.use_critic:
            if args.colocate:
                critic = list(actor)
            else:
                n = args.critic_num_nodes * args.critic_num_gpus_per_node
                critic = cur.take(n, whole_nodes=args.critic_num_nodes > 1)
    if args.rollout_num_gpus:
        if args.colocate:
            engines = _engines_on(actor, gpe, per_node)
        else:
            for _ in range(args.rollout_num_gpus // gpe):
                engines.append(cur.take(gpe, whole_nodes=gpe > per_node))  # a multi-node engine: whole nodes
    used = actor + critic + [s for e in engines for s in e]
    num_nodes = max((s.node for s in used), default=0) + 1
    return Plan(num_nodes=num_nodes, gpus_per_node=per_node, colocate=bool(args.colocate),
                engine_kind=args.rollout_engine, actor=actor, critic=critic, engines=engines)


def print_dry_run(args, report, plan: Plan | None = None, file=None) -> None:
    """Resolved config per role, batch arithmetic, placement plan; warnings, notes and launch refusals from the
    ConfigReport `report`. Imports nothing heavy."""
    from slime_like.config.dry_run import dry_run_text

    print(dry_run_text(args, plan if plan is not None else build_plan(args), report), file=file)
