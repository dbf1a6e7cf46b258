"""Evaluation: ``--eval-prompt-data NAME PATH [NAME PATH ...]``, n samples per prompt, metrics per dataset.

Metrics, under ``eval/<name>/``:
  ``reward``            mean scalar reward over all samples (``--eval-reward-key``, else ``--reward-key``)
  ``accuracy``          share of samples with reward > 0 (a sample counts as correct when its reward is
                        positive, which fits 0/1 and -1/+1 graders alike)
  ``pass@k``            for k = 1, 2, 4, ... and n (= ``--n-samples-per-eval-prompt``): the unbiased
                        estimator of Chen et al. 2021, mean over prompts of 1 - C(n-c, k) / C(n, k), c =
                        correct samples of the prompt
  ``response_len/mean`` mean response length in tokens
  ``truncated_ratio``   share of samples that hit the max response length
Sampling: the rollout's parameters with ``--eval-temperature/--eval-top-p/--eval-top-k/
--eval-max-response-len`` overriding where set.
"""
from __future__ import annotations

import asyncio
import copy
import random

from ..sample import Status
from .data_source import load_prompts, make_group, multimodal_processor, prompt_context_length
from .engines import current_state
from .generate_group import generate_group, sampling_params_from_args
from .rewards import scalar_reward


def eval_datasets(args) -> list[tuple[str, str]]:
    items = list(args.eval_prompt_data or [])
    if len(items) % 2:
        raise ValueError(f"--eval-prompt-data takes NAME PATH pairs; got an odd number of values: {items}")
    return [(items[i], items[i + 1]) for i in range(0, len(items), 2)]


def dataset_args(args, name: str):
    """The flags in force while dataset `name` is evaluated: --eval-config's settings for it (config/eval_config.py)
    on a copy; the shared namespace unchanged. Without --eval-config, `args` itself."""
    for dataset in args.eval_datasets or ():
        if dataset["name"] == name and dataset["overrides"]:
            view = copy.copy(args)
            for dest, value in dataset["overrides"].items():
                setattr(view, dest, value)
            return view
    return args


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k = 1 - C(n-c, k) / C(n, k), as the numerically stable product."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per prompt, got {n}")
    if n - c < k:
        return 1.0
    prob_all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        prob_all_wrong *= 1.0 - k / i
    return 1.0 - prob_all_wrong


def ks_for(n: int) -> list[int]:
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n]


def eval_args(args):
    """A copy with the eval reward key and context limit in force (the shared namespace is never mutated)."""
    view = copy.copy(args)
    view.reward_key = args.eval_reward_key or args.reward_key
    view.rollout_max_context_len = (args.eval_max_context_len
                                    or args.rollout_max_context_len)
    return view


async def eval_rollout(args, rollout_id: int) -> dict:
    """{dataset name: list of groups}; every prompt of every dataset, n samples each, scored."""
    state = current_state()
    out = {}
    for name, path in eval_datasets(args):
        dargs = dataset_args(args, name)  # --eval-config: this dataset's own settings
        eargs = eval_args(dargs)
        n = int(dargs.n_samples_per_eval_prompt or 1)
        params = sampling_params_from_args(dargs, evaluation=True)
        records = load_prompts(path, state.tokenizer, dargs.eval_input_key or dargs.input_key,
                               dargs.eval_label_key or dargs.label_key,
                               dargs.metadata_key,
                               bool(dargs.apply_chat_template),
                               dargs.eval_max_prompt_len, flag=f"--eval-prompt-data {name}",
                               tool_key=dargs.eval_tool_key or dargs.tool_key,
                               template_kwargs=dargs.apply_chat_template_kwargs,
                               context_length=prompt_context_length(dargs),
                               skip_bad=bool(dargs.skip_over_long_prompts),
                               multimodal_keys=dargs.multimodal_keys or None, processor=multimodal_processor(dargs))
        if dargs.eval_shuffle:  # RLinf validation_shuffle: the order only; every prompt is scored
            random.Random(f"{args.rollout_seed}:{rollout_id}:{name}").shuffle(records)
        groups = [make_group(rec, i, n, multimodal_processor(dargs)) for i, rec in enumerate(records)]
        out[name] = await asyncio.gather(*(generate_group(eargs, g, params, None, True) for g in groups))
    return out


def eval_metrics(args, name: str, groups: list) -> dict:
    eargs = eval_args(dataset_args(args, name))
    rewards, correct_per_group, lengths, truncated = [], [], [], []
    for group in groups:
        rs = [scalar_reward(eargs, s.reward) if s.status != Status.FAILED else 0.0 for s in group]
        rewards += rs
        correct_per_group.append(sum(r > 0 for r in rs))
        lengths += [s.response_length for s in group]
        truncated += [s.status == Status.TRUNCATED for s in group]
    n = len(groups[0]) if groups else 0
    p = f"eval/{name}/"
    m = {p + "reward": sum(rewards) / len(rewards), p + "accuracy": sum(r > 0 for r in rewards) / len(rewards),
         p + "response_len/mean": sum(lengths) / len(lengths), p + "truncated_ratio": sum(truncated) / len(truncated),
         p + "num_prompts": len(groups)}
    for k in ks_for(n):
        m[p + f"pass@{k}"] = sum(pass_at_k(n, c, k) for c in correct_per_group) / len(groups)
    return m
