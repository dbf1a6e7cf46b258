"""The rollout engine interface, and the registry that maps `--rollout-engine NAME` to an implementation.

Every engine of ours speaks one wire format (SGLang's native HTTP API, `engine_api/protocol.py`), so an
engine is two things:

* how to start it: `launch_command(args, host=, port=, gpu_ids=)` -- the argv of a server process that the
  launcher (`engine_api/launcher.py`) starts, health-checks and stops; and
* how to talk to it once it runs: `client(url)` -- an `EngineClient` (`engine_api/client.py`) whose methods
  are the runtime half of the interface: `health`, `generate`, `abort`, `flush_cache`, `release_memory`,
  `resume_memory`, and the weight-update routes listed in `weight_update_routes`.

A new engine subclasses `Engine`, lists the weight-update routes it serves, and registers itself under its
flag value with `register_engine` (or an entry of slime_like/registry.py's ROLLOUT_ENGINES, imported lazily so
`--dry-run` stays free of torch and of every engine's package).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from slime_like.registry import ROLLOUT_ENGINES

# SGLang's weight-update routes (what TrainerGroup's weight senders post to)
FROM_TENSOR = "/update_weights_from_tensor"
FROM_DISTRIBUTED = "/update_weights_from_distributed"
FROM_DISK = "/update_weights_from_disk"


@dataclass(frozen=True)
class EngineNode:
    """One node's share of an engine that spans nodes (--rollout-num-gpus-per-engine > --num-gpus-per-node): SGLang's
    --nnodes / --node-rank / --dist-init-addr (host:port of node 0's process, where the ranks meet)."""
    nnodes: int
    node_rank: int
    dist_init_addr: str


def engine_nodes(gpu_ids_by_node: list, dist_init_addr: str) -> list:
    """(EngineNode, that node's GPU ids) for each node of one engine, node 0 first (the one serving HTTP)."""
    sizes = {len(g) for g in gpu_ids_by_node}
    if len(sizes) != 1:
        raise ValueError(f"an engine spanning nodes takes the same number of GPUs on each; got {gpu_ids_by_node}")
    n = len(gpu_ids_by_node)
    return [(EngineNode(n, r, dist_init_addr), list(g)) for r, g in enumerate(gpu_ids_by_node)]


def pd_role(args, engine_index: int) -> str | None:
    """'prefill' or 'decode' for engine `engine_index` of a prefill / decode disaggregated run (the first
    --prefill-num-servers engines prefill; config/disaggregation.py), None when every engine does both."""
    n = args.prefill_num_servers
    if not n:
        return None
    return "prefill" if engine_index < n else "decode"


class Engine(ABC):
    """One kind of rollout engine server. Stateless: instances are cheap and carry no process."""

    name: ClassVar[str]
    # seconds a fresh server may take to answer /health_generate (loading weights, compiling kernels)
    health_timeout_s: ClassVar[float] = 300.0
    weight_update_routes: ClassVar[frozenset] = frozenset({FROM_TENSOR, FROM_DISTRIBUTED, FROM_DISK})

    @property
    def uses_router(self) -> bool:
        """Several engines of this kind sit behind a started sglang-router (as slime runs SGLang); otherwise the
        rollout client spreads requests over the engine URLs itself (rollout/engines.py). The registry's
        capability, so the configuration layer's router checks and the driver agree."""
        return ROLLOUT_ENGINES.has(self.name, "uses_router")

    @abstractmethod
    def launch_command(self, args, *, host: str, port: int, gpu_ids: list[int]) -> list[str]:
        """argv of one server process serving `args.hf_checkpoint` on (host, port) and the given GPUs."""

    def node_launch_command(self, args, *, host: str, port: int, gpu_ids: list[int], node: EngineNode) -> list[str]:
        """argv of one node's server process of an engine that spans nodes (registry capability spans_nodes)."""
        raise NotImplementedError(f"--rollout-engine {self.name} runs each engine on one node")

    def weight_sync_ranks(self, args) -> int:
        """Ranks of one engine that join a weight-update group and receive every pushed tensor (SGLang: each of its
        --rollout-num-gpus-per-engine GPUs, on every node it spans)."""
        return 1

    def api_key_args(self, api_key: str) -> list[str]:
        """argv that makes the server require `Authorization: Bearer <api_key>` on every route (SGLang's and
        vLLM's flag; an engine that reads the key from SLIME_LIKE_ENGINE_API_KEY returns [])."""
        return ["--api-key", api_key]

    def disaggregation_args(self, role: str, bootstrap_port: int | None) -> list[str]:
        """argv making the server prefill-only or decode-only (registry capability pd_disaggregation; the config
        layer refuses --prefill-num-servers for an engine without it)."""
        raise NotImplementedError(f"--rollout-engine {self.name} has no prefill / decode disaggregation")

    def client(self, url: str, session=None, timeout: float | None = 3600.0, api_key: str | None = None):
        """The HTTP client of a running server (pass an aiohttp session to pool its connections)."""
        from slime_like.backends.engine_api.client import EngineClient

        return EngineClient(url, session=session, timeout=timeout, api_key=api_key)

    def check_weight_route(self, route: str) -> None:
        if route not in self.weight_update_routes:
            raise ValueError(f"--rollout-engine {self.name} does not serve {route}; it serves "
                             f"{sorted(self.weight_update_routes)}")


# --rollout-engine value -> "module:Class", imported only when that engine is asked for: slime_like/registry.py's
# ROLLOUT_ENGINES, the table the parser's choices and the configuration layer's capability questions come from.


def register_engine(name: str, target: str | type, **entry) -> None:
    """Add an engine under its `--rollout-engine` value (a class or a lazy "module:Class" path); `entry`:
    capabilities, flag_group, add_flags, validator (slime_like/registry.py). It is a valid choice from then on."""
    ROLLOUT_ENGINES.register(name, target, **entry)


def engine_names() -> list[str]:
    return sorted(ROLLOUT_ENGINES.names())


def get_engine(name: str) -> Engine:
    """The engine registered under `name` (a resolved --rollout-engine value: not "auto")."""
    if name not in ROLLOUT_ENGINES:
        raise ValueError(f"unknown rollout engine {name!r}; registered: {engine_names()}")
    return ROLLOUT_ENGINES.load(name)()
