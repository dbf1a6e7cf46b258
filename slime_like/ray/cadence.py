"""When the training loops save, push weights and evaluate, and whether generation runs in the background: the one
owner of each rule that train.py's and train_async.py's loops follow (`run.cadence`).

    save     every --save-interval rollouts, at the end of each --num-epoch pass, and after the last rollout
             (slime's should_run_periodic_action), so a finished run's final weights are always saved
    push     every --update-weights-interval rollouts (the engines generate with older weights in between;
             --keep-old-actor scores with those)
    eval     every --eval-interval rollouts and at the end of each --num-epoch pass (slime's rule for eval)
    background  the rollout function is slime's fully async one: a worker generates all along, the loop only takes
             batches from it and pushes while it runs (rollout/fully_async.py); read here once for the run
"""
from __future__ import annotations

from slime_like.config.slime_paths import is_fully_async


class Cadence:
    def __init__(self, args):
        self.save_interval, self.eval_interval = args.save_interval, args.eval_interval
        self.push_interval = int(args.update_weights_interval)
        self.num_rollout = args.num_rollout
        self.per_epoch = args.num_rollout_per_epoch  # set when --num-epoch derived --num-rollout
        self.background = is_fully_async(args)

    def save_due(self, rollout_id: int) -> bool:
        """Nothing without --save-interval."""
        return self._periodic(rollout_id, self.save_interval) or \
            (bool(self.save_interval) and rollout_id + 1 == self.num_rollout)

    def push_due(self, rollout_id: int) -> bool:
        return (rollout_id + 1) % self.push_interval == 0

    def eval_due(self, rollout_id: int) -> bool:
        return self._periodic(rollout_id, self.eval_interval)

    def _periodic(self, rollout_id: int, interval) -> bool:
        return bool(interval) and ((rollout_id + 1) % interval == 0
                                   or bool(self.per_epoch) and (rollout_id + 1) % self.per_epoch == 0)
