"""Asynchronous RL, in two modes.

One-step-off (default): the engines generate rollout N+1 while the trainer trains on rollout N. The policy
that generated rollout N+1 is therefore one update behind the one that trains on it; the rollout log-probs
travel with the samples, so --use-tis can correct for that gap. Weights are pushed only once the in-flight
generation has finished, so no rollout mixes two policies.

Fully async (slime's: --rollout-function-path slime.rollout.fully_async_rollout.generate_rollout_fully_async):
a background worker in the rollout manager generates continuously into a bounded buffer; each step takes
--rollout-batch-size finished groups from it, and weights are pushed while generation goes on (running
requests finish on the old weights, or with --partial-rollout are aborted and continue on the new ones).
Groups more than --max-staleness policy versions behind the trainer are generated again (rollout/fully_async.py).

Both need separate GPUs for trainer and engines: --colocate is rejected (they could not run at the same time).

Usage: python train_async.py [the same flags as train.py]
"""
import sys
import time

from slime_like.ray.entry import launch


def train_async(args, run, logger):
    import ray

    if run.cadence.background:
        return train_fully_async(args, run, logger)
    next_rollout = run.generate(run.start_rollout_id)
    for rollout_id in range(run.start_rollout_id, args.num_rollout):
        t = time.perf_counter()
        shards, metrics = ray.get(next_rollout)
        metrics["time/wait_generate"] = time.perf_counter() - t
        if rollout_id + 1 < args.num_rollout:
            next_rollout = run.generate(rollout_id + 1)  # overlaps the training below
        metrics.update(run.train(rollout_id, shards))
        if run.cadence.save_due(rollout_id):
            run.save(rollout_id)
        if run.cadence.push_due(rollout_id):
            ray.wait([next_rollout])  # never swap weights under a running generation
            metrics.update(run.update_weights(rollout_id))
        if run.cadence.eval_due(rollout_id):
            metrics.update(run.evaluate(rollout_id))
        logger.log(rollout_id, metrics)


def train_fully_async(args, run, logger):
    """The worker generates all along; a step waits only when the buffer holds fewer than a batch."""
    import ray

    for rollout_id in range(run.start_rollout_id, args.num_rollout):
        t = time.perf_counter()
        shards, metrics = ray.get(run.generate(rollout_id))
        metrics["time/wait_generate"] = time.perf_counter() - t
        metrics.update(run.train(rollout_id, shards))
        if run.cadence.save_due(rollout_id):
            run.save(rollout_id)  # the prompts still generating are saved back into the data buffer
        if run.cadence.push_due(rollout_id):
            metrics.update(run.update_weights(rollout_id))  # pauses the worker around the push
        if run.cadence.eval_due(rollout_id):
            metrics.update(run.evaluate(rollout_id))
        logger.log(rollout_id, metrics)


def main(argv=None, prog: str = "train_async.py"):
    return launch(train_async, argv, allow_colocate=False, allow_fully_async=True, prog=prog)


if __name__ == "__main__":
    sys.exit(main())
