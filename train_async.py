"""One-step-off pipelined RL: the engines generate rollout N+1 while the trainer trains on rollout N.

The policy that generated rollout N+1 is therefore one update behind the one that trains on it; the
rollout log-probs travel with the samples, so --use-tis can correct for that gap. Weights are pushed only
once the in-flight generation has finished, so no rollout mixes two policies. Needs separate GPUs for
trainer and engines: --colocate is rejected (they could not run at the same time).

Usage: python train_async.py [the same flags as train.py]
"""
import sys

from slime_like.args import parse_args


def train_async(args, plan):
    import ray

    from slime_like.ray.run import Run
    from slime_like.utils.metrics import MetricsLogger

    run = Run.start(args, plan)
    logger = MetricsLogger(args)
    try:
        run.update_weights()
        if args.eval_interval and run.start_rollout_id == 0 and not args.skip_eval_before_train:
            logger.log(run.start_rollout_id - 1, run.evaluate(0))
        next_rollout = run.generate(run.start_rollout_id)
        for rollout_id in range(run.start_rollout_id, args.num_rollout):
            shards, metrics = ray.get(next_rollout)
            if rollout_id + 1 < args.num_rollout:
                next_rollout = run.generate(rollout_id + 1)  # overlaps the training below
            metrics.update(run.train(rollout_id, shards))
            if args.save_interval and (rollout_id + 1) % args.save_interval == 0:
                run.save(rollout_id)
            if (rollout_id + 1) % args.update_weights_interval == 0:
                ray.wait([next_rollout])  # never swap weights under a running generation
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

    if args.colocate:
        print("train_async.py: --colocate is not supported: generation of the next rollout runs while the "
              "trainer trains, so they need separate GPUs. Drop --colocate or use train.py.", file=sys.stderr)
        return 2
    if args.dry_run:
        print_dry_run(args)
        return 0
    from slime_like.ray.signals import exit_cleanly_on_sigterm

    exit_cleanly_on_sigterm()
    train_async(args, build_plan(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
