"""Print the demo's outcome from RUN_DIR/metrics.jsonl: held-out accuracy before the first GRPO update
(rollout -1), the last and the best eval after it, and whether RL at least doubled it.

One eval of 200 prompts has a standard error of ~3 points, so "doubled" is judged on the mean of the last
three evals, not on the last one alone.

    python -m slime_like.demo.summary RUN_DIR [EVAL_NAME]     (EVAL_NAME: the --eval-prompt-data name, default arith;
                                                             runs from an RLinf / ROLL file name it val)
"""
import os
import sys

from slime_like.utils.metrics import read_metrics

KEY = "eval/arith/accuracy"


def summarize(run_dir: str, name: str = "arith") -> dict:
    key = KEY.replace("arith", name)
    rows = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    evals = [(r["rollout_id"], r[key]) for r in rows if r.get(key) is not None]
    if not evals or evals[0][0] != -1:
        raise SystemExit(f"{run_dir}/metrics.jsonl has no {key} before the first update (rollout -1)")
    base = evals[0][1]
    last_id, last = evals[-1]
    best_id, best = max(evals[1:] or evals[:1], key=lambda e: e[1])
    tail = [a for _, a in evals[1:][-3:]] or [base]
    tail_mean = sum(tail) / len(tail)
    rollouts = [r for r in rows if r["rollout_id"] >= 0]
    seconds = sum(r.get(k, 0.0) or 0.0 for r in rollouts for k in r if k.startswith("time/")) + rows[0].get("time/eval", 0)
    return dict(base=base, last=last, last_id=last_id, best=best, best_id=best_id, rollouts=len(rollouts),
                loop_seconds=seconds, tail_mean=tail_mean, tail_n=len(tail), doubled=tail_mean >= 2 * base)


def main(argv=None):
    argv = argv or sys.argv[1:] or ["runs/demo"]
    run_dir = argv[0]
    s = summarize(run_dir, *argv[1:2])
    ratio = s["tail_mean"] / s["base"] if s["base"] else float("inf")
    print(f"\ndemo summary ({run_dir})\n"
          f"  held-out greedy accuracy before GRPO : {s['base']:.3f}\n"
          f"  after {s['rollouts']} GRPO rollouts        : {s['tail_mean']:.3f} (mean of the last {s['tail_n']} evals: "
          f"{ratio:.2f}x the accuracy before GRPO); last {s['last']:.3f}, best {s['best']:.3f} after rollout {s['best_id']}\n"
          f"  time in the loop's stages           : {s['loop_seconds']:.0f} s\n"
          f"  RL {'doubled' if s['doubled'] else 'did NOT double'} the held-out accuracy\n"
          f"  curve: {os.path.join(run_dir, 'learning_curve.png')}   metrics: {os.path.join(run_dir, 'metrics.jsonl')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
