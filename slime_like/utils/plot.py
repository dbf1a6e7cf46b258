"""The learning curve of a run: train reward and held-out eval metrics against the rollout id.

    python -m slime_like.utils.plot RUN_DIR [--out PATH]      # RUN_DIR/metrics.jsonl -> RUN_DIR/learning_curve.png

Plotted: the train reward mean (`rollout/reward`; or `rollout/reward_mean`, slime's `rollout/raw_reward`) as a
faint line with a trailing moving average over it, and every
`eval/<dataset>/accuracy` and `eval/<dataset>/reward` as a line with markers (evals are sparse: one point per
eval interval). The title states the first and last value of the first eval accuracy, which is the demo's
headline (did RL raise held-out accuracy from where it started?).
"""
from __future__ import annotations

import argparse
import os

from slime_like.utils.metrics import read_metrics

PLOT_FILE = "learning_curve.png"
TRAIN_REWARD_KEYS = ("rollout/reward", "rollout/reward_mean", "rollout/raw_reward")  # ours, then other spellings


def _series(records, key):
    points = [(r["rollout_id"], r[key]) for r in records if r.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def curve_keys(records) -> tuple[str | None, list[str]]:
    """(the train reward key present, sorted eval accuracy / reward keys present)."""
    keys = set().union(*(r.keys() for r in records)) if records else set()
    train = next((k for k in TRAIN_REWARD_KEYS if k in keys), None)
    evals = sorted(k for k in keys if k.startswith("eval/") and k.rsplit("/", 1)[-1] in ("accuracy", "reward"))
    return train, evals


def eval_series(records, eval_keys) -> list[tuple[str, list, list]]:
    """(label, xs, ys) per eval curve; a reward identical to its dataset's accuracy (0/1 rewards) is drawn once."""
    out = []
    for key in eval_keys:
        xs, ys = _series(records, key)
        kind = key.rsplit("/", 1)[-1]
        twin = key[:-len(kind)] + ("accuracy" if kind == "reward" else "reward")
        same = twin in eval_keys and _series(records, twin) == (xs, ys)
        if kind == "reward" and same:
            continue
        out.append((f"{key} (= reward)" if same else key, xs, ys))
    return out


def plot_learning_curve(run_dir: str, out_path: str | None = None) -> str:
    """Write the PNG for RUN_DIR's metrics.jsonl and return its path."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers or in CI
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    records = read_metrics(run_dir)
    train_key, eval_keys = curve_keys(records)
    if train_key is None and not eval_keys:
        raise ValueError(f"{run_dir}: metrics.jsonl has no {' / '.join(TRAIN_REWARD_KEYS)} and no eval/*/accuracy "
                         f"or eval/*/reward keys; nothing to plot")
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=120)
    if train_key:
        xs, ys = _series(records, train_key)
        smooth = len(ys) >= 20  # sampled rewards are noisy: a trailing moving average shows the trend
        ax.plot(xs, ys, color="tab:blue", linewidth=0.8 if smooth else 1.5, alpha=0.35 if smooth else 1.0,
                label=f"train reward mean ({train_key})")
        if smooth:
            window = max(5, len(ys) // 20)
            avg = [sum(ys[max(0, i - window + 1):i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(ys))]
            ax.plot(xs, avg, color="tab:blue", linewidth=1.8, label=f"train reward, mean of last {window}")
    colors = ["tab:red", "tab:green", "tab:purple", "tab:orange", "tab:brown", "tab:olive"]
    for i, (label, xs, ys) in enumerate(eval_series(records, eval_keys)):
        ax.plot(xs, ys, marker="o", markersize=4, linewidth=1.8, color=colors[i % len(colors)], label=label)
    title = f"Learning curve: {os.path.basename(os.path.abspath(run_dir))}"
    acc_keys = [k for k in eval_keys if k.endswith("/accuracy")]
    if acc_keys:
        _, accs = _series(records, acc_keys[0])
        if len(accs) >= 2:
            ratio = f" (last / first eval: {accs[-1] / accs[0]:.2f}x)" if accs[0] > 0 else ""
            title += f"\n{acc_keys[0]}: {accs[0]:.3f} -> {accs[-1]:.3f}{ratio}"
    ax.set_title(title, fontsize=11)
    first_id = records[0]["rollout_id"]
    ax.set_xlabel("rollout id" + (f" ({first_id}: eval before the first update)" if first_id < 0 else ""))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("reward / accuracy")
    ax.grid(True, alpha=0.35)
    ax.legend(loc="best", fontsize=9)
    fig.tight_layout()
    out_path = out_path or os.path.join(run_dir, PLOT_FILE)
    fig.savefig(out_path)
    plt.close(fig)
    return out_path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", help="a run directory containing metrics.jsonl")
    p.add_argument("--out", default=None, help=f"output PNG (default RUN_DIR/{PLOT_FILE})")
    a = p.parse_args(argv)
    print(plot_learning_curve(a.run_dir, a.out))


if __name__ == "__main__":
    main()
