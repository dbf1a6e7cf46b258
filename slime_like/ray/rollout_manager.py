"""The rollout side under Ray: one actor per inference engine, and the manager actor that owns them.

An engine actor sits on its plan slot (a fraction of the trainer's GPU when colocated) and runs the engine
server as a child process: SGLang on GPUs, the embedded CPU engine otherwise. The manager owns the data
source, generation, rewards and eval (through `RolloutController`), talks to the engines over HTTP only, and
hands the trainer one shard of the finished rollout per data-parallel rank.
"""
from __future__ import annotations

import sys

import ray

from slime_like.ray.cluster import cluster_spans_nodes
from slime_like.ray.placement import QUIET_OPENMP, Placement
from slime_like.utils.net import free_port


@ray.remote(num_cpus=0)
class EngineActor:
    """Launches and supervises one engine server process on this actor's node."""

    def __init__(self, args, engine_index: int, gpu_ids: list):
        self.args, self.engine_index, self.gpu_ids = args, engine_index, gpu_ids
        self.proc = None
        self.started_with = None   # the last start()'s arguments, for restart()

    def start(self, kind: str, multi_node: bool, node=None, pd: tuple | None = None) -> str:
        """`node`: this node's share of an engine spanning nodes (engine_api/engine.EngineNode), else None; `pd`:
        (role, bootstrap port) of a prefill / decode disaggregated run, else None."""
        from slime_like.backends.engine_api.launcher import start_engine

        self.started_with = (kind, multi_node, node, pd)
        # One node: nothing off this host needs the engine, so it listens on loopback only. Across nodes it must
        # listen on the node's address; the run's secret (--engine-api-key) then guards every route.
        host = ray.util.get_node_ip_address() if multi_node else "127.0.0.1"
        self.proc = start_engine(self.args, kind=kind, engine_index=self.engine_index, gpu_ids=self.gpu_ids,
                                 host=host, port=free_port(host),
                                 api_key=self.args.engine_api_key, node=node, pd=pd)
        return self.proc.url

    def where(self) -> tuple:
        """(Ray node id, URL of the process this actor started): the multi-node launch's check."""
        return ray.get_runtime_context().get_node_id(), self.proc.url if self.proc else None

    def dist_init_addr(self) -> str:
        """host:port on this node where the ranks of an engine spanning nodes meet (its node 0)."""
        host = ray.util.get_node_ip_address()
        return f"{host}:{free_port(host)}"

    def bootstrap_port(self) -> int:
        """A free port on this node for a prefill engine's bootstrap server (--disaggregation-bootstrap-port)."""
        return free_port(ray.util.get_node_ip_address())

    def restart(self) -> str:
        """--use-fault-tolerance: kill the engine process (dead, or hung: SIGKILL, it may not answer SIGTERM) and
        start a fresh one on a new port with the launch weights; returns its URL (the caller pushes the current
        weights to it before any rollout request goes there)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc = None
        return self.start(*self.started_with)

    def kill(self):
        """SIGKILL of a hung engine (found during a weight push): the push's requests to it fail at once."""
        if self.proc is not None:
            self.proc.kill()

    def stop(self):
        if self.proc is not None:
            self.proc.stop()
            self.proc = None


