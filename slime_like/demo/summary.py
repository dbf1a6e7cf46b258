"""The demo's verdict from RUN_DIR/metrics.jsonl: did GRPO at least double the held-out accuracy it started from?

"Doubled" is judged on utils/run_outcome.py's change (the mean of the last three evals over the eval before the
first update), the same number the run's summary block and the learning curve's title show.

    python -m slime_like.demo.summary RUN_DIR [EVAL_NAME]     (EVAL_NAME: the --eval-prompt-data name, default arith;
                                                             runs from an RLinf / ROLL file name it val)
"""
import sys

from slime_like.utils.metrics import read_metrics
from slime_like.utils.run_outcome import eval_change

KEY = "eval/{}/accuracy"


def verdict(run_dir: str, name: str = "arith") -> str:
    """One line: the change of the held-out accuracy and whether it at least doubled."""
    key = KEY.format(name)
    change = eval_change(read_metrics(run_dir), key)
    if change is None or change.first_id != -1:
        raise SystemExit(f"{run_dir}/metrics.jsonl has no {key} before the first update (rollout -1)")
    if not change.tail_n:
        return (f"[demo] only the eval before the first update ran ({change.first:.3f}): run more rollouts than "
                "--eval-interval (10) to see what RL changed")
    doubled = change.ratio is not None and change.ratio >= 2
    return (f"[demo] RL {'doubled' if doubled else 'did NOT double'} the held-out accuracy: {change.describe()}; "
            f"best {change.best:.3f} after rollout {change.best_id}")


def main(argv=None):
    argv = argv or sys.argv[1:] or ["runs/demo"]
    print(verdict(argv[0], *argv[1:2]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
