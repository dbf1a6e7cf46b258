"""Synchronous RL post-training, in slime's order:

    generate -> (offload engines) -> critic values / actor log-probs -> advantages -> train
    -> save every --save-interval and after the last rollout -> (onload engines) -> push weights -> eval every --eval-interval

Usage: python train.py [Megatron / slime flags ...]   (python train.py --dry-run ... checks and plans only)
"""
import sys
import time

from slime_like.ray.entry import launch


def train(args, run, logger):
    import ray

    for rollout_id in range(run.start_rollout_id, args.num_rollout):
        t = time.perf_counter()
        shards, metrics = ray.get(run.generate(rollout_id))
        metrics["time/generate"] = time.perf_counter() - t
        run.offload_engines()
        run.onload_trainers()
        metrics.update(run.train(rollout_id, shards))
        if run.cadence.save_due(rollout_id):
            run.save(rollout_id)
        run.offload_trainers()
        run.onload_engines()
        if run.cadence.push_due(rollout_id):
            metrics.update(run.update_weights(rollout_id))
        if run.cadence.eval_due(rollout_id):
            metrics.update(run.evaluate(rollout_id))
        logger.log(rollout_id, metrics)


def main(argv=None, prog: str = "train.py"):
    return launch(train, argv, prog=prog)


if __name__ == "__main__":
    sys.exit(main())
