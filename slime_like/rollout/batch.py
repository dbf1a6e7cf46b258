"""One rollout's samples -> the trainer's columnar batch (docs/architecture.md), and its DP split.

``rewards`` holds the estimator's rollout-side group step (`EstimatorSpec.group_step`, algorithms/estimators.py:
GRPO / GSPO normalise within the group, REINFORCE++-baseline subtracts the group mean, PPO / REINFORCE++ keep
the raw reward). With --disable-rewards-normalization the raw rewards are passed for every estimator.
"""
from __future__ import annotations

import math

from ..sample import Status
from .rewards import scalar_reward

BATCH_KEYS = ("tokens", "response_lengths", "loss_masks", "rewards", "raw_rewards", "rollout_log_probs",
              "sample_indices", "truncated")


def _groups_in_order(samples):
    groups: dict[int, list] = {}
    for s in samples:
        groups.setdefault(s.group_index, []).append(s)
    return list(groups.values())


def group_step(args, raw_rewards: list[float], group_size: int) -> list[float]:
    """The estimator's rollout-side step over one prompt's group of rewards."""
    from ..algorithms import get_estimator

    if not args.rewards_normalization:
        return list(raw_rewards)
    step = get_estimator(args.advantage_estimator).group_step
    return step(raw_rewards, group_size, normalize_std=args.grpo_std_normalization).tolist()


def _rewards(args, groups) -> tuple[list[float], list[float]]:
    """(raw, after the group step), flat in group order. ``--custom-reward-post-process-path``
    replaces the whole step with slime's hook ``f(args, samples) -> (raw_rewards, rewards)``."""
    path = args.custom_reward_post_process_path
    if path:
        from .hooks import load_function

        flat = [s for g in groups for s in g]
        raw, shaped = load_function(path, "--custom-reward-post-process-path")(args, flat)
        if not (len(raw) == len(shaped) == len(flat)):
            raise ValueError(f"--custom-reward-post-process-path {path} returned {len(raw)} raw / {len(shaped)} "
                             f"rewards for {len(flat)} samples")
        return [float(r) for r in raw], [float(r) for r in shaped]
    raw, shaped = [], []
    scale = args.reward_scale
    for group in groups:
        r = [scalar_reward(args, s.reward) for s in group]
        raw += r
        if scale is not None:  # RLinf reward_scale: correct +S, wrong -S (a 0/1 reward); raw stays for the logs
            r = [scale * (2.0 * x - 1.0) for x in r]
        shaped += group_step(args, r, len(group))
    return raw, shaped


def _check_finite(groups, raw: list[float], shaped: list[float]) -> None:
    """Last guard before the trainer: a NaN/inf here (a custom rollout function or reward post-process that
    bypassed the reward checks) would turn the loss and then every weight NaN."""
    flat = [s for g in groups for s in g]
    for s, r, a in zip(flat, raw, shaped):
        if not (math.isfinite(r) and math.isfinite(a)):
            # --on-nonfinite-reward acts where rewards are assigned; values that reach here bypassed that check
            cause = ("the reward itself is not finite" if not math.isfinite(r) else
                     "the group's advantage arithmetic overflowed (rewards beyond about 1e19 in float32)")
            raise ValueError(f"sample {s.index} (prompt index {s.group_index}) reaches training with reward {r} / "
                             f"advantage {a}: {cause}; non-finite values are never trained on. Scale the rewards "
                             f"returned by the custom rollout function or --custom-reward-post-process-path")


REQUIRED_KEYS = ("tokens", "response_lengths", "loss_masks", "rewards")


