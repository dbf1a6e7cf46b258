"""One Ray actor per trainer rank (actor or critic), and the driver-side group that fans calls out.

Each rank's share of the rollout lives inside its actor (`set_batch`), so the per-token tensors that
later calls add (log-probs, values, advantages) never travel back through the driver unless another
role needs them (the actor needs the critic's values; the critic needs the actor's returns).
"""
from __future__ import annotations

import glob
import os

import ray

from slime_like.ray.cluster import cluster_spans_nodes
from slime_like.ray.placement import QUIET_OPENMP, Placement
from slime_like.ray.weight_relay import choose_relays
from slime_like.utils.console import quiet_known_notices
from slime_like.utils.net import free_port
from slime_like.config.train_env import train_env_vars, trainer_threads


# weight_relay: a rank relays other ranks' buckets to the engine ranks on its node (ray/weight_relay.py) while its own
# main thread is still inside update_weights
@ray.remote(num_cpus=0, concurrency_groups={"weight_relay": 1})
class TrainerActor:
    def __init__(self, args, role: str, rank: int, world_size: int, threads: int):
        self.args, self.role, self.rank, self.world_size = args, role, rank, world_size
        os.environ["OMP_NUM_THREADS"] = str(threads)
        quiet_known_notices()  # before megatron-core is imported (utils/console.py lists what and why)
        import torch

        torch.set_num_threads(threads)
        self.trainer = None
        self.batch = None
        self.weight_sender = None
        self.relayed = {}   # sender rank -> BucketRelay: this rank's copy of that sender's bucket

    def node_ip_and_free_port(self):
        return ray.util.get_node_ip_address(), free_port()

    def init(self, master_addr: str, master_port: int, resume_iteration: int | None):
        """Build this rank's trainer backend (--train-backend) at the run's resume iteration; returns the rollout id
        it resumed from."""
        from slime_like.backends import trainer_api

        self.trainer = trainer_api.build(self.args, role=self.role, rank=self.rank, world_size=self.world_size,
                                         master_addr=master_addr, master_port=master_port,
                                         resume_iteration=resume_iteration)
        return self.trainer.loaded_rollout_id

    def parallel_info(self):
        return dict(self.trainer.parallel_info(), pid=os.getpid(), node_ip=ray.util.get_node_ip_address(),
                    node_id=ray.get_runtime_context().get_node_id())

    # ---- data flow: each call adds keys to this rank's batch and returns them when asked ----
    def set_batch(self, batch):
        self.batch = dict(batch)

    def update_batch(self, extra):
        self.batch.update(extra)

    def compute_log_probs(self):
        """Adds log_probs (and ref_log_probs); returns (sum |trainer - engine| log-prob, token count).

        On-policy, the engine generated with exactly the weights the trainer holds, so the gap is numeric
        noise; a large gap means a weight sync went wrong (or --use-tis has real work to do)."""
        out = self.trainer.compute_log_probs(self.batch, old_policy=self.trainer.old_log_probs_needed())
        self.batch.update(out)
        import torch

        diff, count = 0.0, 0  # without the old-policy pass, train_step measures the gap instead
        for lp, rollout_lp in zip(out.get("log_probs", ()), self.batch.get("rollout_log_probs") or []):
            if len(rollout_lp) == len(lp):
                diff += (lp.float() - torch.tensor(rollout_lp, dtype=torch.float32)).abs().sum().item()
                count += len(lp)
        return diff, count

    def reference_log_probs(self, shards: list) -> list:
        """Reference worker: ref_log_probs of each given actor shard (its own batch, not this rank's)."""
        shards = ray.get(list(shards))  # object refs nested in a list are not resolved by Ray itself
        return [self.trainer.compute_log_probs(shard) for shard in shards]

    def compute_values(self):
        out = self.trainer.compute_values(self.batch)
        self.batch.update(out)
        return out

    def compute_advantages(self, *, return_to_driver: bool):
        """Adds advantages and returns; hands them back only when another role (the critic) needs them:
        pickling ~1000 small tensors through Ray costs more than computing them."""
        out = self.trainer.compute_advantages(self.batch)
        self.batch.update(out)
        return out if return_to_driver else None

    def train_step(self, rollout_id: int):
        return self.trainer.train_step(rollout_id, self.batch)

    def debug_batch(self):
        """--save-debug-train-data: this rank's training batch as it was trained on (tensors as lists)."""
        return {k: [v.tolist() if hasattr(v, "tolist") else v for v in vals] if isinstance(vals, list) else vals
                for k, vals in self.batch.items()}

    def save(self, rollout_id: int):
        self.trainer.save(rollout_id)

    def offload(self):
        self.trainer.offload()

    def onload(self):
        self.trainer.onload()

    # ---- weight sync: trainer -> rollout engines ----
    def connect_engines(self, engine_urls, colocate: bool, group_name: str, leaving: list | None = None,
                        engine_rank_nodes: list | None = None, relays: dict | None = None):
        """Open the weight path to the engines: an in-memory tensor handoff when colocated, else a
        dedicated process group (gloo on CPU, nccl on GPU) with this rank as the broadcast source.
        With pipeline parallelism every stage sends its own layers, each through its own group. A second call
        replaces the weight path (an engine died or was restarted): `leaving` are the engines of the old group to
        tell (the live ones; a dead or hung one would refuse or never answer). Colocated, `engine_rank_nodes` (per
        engine, the Ray node of each rank) and `relays` ({node: the actor rank there}) let engine ranks on other
        nodes get handles made on their node (ray/weight_relay.py)."""
        from slime_like.backends.engine_api import weight_sync

        self._close_old_sender(leaving)
        if self.args.update_weight_mode == "delta":  # only the changed bytes, via the engines' local copies
            from slime_like.backends.engine_api.delta_sync import DeltaWeightSender

            args = self.args
            self.weight_sender = DeltaWeightSender(engine_urls, args.update_weight_disk_dir,
                                                   args.update_weight_local_checkpoint_dir, args.hf_checkpoint,
                                                   encoding=args.update_weight_delta_encoding,
                                                   checksum_format=args.update_weight_delta_checksum,
                                                   keep_files=args.update_weight_disk_keep_files,
                                                   api_key=args.engine_api_key)
            self.weight_sender.connect()
        elif self.args.update_weight_transport == "disk":  # a full HF checkpoint per sync (engine_api/disk_sync.py)
            from slime_like.backends.engine_api.disk_sync import DiskWeightSender

            self.weight_sender = DiskWeightSender(engine_urls, self.args.update_weight_disk_dir,
                                                  hf_checkpoint=self.args.hf_checkpoint,
                                                  keep_files=self.args.update_weight_disk_keep_files,
                                                  api_key=self.args.engine_api_key)
            self.weight_sender.connect()
        elif colocate:
            # One shared-memory send buffer for the whole run: a fresh one per sync costs its page faults
            # (100M: ~1.3 s); released by close_weight_sender() or, after a kill, by TrainerGroup.kill()
            from slime_like.ray.weight_relay import RayRelays

            self.weight_sender = weight_sync.TensorWeightSender(
                engine_urls, keep_buffer=True, engine_tp_size=self._engine_ranks(), api_key=self.args.engine_api_key,
                own_node=ray.get_runtime_context().get_node_id(), engine_rank_nodes=engine_rank_nodes,
                relays=RayRelays(self.rank, relays) if relays else None)
        else:
            import torch

            backend = "nccl" if torch.cuda.is_available() else "gloo"
            self.weight_sender = weight_sync.DistributedWeightSender(engine_urls, backend=backend,
                                                                     group_name=group_name,
                                                                     engine_tp_size=self._engine_ranks(),
                                                                     api_key=self.args.engine_api_key)
            self.weight_sender.connect()

    def _engine_ranks(self) -> int:
        """Ranks of each engine that receive the push (SGLang: every GPU of it, on every node it spans)."""
        from slime_like.backends.engine_api.engine import get_engine

        return get_engine(self.args.rollout_engine).weight_sync_ranks(self.args)

    def _close_old_sender(self, leaving: list | None):
        if self.weight_sender is None:
            return
        try:
            self.weight_sender.close(leaving)
        except Exception as e:  # noqa: BLE001 - a survivor's refusal to leave: the group is gone on this side
            print(f"weight sync: closing the previous engine group: {e}")
        self.weight_sender = None

    def close_weight_sender(self):
        if self.weight_sender is not None:
            self.weight_sender.close()
        for sender in list(self.relayed):
            self.drop_relay(sender)

    @ray.method(concurrency_group="weight_relay")
    def relay_bucket(self, sender: int, data, metadata: list, count: int) -> list:
        """Sender rank `sender`'s bucket (its bytes, its flattened-bucket metadata) copied into this rank's buffer:
        `count` serialized entries for the engine ranks on this node."""
        from slime_like.backends.engine_api.node_handles import BucketRelay

        return self.relayed.setdefault(sender, BucketRelay()).handles(data, metadata, count)

    @ray.method(concurrency_group="weight_relay")
    def drop_relay(self, sender: int):
        relay = self.relayed.pop(sender, None)
        if relay is not None:
            relay.close()

    def last_push_entries(self) -> list:
        """The last bucket's serialized_named_tensors per engine, as this sender posted them (which process made
        each handle: engine_api/node_handles.segment_owner)."""
        return getattr(self.weight_sender, "last_entries", [])

    def update_weights(self, weight_version: int | None = None):
        """Every rank walks the HF-named weights (TP gathers are collectives); the rank that receives
        full tensors sends them, tagged `weight_version` (the engines report it with every answer). Returns the
        number of bytes this rank sent."""
        named = self.trainer.iter_hf_weights()
        if self.weight_sender is None:
            for _ in named:  # not a sender: still take part in the gathers
                pass
            sent = 0
        else:
            try:
                sent = self.weight_sender.send(named, bucket_bytes=self.args.update_weight_buffer_size,
                                               weight_version=None if weight_version is None else str(weight_version))
            except Exception:
                # an engine died mid-push: finish the walk, so the other ranks' TP / PP gathers never wait on this
                # rank; the driver then health-checks the engines and restarts or names the dead one
                for _ in named:
                    pass
                raise
        if self.args.keep_old_actor and self.role == "actor" and weight_version is not None:
            self.trainer.remember_pushed_weights(weight_version)  # the weights the engines generate with now
        return sent


