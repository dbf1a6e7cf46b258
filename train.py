"""Synchronous RL post-training, in slime's order:

    generate -> (offload engines) -> critic values / actor log-probs -> advantages -> train
    -> save every --save-interval -> (onload engines) -> push weights -> eval every --eval-interval

Usage: python train.py [Megatron / slime flags ...]   (python train.py --dry-run ... checks and plans only)
"""
import sys
import time

from slime_like.args import parse_args


def train(args, plan):
    import ray

    from slime_like.ray.run import Run
    from slime_like.utils.metrics import MetricsLogger

    run = Run.start(args, plan)
    logger = MetricsLogger(args)
    try:
        run.update_weights()  # engines start from exactly the weights the trainer holds (resume included)
        if args.eval_interval and run.start_rollout_id == 0 and not args.skip_eval_before_train:
            logger.log(run.start_rollout_id - 1, run.evaluate(0))  # the baseline (rollout_id -1): before any RL update
        for rollout_id in range(run.start_rollout_id, args.num_rollout):
            metrics = {}
            t = time.perf_counter()
            shards, rollout_metrics = ray.get(run.generate(rollout_id))
            metrics.update(rollout_metrics, **{"time/generate": time.perf_counter() - t})
            run.offload_engines()
            run.onload_trainers()
            metrics.update(run.train(rollout_id, shards))
            if args.save_interval and (rollout_id + 1) % args.save_interval == 0:
                run.save(rollout_id)
            run.offload_trainers()
            run.onload_engines()
            if (rollout_id + 1) % args.update_weights_interval == 0:
                metrics.update(run.update_weights())
            if args.eval_interval and (rollout_id + 1) % args.eval_interval == 0:
                metrics.update(run.evaluate(rollout_id))
            logger.log(rollout_id, metrics)
    finally:
        logger.close()
        run.shutdown()


def main(argv=None):
    args = parse_args(argv)
    from slime_like.plan import build_plan, print_dry_run

    if args.dry_run:
        print_dry_run(args)
        return 0
    from slime_like.ray.signals import exit_cleanly_on_sigterm

    exit_cleanly_on_sigterm()
    train(args, build_plan(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