def custom_train_batch(args, samples, path: str) -> dict:
    """slime's ``--custom-convert-samples-to-train-data-path``: ``fn(args, samples) -> dict`` of per-sample
    lists replaces ``to_train_batch``. Needs tokens, response_lengths, loss_masks and rewards (the group step
    already applied, as in our own batch); slime's ``raw_reward`` is accepted for ``raw_rewards``; missing
    raw_rewards / sample_indices / truncated / rollout_log_probs are filled (rewards, 0.., 0, none)."""
    from .hooks import load_hook

    fn = load_hook(path, "--custom-convert-samples-to-train-data-path", "fn(args, samples)", "args", "samples")
    data = fn(args, samples)
    flag = f"--custom-convert-samples-to-train-data-path {path}"
    if not isinstance(data, dict):
        raise TypeError(f"{flag} returned {type(data).__name__}; expected a dict of per-sample lists")
    data = dict(data)
    if "raw_rewards" not in data and "raw_reward" in data:
        data["raw_rewards"] = data.pop("raw_reward")
    missing = [k for k in REQUIRED_KEYS if k not in data]
    if missing:
        raise ValueError(f"{flag} returned no {missing} (keys: {sorted(data)})")
    n = len(data["tokens"])
    data.setdefault("raw_rewards", list(data["rewards"]))
    data.setdefault("sample_indices", list(range(n)))
    data.setdefault("truncated", [0] * n)
    data.setdefault("rollout_log_probs", [[] for _ in range(n)])
    bad = {k: len(v) for k, v in data.items() if not isinstance(v, (list, tuple)) or len(v) != n}
    if bad:
        raise ValueError(f"{flag}: every value must be a list with one entry per sample ({n}); got {bad}")
    nonfinite = [i for i, r in enumerate(data["rewards"]) if not math.isfinite(float(r))]
    if nonfinite:  # the same last guard as _check_finite: a NaN reward would make every weight NaN
        raise ValueError(f"{flag}: rewards of samples {nonfinite[:5]} are not finite; non-finite values are never "
                         "trained on")
    return {k: list(v) for k, v in data.items()}


def to_train_batch(args, samples) -> dict:
    """Columnar dict, one entry per sample, groups kept contiguous (group order = first appearance).

    A sample marked ``remove_sample = True`` (by ``--rollout-sample-filter-path``, as in slime) stays in
    the batch with an all-zero loss mask, so group statistics are unchanged but it is not trained on.
    """
    path = args.custom_convert_samples_to_train_data_path
    if path:
        return custom_train_batch(args, samples, path)
    batch = {k: [] for k in BATCH_KEYS}
    groups = _groups_in_order(samples)
    raw_all, shaped_all = _rewards(args, groups)
    _check_finite(groups, raw_all, shaped_all)
    flat = [s for g in groups for s in g]
    with_lp = _has_rollout_log_probs(args, flat)
    for s, r, adv in zip(flat, raw_all, shaped_all):
        lp = len(s.rollout_log_probs) if with_lp else s.response_length
        if not (len(s.loss_mask) == lp == s.response_length):
            raise ValueError(f"sample {s.index} (prompt {s.group_index}): response_length "
                             f"{s.response_length}, loss_mask {len(s.loss_mask)}, rollout_log_probs "
                             f"{len(s.rollout_log_probs or ())} must be equal")
        batch["tokens"].append(list(s.tokens))
        batch["response_lengths"].append(s.response_length)
        batch["loss_masks"].append([0] * s.response_length if s.remove_sample
                                   else list(s.loss_mask))
        batch["rewards"].append(float(adv))
        batch["raw_rewards"].append(float(r))
        if with_lp:
            batch["rollout_log_probs"].append(list(s.rollout_log_probs))
        batch["sample_indices"].append(s.index)
        batch["truncated"].append(int(s.status == Status.TRUNCATED))
    if not with_lp:
        del batch["rollout_log_probs"]
    _teacher_column(batch, flat)
    _multimodal_column(batch, flat)
    if args.use_rollout_routing_replay:   # the trainer replays the engine's routing (megatron/routing_replay.py)
        batch["rollout_routed_experts"] = [s.rollout_routed_experts for s in flat]
    if args.keep_old_actor:  # the trainer scores each sample with the weights that wrote it
        batch["weight_versions"] = [_oldest_version(s) for s in flat]
    return batch