class TrainerGroup:
    """All ranks of one role, placed on plan slots; calls fan out and results come back per rank."""

    def __init__(self, args, role: str, placement: Placement, slots: list, gpu_share: float,
                 resume_iteration: int | None = None):
        """`resume_iteration`: the run's checkpoint iteration, which every role loads (None: a fresh start)."""
        self.args, self.role = args, role
        world = len(slots)
        user_env = train_env_vars(args.train_env_vars)
        threads = trainer_threads(world, user_env)
        env = {**QUIET_OPENMP, **user_env, "OMP_NUM_THREADS": str(threads)}
        # named, so a rank that dies under Ray is reported by role and rank (ray/failures.py)
        self.actors = [TrainerActor.options(num_gpus=gpu_share, scheduling_strategy=placement.strategy(s),
                                            runtime_env={"env_vars": env}, name=f"{role} trainer rank {rank}")
                       .remote(args, role, rank, world, threads) for rank, s in enumerate(slots)]
        try:
            master_addr, master_port = ray.get(self.actors[0].node_ip_and_free_port.remote())
            if not cluster_spans_nodes():  # every rank is on this host: the store and gloo listen on loopback
                master_addr = "127.0.0.1"
            loaded = ray.get([a.init.remote(master_addr, master_port, resume_iteration) for a in self.actors])
            self.info = ray.get([a.parallel_info.remote() for a in self.actors])
        except BaseException:
            self.kill(close_timeout=0)  # a rank that failed to start must not keep its GPU slot (no sender yet)
            raise
        self.loaded_rollout_id = loaded[0]
        self.dp_size = self.info[0]["dp_size"]

    # ---- every rank, one result per rank ----
    def compute_values(self) -> list:
        return ray.get([a.compute_values.remote() for a in self.actors])

    def compute_log_probs(self) -> list:
        """Per rank: (sum |trainer - engine| log-prob, token count)."""
        return ray.get([a.compute_log_probs.remote() for a in self.actors])

    def compute_advantages(self, *, return_to_driver: bool) -> list:
        return ray.get([a.compute_advantages.remote(return_to_driver=return_to_driver) for a in self.actors])

    def debug_batches(self) -> list:
        """--save-debug-train-data: every rank's training batch as lists."""
        return ray.get([a.debug_batch.remote() for a in self.actors])

    def save(self, rollout_id: int) -> None:
        ray.get([a.save.remote(rollout_id) for a in self.actors])

    def offload(self) -> None:
        ray.get([a.offload.remote() for a in self.actors])

    def onload(self) -> None:
        ray.get([a.onload.remote() for a in self.actors])

    def set_batch(self, shards: list):
        """Give every rank the shard of its data-parallel rank (ranks of one model replica share it)."""
        refs = [ray.put(s) for s in shards]
        ray.get([a.set_batch.remote(refs[i["dp_rank"]]) for a, i in zip(self.actors, self.info)])

    def per_dp(self, results: list) -> list:
        """Collapse per-rank results to one per data-parallel rank (ranks of a replica agree)."""
        out = [None] * self.dp_size
        for r, i in zip(results, self.info):
            if out[i["dp_rank"]] is None:
                out[i["dp_rank"]] = r
        return out

    def update_batch_per_dp(self, per_dp: list):
        ray.get([a.update_batch.remote(per_dp[i["dp_rank"]]) for a, i in zip(self.actors, self.info)])

    def reference_log_probs(self, shards: list) -> list:
        """Reference group: ref_log_probs for every actor data-parallel shard, whatever the two DP sizes are.
        Shard k goes to reference DP rank k % dp (every rank of that replica gets it: TP / PP ranks compute
        together); the answers come back in shard order."""
        mine = {d: [k for k in range(len(shards)) if k % self.dp_size == d] for d in range(self.dp_size)}
        refs = [ray.put(s) for s in shards]
        results = ray.get([a.reference_log_probs.remote([refs[k] for k in mine[i["dp_rank"]]])
                           for a, i in zip(self.actors, self.info)])
        out = [None] * len(shards)
        for result, i in zip(results, self.info):
            for k, value in zip(mine[i["dp_rank"]], result):
                out[k] = value
        return out

    def train_step(self, rollout_id: int) -> dict:
        metrics = ray.get([a.train_step.remote(rollout_id) for a in self.actors])[0]  # DP-averaged by the trainer
        return {f"{self.role}/{k}": v for k, v in metrics.items()}

    def connect_engines(self, engine_urls, colocate: bool, leaving: list | None = None,
                        engine_node_groups: list | None = None):
        """`engine_node_groups`: per engine URL the Ray nodes its GPUs sit on, in plan order (None: engines started
        elsewhere, taken to be on the sender's node). Colocated, each sender gets a relay rank on every other node
        with engine ranks (ray/weight_relay.py); with every engine rank on the sender's node, none."""
        # iter_hf_weights() yields full tensors on tp_rank 0 / dp_rank 0 / cp_rank 0 of each pipeline stage: one
        # sender per stage, each with its own weight-sync group on the engines
        senders = [r for r, i in enumerate(self.info) if i["dp_rank"] == 0 and i["tp_rank"] == 0
                   and i.get("cp_rank", 0) == 0]
        rank_nodes = self._engine_rank_nodes(engine_node_groups) if colocate and engine_node_groups else None
        calls = []
        for r in senders:
            relays = choose_relays(self.info, self.actors, r, rank_nodes) if rank_nodes else None
            calls.append(self.actors[r].connect_engines.remote(
                engine_urls, colocate, f"slime_like_weights_pp{self.info[r]['pp_rank']}", leaving,
                engine_rank_nodes=rank_nodes, relays=relays))
        ray.get(calls)

    def _engine_rank_nodes(self, engine_node_groups: list) -> list:
        """Per engine, the Ray node of each rank that receives the push."""
        from slime_like.backends.engine_api.engine import get_engine
        from slime_like.backends.engine_api.node_handles import rank_nodes

        ranks = get_engine(self.args.rollout_engine).weight_sync_ranks(self.args)
        return [rank_nodes(groups, ranks) if groups else [None] * ranks for groups in engine_node_groups]

    def start_update_weights(self, weight_version: int | None = None) -> list:
        """The push, started on every rank: one ref per rank to the bytes it sent (the driver watches the engines
        while it runs)."""
        return [a.update_weights.remote(weight_version) for a in self.actors]

    def kill(self, close_timeout: float = 30):
        """Release the weight-send buffers, kill the ranks, then unlink what a killed rank left in /dev/shm.

        Ray kills an actor with its children, torch's shared-memory manager among them, so a segment still
        mapped then (torch names it /dev/shm/torch_<creator pid>_*) would stay until reboot. A rank busy in a
        train step, push or save answers the release only when done: after a signal `close_timeout` is short and
        the sweep below unlinks what it held."""
        try:
            if close_timeout > 0:
                ray.get([a.close_weight_sender.remote() for a in self.actors], timeout=close_timeout)
        except Exception:  # a dead or hung rank: the sweep below still runs
            pass
        for a in self.actors:
            ray.kill(a)
        here = ray.util.get_node_ip_address()
        for info in getattr(self, "info", []):
            if info["node_ip"] != here:  # a pid of another node names nothing here
                continue
            for path in glob.glob(f"/dev/shm/torch_{info['pid']}_*"):
                try:
                    os.unlink(path)
                except OSError:
                    pass
