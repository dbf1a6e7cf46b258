"""The training rollout: groups from the data source, over-sampling, filters (one group's generation and the
rollout-wide state are in generate_group.py; evaluation in eval.py).

Hooks (slime's signatures):
  ``--rollout-function-path``: ``[async] def generate_rollout(args, rollout_id, data_source, evaluation=False)``
      returns the rollout's groups (``list[list[Sample]]`` or a ``RolloutOutput``); with
      ``evaluation=True`` a dict ``{dataset name: list[list[Sample]]}``. It runs inside the
      controller's event loop, so ``current_state()`` (engines, tokenizer, semaphore) is available.
  ``--custom-generate-function-path``: ``async def generate(args, sample, sampling_params) -> Sample``
      replaces ``generate_sample`` for every sample; call ``current_state().engine_generate(ids, params)``
      to reach the engines (fail-over included) and ``append_engine_output`` to record an answer.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from ..sample import Sample, Status
from .engines import current_state
from .eval import eval_rollout
from .filters import decide
from .generate_group import (  # noqa: F401  (re-exported: custom generate functions import them from here)
    FINISHED, GenerateState, GenerationError, Slots, append_engine_output, generate_group, generate_sample,
    reset_sample, sampling_params_from_args)
from .hooks import load_function

logger = logging.getLogger(__name__)


@dataclass
class RolloutOutput:
    groups: list                       # kept groups (list[list[Sample]])
    metrics: dict = field(default_factory=dict)
    filtered: list = field(default_factory=list)     # group indices dropped by the filter
    failed: list = field(default_factory=list)       # group indices with a FAILED sample
    returned: list = field(default_factory=list)     # group indices handed back to the data source


@dataclass
class RolloutFnTrainOutput:
    """slime's return type of a rollout function (slime.rollout.base_types): the controller reads it as a
    RolloutOutput (groups = samples)."""
    samples: list
    metrics: dict | None = None


@dataclass
class RolloutFnEvalOutput:
    """slime's evaluation return type; slime_like's evaluation takes ``{dataset: groups}`` (refused here: slime's
    ``data`` holds per-dataset reward lists, not samples)."""
    data: dict
    metrics: dict | None = None


def as_rollout_output(out):
    """A rollout function's answer as groups or a RolloutOutput (slime's RolloutFnTrainOutput converted)."""
    if isinstance(out, RolloutFnTrainOutput):
        return RolloutOutput(groups=list(out.samples), metrics=dict(out.metrics or {}))
    if isinstance(out, RolloutFnEvalOutput):
        raise TypeError("the rollout function returned slime's RolloutFnEvalOutput: slime_like's evaluation "
                        "takes {dataset name: list of sample groups} (return that with evaluation=True)")
    return out


@dataclass
class _Gathered:
    """What one rollout's generation loop gathered, beyond the RolloutOutput it fills."""
    result: RolloutOutput
    leftovers: list = field(default_factory=list)        # groups handed back to the data source
    filtered_groups: list = field(default_factory=list)  # groups the dynamic sampling filter dropped
    submitted: int = 0
    nonfinite: int = 0      # samples whose reward was NaN/inf (--on-nonfinite-reward)
    reward_errors: int = 0  # samples whose reward function raised (--on-reward-error skip)


