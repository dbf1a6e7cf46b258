"""The learning curve of a run: train reward and held-out eval metrics against the rollout id.

    python -m slime_like.utils.plot RUN_DIR [--out PATH]      # RUN_DIR/metrics.jsonl -> RUN_DIR/learning_curve.png
    python -m slime_like.utils.plot --compare LABEL=RUN_DIR ... [--key eval/arith/accuracy] [--line LABEL=VALUE]
        --out PATH                                            # one metric of several runs, on one plot

Plotted: the train reward mean (`rollout/reward`; or `rollout/reward_mean`, slime's `rollout/raw_reward`) as a
faint line with a trailing moving average over it, and every
`eval/<dataset>/accuracy` and `eval/<dataset>/reward` as a line with markers (evals are sparse: one point per
eval interval). The title states the first eval accuracy and the mean of the last three, with their ratio
(utils/run_outcome.py: the one definition the run's summary and the demo's verdict use too).
"""
from __future__ import annotations

import argparse
import os

from slime_like.utils.metrics import read_metrics
from slime_like.utils.run_outcome import eval_change

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


def curve_title(run_dir: str, records: list) -> str:
    """The run's name and its eval change, as the run's summary block and the demo's verdict state it."""
    title = f"Learning curve: {os.path.basename(os.path.abspath(run_dir))}"
    change = eval_change(records)
    return title + (f"\n{change.key}: {change.describe()}" if change is not None and change.tail_n else "")


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
    ax.set_title(curve_title(run_dir, records), fontsize=11)
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


def plot_comparison(runs: dict, key: str, out_path: str, lines: dict | None = None) -> str:
    """One metric (`key`, e.g. eval/arith/accuracy) of several runs {label: run_dir} on one plot, with horizontal
    reference lines {label: value} (e.g. a distillation teacher's accuracy); returns out_path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.6), dpi=120)
    top = max((lines or {0: 0.0}).values())
    for label, run_dir in runs.items():
        xs, ys = _series(read_metrics(run_dir), key)
        if not xs:
            raise ValueError(f"{run_dir}: metrics.jsonl has no {key}")
        ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.6, label=f"{label} ({ys[0]:.3f} -> {ys[-1]:.3f})")
        top = max(top, *ys)
    for label, value in (lines or {}).items():
        ax.axhline(value, color="gray", linestyle="--", linewidth=1.2, label=f"{label} ({value:.3f})")
    ax.set_ylim(top=top * 1.08 + 0.01)  # a reference line at the top stays visible
    ax.set_title(key, fontsize=11)
    ax.set_xlabel("rollout id")
    ax.set_ylabel(key.rsplit("/", 1)[-1])
    ax.grid(True, alpha=0.35)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize=8.5)  # below: curves stay visible
    fig.tight_layout()
    fig.savefig(out_path)
    plt.close(fig)
    return out_path


def _pairs(items: list[str], what: str) -> dict:
    pairs = [x.split("=", 1) for x in items]
    bad = [x for x, p in zip(items, pairs) if len(p) != 2 or not p[0]]
    if bad:
        raise SystemExit(f"{what} {bad[0]!r}: expected LABEL=VALUE")
    return dict(pairs)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", nargs="?", help="a run directory containing metrics.jsonl")
    p.add_argument("--out", default=None, help=f"output PNG (default RUN_DIR/{PLOT_FILE}; required with --compare)")
    p.add_argument("--compare", nargs="+", default=None, metavar="LABEL=RUN_DIR", help="plot one metric of these runs")
    p.add_argument("--key", default="eval/arith/accuracy", help="the metric --compare plots")
    p.add_argument("--line", nargs="*", default=[], metavar="LABEL=VALUE",
                   help="--compare: horizontal reference lines")
    a = p.parse_args(argv)
    if a.compare:
        if a.run_dir or not a.out:
            p.error("--compare takes LABEL=RUN_DIR pairs instead of RUN_DIR, and needs --out")
        lines = {k: float(v) for k, v in _pairs(a.line, "--line").items()}
        print(plot_comparison(_pairs(a.compare, "--compare"), a.key, a.out, lines))
    elif a.run_dir:
        print(plot_learning_curve(a.run_dir, a.out))
    else:
        p.error("give RUN_DIR, or --compare LABEL=RUN_DIR ... --out PATH")


if __name__ == "__main__":
    main()
