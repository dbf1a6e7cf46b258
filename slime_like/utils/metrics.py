"""Per-rollout metrics: a JSONL file in the run directory, one console line, and optionally wandb / TensorBoard.

    logger = MetricsLogger(args)                  # opens <run_dir>/metrics.jsonl for appending
    logger.log(rollout_id, {"rollout/reward_mean": 0.4, "actor/loss": 0.01, "time/generate": 1.2})
    logger.close()

The JSONL file is the record that tools, tests and `python -m slime_like.utils.plot` read: one JSON object per
`log()` call, `rollout_id` first, then flat keys `<section>/<name>`. Each line is flushed as it is written, so a
crash keeps everything logged before it; a resumed run appends to the same file. A rollout may be logged in
more than one line (e.g. the eval taken before the first update, then the training metrics): `read_metrics`
merges lines per rollout_id, later values winning, which also makes a resumed run's numbers replace the ones
a crashed run logged after its last checkpoint.

Key names the console line knows (CONSOLE_COLUMNS; any other key is still written to the file and the trackers):
  rollout/reward, rollout/response_len/mean, rollout/truncated_ratio, rollout/tokens_per_s,
  actor/loss, actor/kl_loss, actor/entropy, actor/clipfrac, actor/grad_norm, actor/lr, critic/loss, critic/lr,
  time/<stage> (generate, log_probs, train, update_weights, eval, save, ...),
  eval/<dataset>/accuracy and eval/<dataset>/reward.
Nested dicts are flattened with "/" ({"eval": {"gsm8k": {"accuracy": 0.5}}} -> "eval/gsm8k/accuracy").
Non-finite floats are written as null (strict JSON that jq and other tools read) and print as "nan".
"""
from __future__ import annotations

import json
import math
import os
import secrets
import sys
from typing import Any, Mapping

METRICS_FILE = "metrics.jsonl"

# (label, keys tried in order, format): the fixed order of the console line. Several names per column: the
# first is what this package's loop logs (rollout/controller.py, the Megatron trainer prefixed by its role),
# the others are slime's and the brief's spellings, so a metrics dict in either style prints.
CONSOLE_COLUMNS = [
    ("reward", ("rollout/reward", "rollout/reward_mean", "rollout/raw_reward"), ".3f"),
    ("len", ("rollout/response_len/mean", "rollout/response_len_mean", "rollout/response_lengths"), ".1f"),
    ("trunc", ("rollout/truncated_ratio", "rollout/truncated"), ".2f"),
    ("loss", ("actor/loss", "actor/pg_loss"), ".4f"),
    ("kl", ("actor/kl_loss", "actor/kl", "actor/approx_kl", "actor/ppo_kl"), ".4f"),
    ("opd_kl", ("actor/opd_reverse_kl",), ".4f"),  # --use-opd: the reverse KL to the teacher
    ("entropy", ("actor/entropy", "actor/entropy_loss"), ".3f"),
    ("clipfrac", ("actor/clipfrac", "actor/pg_clipfrac"), ".3f"),
    ("grad_norm", ("actor/grad_norm",), ".3f"),
    ("lr", ("actor/lr",), ".2e"),
    ("v_loss", ("critic/loss", "critic/value_loss"), ".4f"),
    ("v_lr", ("critic/lr",), ".2e"),
    ("tok/s", ("rollout/tokens_per_s", "perf/tokens_per_s"), ".0f"),
]
# Pipeline order of the loop's stages; other time/* keys follow alphabetically.
TIME_ORDER = ("generate", "log_probs", "train", "update_weights", "eval", "save")


def flatten_metrics(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, float | None]:
    """Flat {"a/b": number} from nested dicts; tensors / numpy scalars become floats; NaN / inf become None."""
    out: dict[str, float | None] = {}
    for key, value in metrics.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"metric keys must be non-empty strings, got {key!r} (under {prefix or 'the top level'!r})")
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_metrics(value, prefix=name + "/"))
            continue
        if hasattr(value, "item"):  # torch tensor or numpy scalar with one element
            value = value.item()
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"metric {name!r} must be a number, got {type(value).__name__} {value!r}")
        out[name] = float(value) if math.isfinite(value) else None
    return out


def format_console_line(rollout_id: int, metrics: Mapping[str, float | None]) -> str:
    """One compact line: fixed columns that are present, then timings, then every eval/* metric."""
    def fmt(value, spec):
        return "nan" if value is None else format(value, spec)

    parts = [f"rollout {rollout_id}"]
    for label, keys, spec in CONSOLE_COLUMNS:
        key = next((k for k in keys if k in metrics), None)
        if key is not None:
            parts.append(f"{label} {fmt(metrics[key], spec)}")
    times = {k[len("time/"):]: v for k, v in metrics.items() if k.startswith("time/")}
    if times:
        order = [n for n in TIME_ORDER if n in times] + sorted(n for n in times if n not in TIME_ORDER)
        parts.append("time " + " ".join(f"{n} {fmt(times[n], '.2f')}s" for n in order))
    # eval: accuracy and reward per dataset (pass@k, lengths... are in the file); all eval keys if neither exists
    evals = sorted(k for k in metrics if k.startswith("eval/"))
    for key in [k for k in evals if k.rsplit("/", 1)[-1] in ("accuracy", "reward")] or evals:
        parts.append(f"{key} {fmt(metrics[key], '.3f')}")
    return " | ".join(parts)