async def generate_rollout(args, rollout_id: int, data_source, evaluation: bool = False):
    """Default ``--rollout-function-path``: ``--rollout-batch-size`` kept groups (see module doc)."""
    if evaluation:
        return await eval_rollout(args, rollout_id)
    gathered = await _gather_groups(args, rollout_id, data_source)
    _return_leftovers(args, rollout_id, data_source, gathered)
    result = gathered.result
    result.groups.sort(key=lambda g: g[0].group_index)
    # slime's post-rollout hooks: mark samples to leave out of the loss (sample.remove_sample = True),
    # and look at every finished group including the filtered ones.
    if args.rollout_sample_filter_path:
        load_function(args.rollout_sample_filter_path, "--rollout-sample-filter-path")(args, result.groups)
    if args.rollout_all_samples_process_path:
        all_groups = sorted(result.groups + gathered.filtered_groups, key=lambda g: g[0].group_index)
        load_function(args.rollout_all_samples_process_path, "--rollout-all-samples-process-path")(
            args, all_groups, data_source)
    result.metrics = {"rollout/groups_submitted": gathered.submitted, "rollout/groups_kept": len(result.groups),
                      "rollout/groups_filtered": len(result.filtered), "rollout/groups_failed": len(result.failed),
                      "rollout/groups_returned": len(result.returned),
                      "rollout/nonfinite_rewards": gathered.nonfinite + sum("nonfinite_reward" in (s.metadata or {})
                                                                            for g in result.groups for s in g),
                      "rollout/reward_errors": gathered.reward_errors}
    return result


async def _gather_groups(args, rollout_id: int, data_source) -> _Gathered:
    """Generate groups (over-sampled by --over-sampling-batch-size) until --rollout-batch-size are kept; abort
    and hand back the ones still running."""
    state = current_state()
    target = int(args.rollout_batch_size)
    over = int(args.over_sampling_batch_size or target)
    filter_path = args.dynamic_sampling_filter_path
    filter_fn = load_function(filter_path, "--dynamic-sampling-filter-path") if filter_path else None
    params = sampling_params_from_args(args)
    gathered = _Gathered(RolloutOutput(groups=[]))
    pending: dict[asyncio.Task, list[Sample]] = {}
    try:
        while len(gathered.result.groups) < target:
            while len(gathered.result.groups) + len(pending) < target:     # top up from the data source
                for g in data_source.get_samples(over):
                    pending[asyncio.ensure_future(generate_group(args, g, params, rollout_id))] = g
                    gathered.submitted += 1
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                group = pending.pop(task)
                task.result()                                      # re-raise a generation / reward error
                _file_group(args, gathered, group, target, filter_fn)
        if pending:                                                # over-sampled groups still running
            await state.abort()
            await asyncio.gather(*pending)
            gathered.leftovers += list(pending.values())
            pending = {}
    finally:
        for task in pending:                                       # an error: stop the rest
            task.cancel()
    return gathered


def _file_group(args, gathered: _Gathered, group: list[Sample], target: int, filter_fn) -> None:
    """A finished group is kept, handed back, counted as failed, or dropped by the filter."""
    result = gathered.result
    if len(result.groups) >= target:
        gathered.leftovers.append(group)                   # finished after the batch was full
    elif any(s.status == Status.ABORTED for s in group):
        gathered.leftovers.append(group)                   # the engine aborted it (e.g. weight update)
    elif any(s.status == Status.FAILED for s in group):
        result.failed.append(group[0].group_index)
        gathered.nonfinite += sum("nonfinite_reward" in (s.metadata or {}) for s in group)
        gathered.reward_errors += sum("reward_error" in (s.metadata or {}) for s in group)
    elif filter_fn is not None and not (d := decide(filter_fn, args, group)).keep:
        result.filtered.append(group[0].group_index)
        gathered.filtered_groups.append(group)
        logger.debug("filtered prompt %d: %s", group[0].group_index, d.reason)
    else:
        result.groups.append(group)


def _return_leftovers(args, rollout_id: int, data_source, gathered: _Gathered) -> None:
    """Unused groups go back to the data source: reset, or (--partial-rollout) kept to be continued."""
    for group in gathered.leftovers:
        for s in group:
            if not args.partial_rollout:
                reset_sample(s)                                    # the prompt is redone from scratch later
            elif s.response_length and "start_rollout_id" not in s.metadata:
                s.metadata["start_rollout_id"] = rollout_id        # as slime: where a partial response began
        gathered.result.returned.append(group[0].group_index)
    data_source.add_samples(gathered.leftovers)
