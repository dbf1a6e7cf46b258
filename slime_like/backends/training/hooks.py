"""slime's trainer-side hooks: each a ``--*-path`` to ``module.function``, imported and signature-checked
when the trainer starts (a wrong path or signature fails before any step, naming the flag).

Every trainer backend loads them (`TrainerHooks`). The advantage function and the rollout-data post-process see
only args and the batch, so RLTrainerBase calls them for every backend; the --custom-megatron-* hooks receive
megatron-core model chunks and the loss hooks speak mcore's loss units, so only the Megatron trainer calls those
(--train-backend fsdp refuses them at launch, config/trainer_fsdp.py).

    --custom-megatron-init-path                  init(args)                       after distributed init
    --custom-megatron-before-log-prob-hook-path  hook(args, model, store_prefix)  before each scoring pass
                                                  (store_prefix "" for the actor's log-probs, "ref_" for the
                                                  reference model's; model: the list of model chunks)
    --custom-megatron-before-train-step-hook-path
                    hook(args, rollout_id, step_id, model, optimizer, opt_param_scheduler)  before each step
    --custom-advantage-function-path             fn(args, rollout_data)  sets rollout_data["advantages"] and
                                                  ["returns"]: one 1-D tensor per sample (response length)
    --custom-tis-function-path  fn(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks,
                                   total_lengths, response_lengths) -> (pg_loss, loss_masks, metrics)
        slime's layout: pg_loss is the micro-batch's per-token policy loss concatenated over its samples'
        responses; the lists hold one 1-D tensor per sample. It replaces the built-in truncated IS
        (called when --use-tis or --get-mismatch-metrics, as in slime). Returned masks may reject tokens
        (rejection sampling): those contribute 0 to the loss (the step's token count is unchanged).
        Metrics: per-token tensors, logged as token means under their own names.
    --rollout-data-postprocess-path  fn(args, rollout_id, rollout_data)  the actor's batch after log-probs
                                      and advantages, before the first optimizer step; edits it in place
    --custom-loss-function-path (--loss-type custom_loss)  fn(args, batch, logits, sum_of_sample_mean)
                                      -> (loss, metrics); --custom-pg-loss-reducer-function-path
                                      factory(total_lengths, response_lengths, loss_masks,
                                      calculate_per_token_loss) -> reducer(pg_loss); backends/training/custom_loss.py
"""
from __future__ import annotations

import torch

from slime_like.config.slime_paths import resolve
from slime_like.utils.user_functions import load_hook

_TIS_KEYWORDS = ("pg_loss", "train_log_probs", "rollout_log_probs", "loss_masks", "total_lengths",
                 "response_lengths")
SPECS = {
    "custom_megatron_init_path": ("init(args)", ("args",), ()),
    "custom_megatron_before_log_prob_hook_path": ("hook(args, model, store_prefix)",
                                                  ("args", "model", "store_prefix"), ()),
    "custom_megatron_before_train_step_hook_path": (
        "hook(args, rollout_id, step_id, model, optimizer, opt_param_scheduler)",
        ("args", "rollout_id", "step_id", "model", "optimizer", "opt_param_scheduler"), ()),
    "custom_advantage_function_path": ("fn(args, rollout_data)", ("args", "rollout_data"), ()),
    "custom_tis_function_path": (f"fn(args, *, {', '.join(_TIS_KEYWORDS)})", ("args",), _TIS_KEYWORDS),
    "rollout_data_postprocess_path": ("fn(args, rollout_id, rollout_data)", ("args", "rollout_id", "rollout_data"),
                                      ()),
    "custom_loss_function_path": ("fn(args, batch, logits, sum_of_sample_mean)",
                                  ("args", "batch", "logits", "sum_of_sample_mean"), ()),
    "custom_pg_loss_reducer_function_path": (
        "factory(total_lengths, response_lengths, loss_masks, calculate_per_token_loss)",
        ("total_lengths", "response_lengths", "loss_masks", "calculate_per_token_loss"), ()),
}


# (flag, dest) of each hook: the args this module reads
FLAGS = (("--custom-megatron-init-path", "custom_megatron_init_path"),
         ("--custom-megatron-before-log-prob-hook-path", "custom_megatron_before_log_prob_hook_path"),
         ("--custom-megatron-before-train-step-hook-path", "custom_megatron_before_train_step_hook_path"),
         ("--custom-advantage-function-path", "custom_advantage_function_path"),
         ("--custom-tis-function-path", "custom_tis_function_path"),
         ("--rollout-data-postprocess-path", "rollout_data_postprocess_path"),
         ("--custom-loss-function-path", "custom_loss_function_path"),
         ("--custom-pg-loss-reducer-function-path", "custom_pg_loss_reducer_function_path"))