def read_metrics(path: str) -> list[dict]:
    """The records of a metrics.jsonl (or its run dir), merged per rollout_id (later lines win), sorted by it."""
    if os.path.isdir(path):
        path = os.path.join(path, METRICS_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no metrics file at {path}: a run writes it to <--run-dir>/{METRICS_FILE}")
    merged: dict[int, dict] = {}
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                rollout_id = int(record["rollout_id"])
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{lineno}: not a metrics record ({e}): {line[:120]!r}") from e
            merged.setdefault(rollout_id, {}).update(record)
    return [merged[k] for k in sorted(merged)]


class MetricsLogger:
    """Writes each rollout's metrics to <run_dir>/metrics.jsonl, one console line, and the optional trackers.

    Flags read from args (names as slime's): run_dir, use_wandb, wandb_project, wandb_group, wandb_team,
    wandb_mode, wandb_dir, wandb_key, wandb_host, wandb_run_id, wandb_random_suffix, use_tensorboard,
    tensorboard_dir, tb_project_name, tb_experiment_name. A tracker that was asked for but is not installed
    fails here, before any work starts. The console line is printed for every rollout (`--log-interval` keeps
    Megatron's meaning: the trainer's per-optimizer-step log).
    """

    def __init__(self, args, stream=None):
        run_dir = args.run_dir
        if not run_dir:
            raise ValueError("MetricsLogger needs --run-dir (the directory that gets metrics.jsonl); got none")
        self.run_dir = run_dir
        self.stream = stream if stream is not None else sys.stdout
        os.makedirs(run_dir, exist_ok=True)
        self.path = os.path.join(run_dir, METRICS_FILE)
        # Trackers first: a missing package must fail before the file is touched.
        self._wandb = self._start_wandb(args) if args.use_wandb else None
        self._tb = self._start_tensorboard(args) if args.use_tensorboard else None
        self._drop_partial_last_line()
        self._file = open(self.path, "a")

    # ---- trackers -------------------------------------------------------------------------------------------
    def _start_wandb(self, args):
        try:
            import wandb
        except ImportError as e:
            raise ImportError("--use-wandb needs the wandb package, which is not installed: "
                              "pip install wandb  (or pip install 'slime_like[wandb]'), or drop --use-wandb") from e
        mode = args.wandb_mode or os.environ.get("WANDB_MODE") or "online"
        if mode not in ("online", "offline", "disabled"):
            raise ValueError(f"--wandb-mode {mode!r} must be online, offline or disabled")
        wandb_dir = args.wandb_dir or os.path.join(self.run_dir, "wandb")
        os.makedirs(wandb_dir, exist_ok=True)
        key, host = args.wandb_key, args.wandb_host
        if mode == "online" and (key or host):
            wandb.login(key=key, host=host)
        group = args.wandb_group
        name = group
        if group and args.wandb_random_suffix:
            name = f"{group}_{secrets.token_hex(3)}"  # several runs of one group stay apart
        config = {k: v for k, v in vars(args).items() if isinstance(v, (str, int, float, bool, list, tuple, type(None)))
                  and k not in ("wandb_key", "engine_api_key")}  # never upload a secret
        run_id = args.wandb_run_id
        run = wandb.init(project=args.wandb_project or "slime_like", entity=args.wandb_team,
                         group=group, name=name, mode=mode, dir=wandb_dir, config=config, id=run_id,
                         resume="allow" if run_id else None)
        # Plot every metric against rollout_id, so a resumed run continues the same x axis.
        run.define_metric("rollout_id")
        run.define_metric("*", step_metric="rollout_id")
        return run

    def _start_tensorboard(self, args):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ImportError("--use-tensorboard needs the tensorboard package: pip install tensorboard "
                              "(or pip install 'slime_like[tensorboard]'), or drop --use-tensorboard") from e
        log_dir = args.tensorboard_dir or os.path.join(self.run_dir, "tensorboard")
        # slime's --tb-project-name / --tb-experiment-name name sub-directories, so runs can share one dir
        for part in (args.tb_project_name, args.tb_experiment_name):
            if part:
                log_dir = os.path.join(log_dir, part)
        return SummaryWriter(log_dir=log_dir)

    # ---- logging --------------------------------------------------------------------------------------------
    def _drop_partial_last_line(self):
        """A crash in the middle of a write leaves a line without its newline; cut it so appends stay valid JSONL."""
        if not os.path.exists(self.path) or os.path.getsize(self.path) == 0:
            return
        with open(self.path, "rb+") as f:
            data = f.read()
            if data.endswith(b"\n"):
                return
            keep = data.rfind(b"\n") + 1
            print(f"metrics: dropping an unfinished last line of {self.path}: {data[keep:keep + 80]!r}",
                  file=sys.stderr)
            f.truncate(keep)

    def log(self, rollout_id: int, metrics: Mapping[str, Any]) -> dict:
        """Write one record to the file, the console and the trackers; return it."""
        if isinstance(rollout_id, bool) or not isinstance(rollout_id, int):
            raise TypeError(f"rollout_id must be an int, got {rollout_id!r}")
        flat = flatten_metrics(metrics)
        if "rollout_id" in flat:
            raise ValueError("pass rollout_id as the first argument of log(), not as a metric key")
        record = {"rollout_id": rollout_id, **flat}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        print(format_console_line(rollout_id, flat), file=self.stream, flush=True)
        finite = {k: v for k, v in flat.items() if v is not None}
        if self._wandb is not None:
            self._wandb.log({"rollout_id": rollout_id, **finite})
        if self._tb is not None:
            for key, value in finite.items():
                self._tb.add_scalar(key, value, global_step=rollout_id)
            self._tb.flush()
        return record

    def close(self):
        if self._file is not None and not self._file.closed:
            self._file.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
