"""Everything one training run holds under Ray, and the steps the loops in train.py / train_async.py call.

`Run.start(args)` executes the placement plan: placement group, actor (and critic) trainer groups, engines,
the rollout manager, and the weight path from trainer to engines. Each method below is one stage of the
loop; the loops themselves stay in the entry scripts so they read top to bottom.
"""
from __future__ import annotations

import functools
import json
import os
import time

import ray

from slime_like.args import role_args
from slime_like.ray.cadence import Cadence
from slime_like.ray.cluster import init_ray, say
from slime_like.ray.failures import EngineLostDuringPush
from slime_like.ray.placement import create_placement
from slime_like.ray.rollout_manager import EngineGroup, RolloutManager
from slime_like.ray.run_checkpoint import CheckpointMismatch, resume_iteration, rollout_state_path, write_marker
from slime_like.ray.trainer_group import TrainerGroup
from slime_like.utils.json_dump import write_json
from slime_like.utils.auth import new_secret, resolve_api_key
from slime_like.utils.shm import sweep_orphaned_segments

# Fractions of one GPU slot when trainer and engine share it (colocated): together < 1.
TRAINER_SHARE_COLOCATED, ENGINE_SHARE_COLOCATED = 0.4, 0.2
# --use-fault-tolerance: pushes of one update after engines died during it (each retry restarts the dead ones)
MAX_PUSH_RETRIES = 2