@ray.remote(num_cpus=0)
class RolloutManager:
    def __init__(self, args, engine_urls: list, router_url: str | None = None):
        """engine_urls: every engine (health checks, memory release / resume); router_url: where /generate goes
        when a router is in front of them (which is told when one of them dies or is restarted)."""
        from slime_like.rollout.controller import RolloutController

        self.args = args
        self.engine_urls = engine_urls
        self.controller = RolloutController(args, engine_urls, router_url=router_url)

    def generate(self, rollout_id: int, dp_size: int):
        """Generate and score one rollout; return (one trainer shard per DP rank, metrics)."""
        from slime_like.rollout.batch import split_for_dp, to_train_batch

        samples, metrics = self.controller.generate(rollout_id)
        return split_for_dp(to_train_batch(self.args, samples), dp_size, balance=self.args.balance_data), metrics

    def evaluate(self, rollout_id: int) -> dict:
        return self.controller.evaluate(rollout_id)

    # ---- fully async rollout: the background generation around a weight push (no-ops without it) ----
    def pause_generation(self) -> float:
        """Returns once no request is in flight (drained, or aborted with --partial-rollout); seconds taken."""
        from slime_like.rollout.fully_async import pause_for_weight_update

        return pause_for_weight_update()

    def continue_generation(self, weight_version: int) -> None:
        from slime_like.rollout.fully_async import resume_after_weight_update

        resume_after_weight_update(weight_version)

    def dead_engines(self, probe: bool = False) -> dict:
        """{URL: last error} of the engines the rollout (or the fully async worker) found dead, not yet replaced;
        probe: health-check the live ones first."""
        from slime_like.rollout import fully_async

        found = self.controller.probe_engines() if probe else self.controller.dead_engines
        return {**found, **fully_async.dead_engines()}

    def replace_engines(self, replaced: dict) -> None:
        """{dead URL: restarted engine's URL}, once the restarted engines hold the current weights (behind a
        router, each is added to it now)."""
        from slime_like.rollout import fully_async

        self.engine_urls = [replaced.get(u, u) for u in self.engine_urls]
        self.controller.replace_engines(replaced)
        fully_async.replace_engines(replaced)

    def state_dict(self):
        return self.controller.state_dict()

    def close(self):
        self.controller.close()

    def load_state_dict(self, state):
        self.controller.load_state_dict(state)

    # ---- colocated mode: engines give their accelerator memory back while the trainers run ----
    def release_engine_memory(self) -> list:
        return self._on_every_engine(lambda client: client.release_memory())

    def resume_engine_memory(self) -> list:
        return self._on_every_engine(lambda client: client.resume_memory())

    def check_engine_weights(self, action: str) -> list:
        """slime's --check-weight-update-equal: every engine's /weights_checker with this action."""
        from slime_like.backends.engine_api.client import EngineError

        async def one(client):
            try:
                return await client.check_weights(action)
            except EngineError as e:
                raise RuntimeError(f"--check-weight-update-equal: after the first weight push, engine {e.url} does "
                                   f"not hold the weights it loaded from --hf-checkpoint: {e.message} (a run resumed "
                                   "from --load pushes the checkpoint's weights: the check is for a fresh start)"
                                   ) from None
        return self._on_every_engine(one)

    def _on_every_engine(self, request) -> list:
        """`request(client)` on every live engine, over the run's event loop and connections (the controller's)."""
        live = [u for u in self.engine_urls if u not in self.controller.dead_engines]  # a dead one can't answer
        return self.controller.on_engines(live, request)