def load_trainer_hooks(args) -> dict:
    """dest -> function for every hook flag that is set."""
    hooks = {}
    for flag, dest in FLAGS:
        path = getattr(args, dest, None)
        if path:
            shown, positional, keywords = SPECS[dest]
            hooks[dest] = load_hook(resolve(path), flag, shown, *positional, keywords=keywords)
    return hooks


def custom_advantages(fn, args, batch: dict) -> tuple[list, list]:
    """Run the user's advantage function on a copy of the batch; check and return (advantages, returns)."""
    data = dict(batch)
    fn(args, data)
    out = []
    for key in ("advantages", "returns"):
        values = data.get(key)
        if not isinstance(values, (list, tuple)) or len(values) != len(batch["response_lengths"]):
            raise ValueError(f"--custom-advantage-function-path must set rollout_data[{key!r}] to one tensor per "
                             f"sample ({len(batch['response_lengths'])}), got {type(values).__name__}")
        rows = []
        for i, (v, n) in enumerate(zip(values, batch["response_lengths"])):
            t = torch.as_tensor(v, dtype=torch.float32).reshape(-1)
            if t.numel() != int(n):
                raise ValueError(f"--custom-advantage-function-path: rollout_data[{key!r}][{i}] has {t.numel()} "
                                 f"values for a response of {int(n)} tokens")
            rows.append(t)
        out.append(rows)
    return out[0], out[1]


def _split(t: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]:
    return [t[i, :n] for i, n in enumerate(lengths)]


def _pad(flat: torch.Tensor, lengths: list[int], like: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(like)
    start = 0
    for i, n in enumerate(lengths):
        out[i, :n] = flat[start:start + n]
        start += n
    return out


def total_lengths(mb) -> list[int]:
    """Prompt + response length of each sample of a MicroBatch, from where its response logits sit
    (first response logit = start + length - response - 1; starts accumulate when packed into one row)."""
    packed = mb.tokens.shape[0] == 1
    out, start = [], 0
    for first, resp in zip(mb.sequence_cols[:, 0].tolist(), mb.response_lengths):
        length = int(first) + resp + 1 - (start if packed else 0)
        out.append(length)
        start += length
    return out


def custom_tis(fn, args, pg: torch.Tensor, old: torch.Tensor, rollout_lp: torch.Tensor, mb):
    """Call a slime TIS function on our padded `[n, R]` tensors; returns (pg, loss mask, metric sums)."""
    mask, lengths = mb.loss_mask, mb.response_lengths
    flat_pg = torch.cat(_split(pg, lengths))
    out = fn(args, pg_loss=flat_pg, train_log_probs=_split(old, lengths), rollout_log_probs=_split(rollout_lp, lengths),
             loss_masks=_split(mask, lengths), total_lengths=total_lengths(mb), response_lengths=lengths)
    if not (isinstance(out, tuple) and len(out) == 3):
        raise TypeError("--custom-tis-function-path must return (pg_loss, loss_masks, metrics), got "
                        f"{type(out).__name__}")
    new_pg, new_masks, metrics = out
    if new_pg.shape != flat_pg.shape:
        raise ValueError(f"--custom-tis-function-path returned pg_loss of shape {tuple(new_pg.shape)}; expected "
                         f"{tuple(flat_pg.shape)} (the input's)")
    new_mask = _pad(torch.cat([m.to(mask.dtype).reshape(-1) for m in new_masks]), lengths, mask) * mask
    sums = {k: (_pad(v.detach().float().reshape(-1), lengths, mask.float()) * mask).sum() for k, v in metrics.items()}
    return _pad(new_pg, lengths, pg) * new_mask, new_mask, sums


class TrainerHooks:
    """The loaded hooks of one trainer; `call` runs one if its flag was set (else does nothing)."""

    def __init__(self, args):
        self.fns = load_trainer_hooks(args)

    def get(self, dest: str):
        return self.fns.get(dest)

    def call(self, dest: str, *args):
        fn = self.fns.get(dest)
        return fn(*args) if fn is not None else None