class Run:
    def __init__(self, args, placement, actor, critic, engines, rollout):
        self.args, self.placement = args, placement
        self.actor, self.critic, self.engines, self.rollout = actor, critic, engines, rollout
        self.colocate = bool(args.colocate)
        self.cadence = Cadence(args)  # when the loops save, push and evaluate; background generation
        self.fully_async = self.cadence.background
        self.reference = None
        self._weight_urls: list = []   # the engines the weight path reaches
        loaded = actor.loaded_rollout_id if actor is not None else None
        if critic is not None and actor is not None and critic.loaded_rollout_id != loaded:
            raise CheckpointMismatch(f"the actor resumed from iteration {loaded} but the critic from "
                                     f"{critic.loaded_rollout_id}; both must load the run's checkpoint")
        self.start_rollout_id = 0 if loaded is None else loaded + 1
        if args.start_rollout_id is not None:  # slime: an explicit start wins over the checkpoint's
            if args.start_rollout_id != self.start_rollout_id:
                print(f"--start-rollout-id {args.start_rollout_id}: the loop starts there (the checkpoint "
                      f"alone would start at {self.start_rollout_id})")
            self.start_rollout_id = args.start_rollout_id

    @classmethod
    def start(cls, args, plan):
        # The secret every engine route will require (docs/security.md): the user's for engines they run,
        # else a fresh one for the engines this run starts. Set before the role views copy `args`.
        args.engine_api_key = resolve_api_key(args.engine_api_key)
        if not args.engine_api_key and not args.rollout_external_engine_addrs:
            args.engine_api_key = new_secret()
        # Every role resumes from the same iteration: the run's marker, written after all roles saved (checked
        # before Ray starts: a stray critic checkpoint is refused in a second, not after the cluster is up).
        resume = resume_iteration(args.load, role_args(args, "critic").load if args.use_critic else None,
                                  ckpt_step=args.ckpt_step)
        swept = sweep_orphaned_segments()   # weight buffers of a run killed before its clean-up (SIGKILL)
        if swept:
            say(f"removed {len(swept)} shared-memory segment(s) left by a killed run (e.g. {swept[0]})")
        say(init_ray(args, plan))
        placement = create_placement(plan.num_slots)
        started = []  # what to tear down if a later step fails: no leaked GPU slots or engine processes
        try:
            return cls._start_on(args, plan, placement, started, resume)
        except BaseException:
            for stop in reversed(started):
                try:
                    stop()
                except Exception as e:  # keep tearing down the rest
                    print(f"cleanup after a failed start: {e}")
            placement.remove()
            raise

    @classmethod
    def _start_on(cls, args, plan, placement, started: list, resume: int | None):
        trainer_share = TRAINER_SHARE_COLOCATED if args.colocate else 1.0
        # --debug-rollout-only: engines and rollout only; --debug-train-only: trainers fed from
        # --load-debug-rollout-data, no engines (the plan leaves out the part that is not run)
        actor = critic = None
        if plan.actor_slots:
            actor = TrainerGroup(role_args(args, "actor"), "actor", placement, plan.actor_slots, trainer_share,
                                 resume_iteration=resume)
            started.append(functools.partial(actor.kill, close_timeout=0))  # no sender yet: nothing to wait for
        reference = None
        if plan.reference_slots:  # a reference on GPUs of its own: its log-probs computed there
            reference = TrainerGroup(role_args(args, "actor"), "reference", placement, plan.reference_slots,
                                     trainer_share)
            started.append(functools.partial(reference.kill, close_timeout=0))
        if args.use_critic and plan.critic_slots:
            critic = TrainerGroup(role_args(args, "critic"), "critic", placement, plan.critic_slots, trainer_share / 2,
                                  resume_iteration=resume)
            started.append(functools.partial(critic.kill, close_timeout=0))
        engine_share = ENGINE_SHARE_COLOCATED if args.colocate else 1.0
        if args.rollout_external_engine_addrs:  # engines someone else runs: talk to them, start none
            engines = EngineGroup.external(args, args.rollout_external_engine_addrs)
        else:
            engines = EngineGroup.start(args, placement, plan.engine_slots, engine_share, kind=plan.engine_kind)
            started.append(engines.stop)
        rollout = RolloutManager.options(num_cpus=0).remote(args, engines.urls, engines.router_url)
        started.append(lambda: ray.kill(rollout))
        run = cls(args, placement, actor, critic, engines, rollout)
        run.reference = reference
        run._restore_rollout_state()
        if actor is not None and engines.urls:
            actor.connect_engines(engines.urls, colocate=bool(args.colocate),
                                  engine_node_groups=engines.node_groups(engines.urls))
            run._weight_urls = list(engines.urls)
        return run

    # ---- one rollout ----
    def generate(self, rollout_id: int):
        """Ask the rollout manager for rollout `rollout_id`; returns an object ref to (shards, metrics)."""
        return self.rollout.generate.remote(rollout_id, self.actor.dp_size if self.actor is not None else 1)

    def train(self, rollout_id: int, shards) -> dict:
        """slime's order: (critic values) -> actor log-probs -> advantages -> critic and actor updates."""
        metrics = {}
        if self.actor is None:  # --debug-rollout-only
            return metrics
        t = time.perf_counter()
        self.actor.set_batch(shards)
        if self.reference is not None:  # on its own GPUs, one answer per actor DP shard
            self.actor.update_batch_per_dp(self.reference.reference_log_probs(shards))
        if self.critic is not None:
            self.critic.set_batch(shards)
            values = self.critic.per_dp(self.critic.compute_values())
            self.actor.update_batch_per_dp(values)
        tokens, advantages = 0, None
        if self.args.compute_advantages_and_returns:  # off (--disable-...): SFT needs neither pass
            gaps = self.actor.per_dp(self.actor.compute_log_probs())
            tokens = sum(c for _, c in gaps)
            if tokens:
                metrics["rollout/logprob_abs_diff"] = sum(d for d, _ in gaps) / tokens
            advantages = self.actor.per_dp(self.actor.compute_advantages(return_to_driver=self.critic is not None))
        metrics["time/log_probs"] = time.perf_counter() - t
        t = time.perf_counter()
        if self.critic is not None:
            self.critic.update_batch_per_dp(advantages)
            metrics.update(self.critic.train_step(rollout_id))
        if rollout_id >= self.args.num_critic_only_steps:  # PPO warm-up: the critic learns first
            metrics.update(self.actor.train_step(rollout_id))
            if not tokens and "actor/train_rollout_logprob_abs_diff" in metrics:  # on-policy: no separate pass
                metrics["rollout/logprob_abs_diff"] = metrics["actor/train_rollout_logprob_abs_diff"]
        metrics["time/train"] = time.perf_counter() - t
        if self.args.save_debug_train_data:
            self._save_train_data(rollout_id)
        return metrics

    def _save_train_data(self, rollout_id: int):
        """slime's --save-debug-train-data: one file per rollout with every DP shard's batch (the fields
        the loss read: tokens, masks, rewards, log-probs, advantages, ...); `{rank}` is the writer, 0."""
        shards = self.actor.per_dp(self.actor.debug_batches())
        path = self.args.save_debug_train_data.format(rollout_id=rollout_id, rank=0)
        write_json(path, {"rollout_id": rollout_id, "dp_shards": shards})

    def update_weights(self, rollout_id: int | None = None) -> dict:
        """Push the trainer's weights to the engines as version rollout_id + 1 (the weights after that many
        training steps; the first push, rollout_id None, is version start_rollout_id). In fully async mode the
        background generation is paused around the push (rollout/fully_async.py)."""
        version = self.start_rollout_id if rollout_id is None else rollout_id + 1
        if self.actor is None or not self.engines.urls:  # a debug mode runs only one side
            if self.fully_async and self.engines.urls:   # --debug-rollout-only: the weights never change, but the
                ray.get(self.rollout.continue_generation.remote(version))  # versions advance: no stall on the bound
            return {}
        metrics = {}
        if self.fully_async:
            metrics["time/pause_generation"] = ray.get(self.rollout.pause_generation.remote())
        t = time.perf_counter()
        try:
            replaced, retries, sent = self._push(version)
            if replaced:
                # only now, on the trainer's current weights, may the restarted engines serve requests
                ray.get(self.rollout.replace_engines.remote(replaced))
                metrics["rollout/engine_restarts"] = len(replaced)
            if retries:
                metrics["weights/push_retries"] = retries
        finally:
            if self.fully_async:
                ray.get(self.rollout.continue_generation.remote(version))
        return {**metrics, "time/update_weights": time.perf_counter() - t, "weights/bytes_sent": sent,
                "weights/version": version}

    def _push(self, version: int) -> tuple[dict, int, int]:
        """Refresh the engines and push; an engine that dies during the push (found by a health check of every
        engine once the push failed) is, with --use-fault-tolerance, restarted and the whole push done again over
        the live engines (the others may hold part of the new weights). -> ({dead URL: new URL}, retries, bytes)."""
        replaced, retries = self._refresh_engines(), 0
        while True:
            try:
                return replaced, retries, sum(ray.get(self._watch_push(self.actor.start_update_weights(version))))
            except ray.exceptions.RayTaskError as e:
                lost = self._lost_during_push(e)
                if not self.args.use_fault_tolerance or retries == MAX_PUSH_RETRIES:
                    why = (f"gave up after {retries} retries" if self.args.use_fault_tolerance else
                           "pass --use-fault-tolerance to restart it and push again")
                    raise EngineLostDuringPush(f"rollout engine(s) {', '.join(lost)} stopped answering during the "
                                               f"weight push of version {version}; {why}") from None
                retries += 1
                say(f"rollout engine(s) {', '.join(lost)} stopped answering during the weight push of version "
                    f"{version}; restarting them and pushing again (retry {retries})")
                for old, new in self._refresh_engines().items():   # a restarted engine may die again
                    first = next((k for k, v in replaced.items() if v == old), old)
                    replaced[first] = new

    def _watch_push(self, refs: list) -> list:
        """While the push runs, health-check the engines every --rollout-health-check-interval: a hung one would
        hold the push up to the weight-sync timeout (600 s), so it is killed and the push fails at once instead."""
        interval, killed = self.args.rollout_health_check_interval, set()
        while interval and ray.wait(refs, num_returns=len(refs), timeout=interval)[1]:
            dead = ray.get(self.rollout.dead_engines.remote(probe=True))
            for url in [u for u in self._weight_urls if u in dead and u not in killed]:
                say(f"rollout engine {url} stopped answering during the weight push ({dead[url]}); killing it")
                self.engines.kill(url)
                killed.add(url)
        return refs

    def _lost_during_push(self, error) -> list:
        """The engines of the weight path that fail a health check now; none: the push failed for another reason,
        re-raised as it is."""
        dead = ray.get(self.rollout.dead_engines.remote(probe=True))
        lost = [u for u in self._weight_urls if u in dead]
        if not lost:
            raise error
        return lost

    def _refresh_engines(self) -> dict:
        """Before a push: restart the engines the rollout found dead or hung, or that fail a health check now
        (--use-fault-tolerance; slime restarts at the weight update too), and rebuild the weight path over the engines that are live now, so the push
        brings restarted engines to the current weights and never waits on a dead one. -> {dead URL: new URL}."""
        dead = ray.get(self.rollout.dead_engines.remote(probe=bool(self.args.use_fault_tolerance)))
        dead = {u: why for u, why in dead.items() if u in self.engines.urls}  # not those restarted by this update
        replaced = self._restart(dead) if dead and self.args.use_fault_tolerance else {}
        live = [u for u in self.engines.urls if u not in dead]
        if live != self._weight_urls:
            self.actor.connect_engines(live, colocate=self.colocate, leaving=[u for u in self._weight_urls if u in live],
                                       engine_node_groups=self.engines.node_groups(live))
            self._weight_urls = live
        return replaced

    def _restart(self, dead: dict) -> dict:
        """Each dead engine killed and started again by its actor (a new URL). One that fails to start stays out
        of the run (the rollout goes on with the others; tried again at the next update)."""
        replaced = {}
        for url, reason in dead.items():
            say(f"restarting rollout engine {url} (found dead: {reason})")
            try:
                replaced[url] = self.engines.restart(url)
            except Exception as e:  # noqa: BLE001 - reported; the run continues on the live engines
                say(f"rollout engine {url} could not be restarted ({e}); the rollout continues without it")
        if replaced:
            say(f"rollout engines restarted {replaced}; they get the current weights before serving")
        return replaced

    def check_engine_weights(self, action: str) -> list:
        return ray.get(self.rollout.check_engine_weights.remote(action))

    def evaluate(self, rollout_id: int) -> dict:
        if not self.engines.urls:
            return {}
        t = time.perf_counter()
        metrics = ray.get(self.rollout.evaluate.remote(rollout_id))
        return {**metrics, "time/eval": time.perf_counter() - t}

    # ---- colocated mode: engines and trainers take turns on the same GPUs ----
    def offload_engines(self):
        if self.colocate and self.args.offload_rollout:
            ray.get(self.rollout.release_engine_memory.remote())

    def onload_engines(self):
        if self.colocate and self.args.offload_rollout:
            ray.get(self.rollout.resume_engine_memory.remote())

    def offload_trainers(self):
        if self.colocate and self.args.offload_train:
            for g in self._trainers():
                g.offload()

    def onload_trainers(self):
        if self.colocate and self.args.offload_train:
            for g in self._trainers():
                g.onload()

    # ---- checkpoints: rollout state first, then each role's checkpoint, then the run's marker last ----
    def save(self, rollout_id: int):
        state = ray.get(self.rollout.state_dict.remote())
        _atomic_json(state, rollout_state_path(self.args.save, rollout_id))
        for g in self._trainers():
            g.save(rollout_id)
        if self.actor is not None:
            write_marker(self.args.save, rollout_id, {"actor": self.actor.args.save,
                                                      **({"critic": self.critic.args.save} if self.critic else {})})

    def _restore_rollout_state(self):
        if self.start_rollout_id == 0:
            return
        path = rollout_state_path(self.args.load, self.start_rollout_id - 1) if self.args.load else None
        legacy = path[:-len(".json")] + ".pkl" if path else None
        if path and not os.path.exists(path) and os.path.exists(legacy):
            raise RuntimeError(f"--load {self.args.load}: {legacy} is a pickled rollout state from an older "
                               "slime_like; pickles are no longer loaded (loading one can run code). Resume that run "
                               "with the version that wrote it")
        if self.args.start_rollout_id is not None and (path is None or not os.path.exists(path)):
            # as slime: a start set by hand without a saved data position reads the prompts from the beginning
            print(f"--start-rollout-id {self.start_rollout_id}: no rollout state for rollout "
                  f"{self.start_rollout_id - 1} under --load; the prompt data starts from its beginning")
            return
        if not os.path.exists(path):
            raise RuntimeError(f"--load {self.args.load}: the trainer resumed from rollout {self.start_rollout_id - 1} "
                               f"but the rollout state {path} is missing; cannot continue the prompt sequence exactly")
        with open(path, encoding="utf-8") as f:   # JSON, never pickle: a checkpoint folder is data, not code
            ray.get(self.rollout.load_state_dict.remote(json.load(f)))

    def _trainers(self):
        return [g for g in (self.critic, self.actor) if g is not None]

    def shutdown(self, interrupted: bool = False):
        """Stop engines first (they are child processes), then the actors; leave no orphans. A fully async
        worker is stopped before the engines (its requests are aborted), so it never waits on a stopped one.
        `interrupted` (SIGTERM / SIGINT): the rollout manager may be in the middle of a rollout, which its graceful
        close would wait for (up to 30 s, measured); it is killed first instead, which ends its requests too."""
        groups = self._trainers() + ([self.reference] if self.reference is not None else [])
        close_rollout = lambda: ray.get(self.rollout.close.remote(), timeout=30)  # noqa: E731  (idempotent)
        kill_rollout = lambda: ray.kill(self.rollout)  # noqa: E731
        if interrupted:
            first, graceful = [kill_rollout], []
        else:
            first, graceful = ([close_rollout] if self.fully_async else []), [close_rollout, kill_rollout]
        kill_trainers = [functools.partial(g.kill, close_timeout=2 if interrupted else 30) for g in groups]
        for step in (*first, self.engines.stop, *graceful, *kill_trainers, self.placement.remove):
            try:
                step()
            except Exception as e:  # keep tearing down the rest
                print(f"shutdown: {e}")


def _atomic_json(obj, path: str):
    """Write `obj` as JSON (tmp file + fsync + rename: a kill leaves the old state or the new, never half)."""
    try:
        text = json.dumps(obj)
    except (TypeError, ValueError) as e:
        raise TypeError(f"the rollout state (data source position and buffer) must be JSON-serializable to be "
                        f"checkpointed safely; a custom --data-source-path's state_dict() returned: {e}") from None
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