class EngineGroup:
    """Driver-side handle on the engines of the run: their URLs, and the actors supervising the ones we started."""

    def __init__(self, actors: list, urls: list, router=None, router_url: str | None = None,
                 api_key: str | None = None):
        self.actors, self.urls = list(actors), list(urls)
        self.router, self.router_url = router, router_url  # a router process we started / any router in use
        self.api_key = api_key   # the run's secret, which the router's own routes require too
        self.restarts = 0
        self.followers = []   # the node 1.. actors of engines spanning nodes (their node 0 actor is in actors)
        self.nodes = None     # per engine, the Ray nodes of its GPUs in plan order (None: engines started elsewhere)
        self._respawn = None   # index -> (new actor on that engine's slot, ref of its start()): set by start()

    def restart(self, url: str) -> str:
        """Restart the engine that served `url` through its actor (which kills the old process first); returns
        the new URL, which takes the old one's place in `urls`."""
        if url not in self.urls or not self.actors:
            raise ValueError(f"cannot restart rollout engine {url}: this run started {self.urls if self.actors else 'none'}")
        index = self.urls.index(url)
        try:
            self.urls[index] = ray.get(self.actors[index].restart.remote())
        except ray.exceptions.RayActorError:
            if self._respawn is None:
                raise
            # the actor itself died (its engine followed it: --parent-pid): a new actor on the same slot
            print(f"[slime_like] the Ray actor of rollout engine {index} died; starting a new one on its slot",
                  file=sys.stderr, flush=True)
            self.actors[index], start = self._respawn(index)
            self.urls[index] = ray.get(start)
        self.restarts += 1
        return self.urls[index]

    def kill(self, url: str) -> None:
        """SIGKILL of the engine serving `url` (one of ours; its actor died with it already if that fails)."""
        if url in self.urls and self.actors:
            try:
                ray.get(self.actors[self.urls.index(url)].kill.remote())
            except ray.exceptions.RayActorError:
                pass

    @classmethod
    def start(cls, args, placement: Placement, engine_slots: list, gpu_share: float, kind: str) -> "EngineGroup":
        """One engine actor per plan entry, each starting its server (`kind`: the --rollout-engine value); an
        engine spanning nodes gets one actor per node (engine_nodes.py), node 0's serving its URL."""
        from slime_like.backends.engine_api.engine import pd_role
        from slime_like.ray.engine_nodes import by_node, pd_of, start_engine_nodes

        spans = [len(by_node(placement, slots)) > 1 for slots in engine_slots]
        placement.check_same_node([slots for slots, many in zip(engine_slots, spans) if not many])

        def new_actor(i, slots=None):
            slots = slots or engine_slots[i]
            gpu_ids = [placement.bundles[s].gpu_id for s in slots]
            # The engine uses all its GPUs through --base-gpu-id, so Ray must not narrow CUDA_VISIBLE_DEVICES
            # down to the one bundle the actor sits on.
            env = {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1", **QUIET_OPENMP}}
            return EngineActor.options(num_gpus=gpu_share, scheduling_strategy=placement.strategy(slots[0]),
                                       runtime_env=env).remote(args, i, gpu_ids)

        actors, followers, starts, roles = [], [], [], []
        multi_node = cluster_spans_nodes()
        try:
            for i, slots in enumerate(engine_slots):
                role = pd_role(args, i)
                if spans[i]:
                    lead, rest, start, pd = start_engine_nodes(new_actor, i, by_node(placement, slots), kind, role)
                else:
                    lead, rest = new_actor(i), []
                    pd = pd_of(lead, role)
                    start = lead.start.remote(kind, multi_node, None, pd)
                actors.append(lead)
                followers += rest
                starts.append(start)
                roles.append(pd)
            urls = ray.get(starts)
            router, router_url = start_router_for(args, kind, urls, multi_node, roles)
        except BaseException:
            for a in actors + followers:  # the engines that did start exit with their actor (--parent-pid watchdog)
                ray.kill(a)
            raise
        group = cls(actors, urls, router, router_url, args.engine_api_key)
        group.followers = followers
        group.nodes = [[placement.bundles[g[0]].node_id for g in by_node(placement, slots)] for slots in engine_slots]

        def respawn(i):
            actor = new_actor(i)
            return actor, actor.start.remote(kind, multi_node, None, roles[i])
        group._respawn = respawn
        return group

    def node_groups(self, urls: list) -> list | None:
        """Per URL of `urls` (engines of this group; a restarted one keeps its slots), the Ray nodes it spans."""
        return None if self.nodes is None else [self.nodes[self.urls.index(u)] for u in urls]

    @classmethod
    def external(cls, args, addrs: list) -> "EngineGroup":
        """Engines started outside this run (--rollout-external-engine-addrs HOST:PORT ...): nothing to stop;
        behind --sglang-router-ip/port when given."""
        urls = [a if a.startswith("http") else f"http://{a}" for a in addrs]
        return cls([], urls, None, _external_router_url(args))

    def stop(self):
        if self.router is not None:
            self.router.stop()
            self.router = None
        elif self.router_url and self.actors:   # a router started elsewhere: it forgets the engines we stop (slime)
            self._leave_router()
        if not self.actors:  # external engines: nothing of ours; ray.get([]) would auto-start a Ray cluster
            return
        try:
            ray.get([a.stop.remote() for a in self.actors + self.followers])
        except ray.exceptions.RayActorError:  # an engine actor that died (its engine went with it)
            pass
        for a in self.actors + self.followers:
            ray.kill(a)

    def _leave_router(self):
        from slime_like.backends.sglang import router

        for url in self.urls:
            try:
                router.remove_worker(self.router_url, url, self.api_key)
            except Exception as e:  # noqa: BLE001 - the run is ending; the router's own health check drops it later
                print(f"[slime_like] could not remove rollout engine {url} from the router {self.router_url}: {e}",
                      file=sys.stderr, flush=True)


def _external_router_url(args) -> str | None:
    if not args.sglang_router_ip:
        return None
    host = args.sglang_router_ip if ":" not in args.sglang_router_ip else f"[{args.sglang_router_ip}]"
    return f"http://{host}:{args.sglang_router_port}"


def start_router_for(args, kind: str, engine_urls: list, multi_node: bool = False, roles: list | None = None):
    """The router in front of the run's engines, as slime does it: -> (router process we started or None,
    router URL or None).

    --sglang-router-ip/--sglang-router-port: an existing router; every engine registers with it (router.add_worker).
    Else engines of a kind that `uses_router` (SGLang), more than one: start sglang_router on this node over
    them, with the --router-* passthrough values. Else none: the rollout client balances over the engines.
    `roles`: each engine's (role, bootstrap port) in a prefill / decode disaggregated run (the router then runs
    with --pd-disaggregation over them), else None."""
    from slime_like.backends.engine_api.engine import get_engine
    from slime_like.backends.sglang import router

    url = _external_router_url(args)
    if url:
        for engine_url in engine_urls:
            router.add_worker(url, engine_url, args.engine_api_key)
        return None, url
    if not (get_engine(kind).uses_router and len(engine_urls) > 1):
        return None, None
    host = ray.util.get_node_ip_address() if multi_node else "127.0.0.1"  # loopback unless the run spans nodes
    pd = None
    if roles and any(roles):
        pd = ([(u, r[1]) for u, r in zip(engine_urls, roles) if r[0] == "prefill"],
              [u for u, r in zip(engine_urls, roles) if r[0] == "decode"])
    proc = router.start_router(args, engine_urls, host=host, port=free_port(), pd=pd)
    return proc, proc.url