def _has_rollout_log_probs(args, samples) -> bool:
    """Whether the batch carries the engine's log-probs. A custom generate function may return none (slime's
    tau-bench asks the engine for text only): as in slime the column is then left out, and the trainer scores the
    samples itself; a batch where only some samples have them, or a flag that reads them, is an error."""
    missing = [s for s in samples if not s.rollout_log_probs]
    if not missing:
        return True
    if len(missing) < len(samples):
        s = missing[0]
        raise ValueError(f"sample {s.index} (prompt {s.group_index}) has no rollout_log_probs while other samples of "
                         "the batch do: a custom generate function must return the engine's log-probs for all or none")
    needing = [f for f, on in (("--use-tis", args.use_tis), ("--use-rollout-logprobs", args.use_rollout_logprobs),
                               ("--get-mismatch-metrics", args.get_mismatch_metrics)) if on]
    if needing:
        raise ValueError(f"{' / '.join(needing)} read the engine's log-probs, but the samples have no "
                         "rollout_log_probs (the generate function did not ask for return_logprob)")
    return False


def _oldest_version(sample) -> int | None:
    """The oldest integer weight version among the engine answers that wrote this sample (None: not reported)."""
    versions = [int(v) for v in sample.weight_versions if str(v).lstrip("-").isdigit()]
    return min(versions) if versions else None


def _multimodal_column(batch: dict, samples) -> None:
    """Vision-language samples: each one's processor output ({"pixel_values", "image_grid_thw"} tensors; None for
    a text sample), computed once in the rollout process; the column is absent when no sample has an image."""
    if any(s.multimodal_train_inputs for s in samples):
        batch["multimodal_train_inputs"] = [s.multimodal_train_inputs or None for s in samples]


def _teacher_column(batch: dict, samples) -> None:
    """--opd-type sglang: the teacher's per-token log-probs the rollout attached (all samples or none)."""
    have = [s.teacher_log_probs is not None for s in samples]
    if not any(have):
        return
    column = []
    for s in samples:
        lp = s.teacher_log_probs
        if lp is None or len(lp) != s.response_length:
            raise ValueError(f"sample {s.index} (prompt {s.group_index}): teacher_log_probs has "
                             f"{'none' if lp is None else len(lp)} entries, expected the response length "
                             f"{s.response_length} (the teacher must score every response token of every sample)")
        column.append([float(x) for x in lp])
    batch["teacher_log_probs"] = column


def _balanced_assignment(lengths: list[int], dp_size: int) -> list[list[int]]:
    """Equal sample counts per rank, token totals balanced greedily (longest first to the lightest
    rank that still has room): within max(length) of optimal, good enough against stragglers."""
    per_rank = len(lengths) // dp_size
    loads, ranks = [0] * dp_size, [[] for _ in range(dp_size)]
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        r = min((r for r in range(dp_size) if len(ranks[r]) < per_rank), key=lambda r: loads[r])
        ranks[r].append(i)
        loads[r] += lengths[i]
    return [sorted(r) for r in ranks]


def split_for_dp(batch: dict, dp_size: int, balance: bool = False) -> list[dict]:
    """One dict per data-parallel rank, whole samples each: strided (rank r gets r, r+D, ...) like slime,
    or with ``balance=True`` (--balance-data) token-balanced."""
    n = len(batch["tokens"])
    if dp_size < 1 or n % dp_size:
        raise ValueError(f"the rollout has {n} samples, which does not split evenly over {dp_size} data-parallel "
                         f"ranks; make --rollout-batch-size x --n-samples-per-prompt a multiple of the DP size (a "
                         f"custom generate function that returns several samples per prompt must keep the rollout's "
                         f"total a multiple of it too)")
    if balance:
        assignment = _balanced_assignment([len(t) for t in batch["tokens"]], dp_size)
    else:
        assignment = [list(range(r, n, dp_size)) for r in range(dp_size)]
    return [{k: [v[i] for i in idx] for k, v in batch.items()} for idx in assignment]
