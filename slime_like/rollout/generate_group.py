"""One group's generation: SGLang sampling params from the flags, the rollout-wide state (engines, tokenizer,
concurrency), one sample's requests (multi-turn aware) and a whole group with its rewards.

Shared by the training rollout (generate.py) and evaluation (eval.py), which both import it; neither imports
the other, so the two stay free of an import cycle.
"""
from __future__ import annotations

import asyncio
import itertools
import logging

from ..sample import Sample, Status
from .engines import NoEngineLeft, current_state
from .hooks import load_function
from .rewards import assign_rewards
from .sample_hooks import apply_sample_hooks, sample_hooks

logger = logging.getLogger(__name__)
FINISHED = (Status.COMPLETED, Status.TRUNCATED)


class GenerationError(RuntimeError):
    pass


def sampling_params_from_args(args, evaluation: bool = False) -> dict:
    """SGLang ``sampling_params`` from the rollout flags (eval overrides where set)."""
    p = {"temperature": args.rollout_temperature, "top_p": args.rollout_top_p, "top_k": args.rollout_top_k,
         "max_new_tokens": args.rollout_max_response_len, "stop": args.rollout_stop,
         "stop_token_ids": args.rollout_stop_token_ids,
         "min_new_tokens": args.rollout_min_new_tokens,
         "skip_special_tokens": bool(args.rollout_skip_special_tokens),
         # Keep a matched stop string in the text so text and tokens agree (RL trains on the tokens).
         "no_stop_trim": True}
    if args.rollout_greedy:  # RLinf use_greedy: argmax at the engine (SGLang: temperature 0)
        p["temperature"] = 0.0
    if args.rollout_repetition_penalty != 1.0:  # sent only when set: 1.0 is every engine's default
        p["repetition_penalty"] = args.rollout_repetition_penalty
    if evaluation:
        for key, flag in (("temperature", "eval_temperature"), ("top_p", "eval_top_p"), ("top_k", "eval_top_k"),
                          ("max_new_tokens", "eval_max_response_len"), ("min_new_tokens", "eval_min_new_tokens")):
            if getattr(args, flag, None) is not None:
                p[key] = getattr(args, flag)
    if p["max_new_tokens"] is None:
        raise ValueError("--rollout-max-response-len is required (SGLang's max_new_tokens per response)")
    return {k: v for k, v in p.items() if v is not None}


class Slots:
    """The rollout's concurrency bound, counted in samples: a batched request of k samples takes k slots.

    ``async with slots`` takes one. Takers are served one at a time (FIFO), so two batches each holding part
    of what they need can never wait on each other forever."""

    def __init__(self, total: int):
        self.total, self.free = max(1, int(total)), max(1, int(total))
        self._turn = asyncio.Lock()
        self._freed = asyncio.Condition()

    async def acquire(self, n: int = 1) -> None:
        if not 0 < n <= self.total:
            raise ValueError(f"cannot take {n} of {self.total} slots")
        async with self._turn, self._freed:
            await self._freed.wait_for(lambda: self.free >= n)
            self.free -= n

    async def release(self, n: int = 1) -> None:
        async with self._freed:
            self.free += n
            self._freed.notify_all()

    async def __aenter__(self):
        await self.acquire(1)

    async def __aexit__(self, *exc):
        await self.release(1)


class _RolloutSingleton(type):
    """slime's GenerateState is a per-process singleton its custom generate functions reach with
    ``GenerateState(args)``. Here the rollout builds its state first; called with args alone, the class answers
    that state (``current_state()``), so slime's code and ours share one object."""

    def __call__(cls, args, *rest, **kwargs):
        if not rest and not kwargs:
            return current_state()
        return super().__call__(args, *rest, **kwargs)


class GenerateState(metaclass=_RolloutSingleton):
    """Shared by every request of one rollout: engines, concurrency bound, abort flag, progress."""

    def __init__(self, args, pool, tokenizer=None, progress=None):
        from .data_source import multimodal_processor

        self.args, self.pool, self.tokenizer, self.progress = args, pool, tokenizer, progress
        # slime's attribute: the model's processor when the run reads images (--multimodal-keys), else None; here
        # a multimodal.processor.VisionProcessor (tokenizer + image processor + chat template)
        self.processor = multimodal_processor(args)
        self.placeholder_ids = vision_placeholder_ids(args, tokenizer)
        self.semaphore = Slots(int(args.sglang_server_concurrency) * len(pool.urls))
        if args.use_rollout_routing_replay:           # SGLang's request field: the engine reports each token's experts
            pool.request_extras["return_routed_experts"] = True
        self.aborted = False
        self._rid = itertools.count()
        path = args.custom_generate_function_path
        self.generate_fn = load_function(path, "--custom-generate-function-path") if path else generate_sample

    @property
    def sampling_params(self) -> dict:
        """slime's attribute: the rollout's sampling params from the flags (a fresh dict to modify)."""
        return sampling_params_from_args(self.args)

    async def engine_generate(self, input_ids: list[int], sampling_params: dict,
                              image_data: list[str] | None = None) -> dict:
        return await self.pool.generate(input_ids, sampling_params, rid=f"rollout-{next(self._rid)}",
                                        image_data=image_data)

    async def engine_generate_batch(self, input_ids: list[list[int]], sampling_params: list[dict],
                                    image_data: list[list[str]] | None = None) -> list[dict]:
        """One /generate call for several prompts (SGLang's batch form); one answer per prompt, in order."""
        rids = [f"rollout-{next(self._rid)}" for _ in input_ids]
        # One dict when every prompt shares it: smaller request, parsed once by the engine.
        params = sampling_params[0] if all(p == sampling_params[0] for p in sampling_params) else sampling_params
        outs = await self.pool.generate(input_ids, params, rid=rids, image_data=image_data)
        if not isinstance(outs, list) or len(outs) != len(input_ids):
            raise GenerationError(f"batched /generate of {len(input_ids)} prompts answered "
                                  f"{len(outs) if isinstance(outs, list) else type(outs).__name__}")
        return outs

    async def abort(self) -> None:
        """Stop everything: queued samples are not sent, running ones come back with finish_reason abort."""
        self.aborted = True
        await self.pool.abort_all()


def vision_placeholder_ids(args, tokenizer) -> frozenset:
    """A vision-language checkpoint's image / video placeholder token ids (empty for a text model)."""
    import json
    import os

    path = os.path.join(args.hf_checkpoint or "", "config.json")
    if tokenizer is None or not os.path.isfile(path):
        return frozenset()
    with open(path) as f:
        if "vision_config" not in json.load(f):
            return frozenset()
    ids = (tokenizer.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|video_pad|>"))
    return frozenset(i for i in ids if isinstance(i, int) and i != tokenizer.unk_token_id)


def _cut_at_placeholder(sample: Sample, new_ids: list, new_lps: list, out: dict):
    """A vision-language model that samples an image / video placeholder token has written a token with no image
    behind it: no forward can score it (transformers' Qwen-VL models fill every placeholder with an image's
    features). The response ends before it, as a truncation (sample.metadata['cut_at_placeholder'] = True); a
    response with nothing before it fails (its group is counted failed and another prompt is drawn)."""
    try:
        ids = current_state().placeholder_ids
    except RuntimeError:
        return new_ids, new_lps, out
    cut = next((i for i, t in enumerate(new_ids) if t in ids), None)
    if cut is None:
        return new_ids, new_lps, out
    sample.metadata["cut_at_placeholder"] = True
    meta = dict(out.get("meta_info") or {}, finish_reason={"type": "length", "length": cut})
    text = current_state().tokenizer.decode(new_ids[:cut]) if current_state().tokenizer is not None else ""
    return new_ids[:cut], new_lps[:cut], dict(out, text=text, meta_info=meta)


def append_engine_output(sample: Sample, out: dict, loss_mask_value: int = 1) -> int:
    """Append one /generate answer to the sample (tokens, log-probs, mask, text, status); returns #tokens."""
    meta = out.get("meta_info") or {}
    lp = meta.get("output_token_logprobs")
    if lp is None:
        raise GenerationError(f"engine answer has no meta_info.output_token_logprobs (return_logprob was set); "
                              f"keys: {sorted(meta)}")
    new_ids = [int(t) for _, t, *_ in lp]
    new_lps = [float(v) for v, *_ in lp]
    n_answered = len(new_ids)
    new_ids, new_lps, out = _cut_at_placeholder(sample, new_ids, new_lps, out)
    meta = out.get("meta_info") or {}
    sample.tokens += new_ids
    sample.response_length += len(new_ids)
    sample.loss_mask += [loss_mask_value] * len(new_ids)
    sample.rollout_log_probs += new_lps
    sample.response += out.get("text", "")
    if new_ids and meta.get("weight_version") is not None:   # which weights wrote these tokens (as slime records
        # it; an answer aborted before its first token wrote nothing, so its version would only inflate staleness)
        sample.weight_versions.append(str(meta["weight_version"]))
    kind = (meta.get("finish_reason") or {}).get("type")
    sample.status = {"length": Status.TRUNCATED, "abort": Status.ABORTED}.get(kind, Status.COMPLETED)
    if len(new_ids) < n_answered and not sample.response_length:
        sample.status = Status.FAILED   # nothing before the placeholder: the group is counted failed, not trained
    if meta.get("routed_experts") is not None:     # --use-rollout-routing-replay: the whole sequence's routing
        if meta.get("routed_experts_start_len"):
            raise GenerationError("the engine answered routed_experts from position "
                                  f"{meta['routed_experts_start_len']}; only whole-sequence routing (0) is read")
        sample.rollout_routed_experts = meta["routed_experts"]
    return len(new_ids)


def _request_params(args, sample: Sample, sampling_params: dict) -> dict | None:
    """This sample's sampling params (what is left of its budget); None when nothing is left."""
    params = dict(sampling_params)
    params["max_new_tokens"] = params["max_new_tokens"] - sample.response_length
    context = args.rollout_max_context_len
    if context:                                    # prompt + response must fit the context limit
        params["max_new_tokens"] = min(params["max_new_tokens"], context - len(sample.tokens))
    return params if params["max_new_tokens"] > 0 else None


async def generate_sample(args, sample: Sample, sampling_params: dict) -> Sample:
    """The default per-sample generate: one /generate call, continuing a partial response if any."""
    params = _request_params(args, sample, sampling_params)
    if params is None:
        sample.status = Status.TRUNCATED
        return sample
    out = await current_state().engine_generate(sample.tokens, params, image_data=sample_images(sample))
    append_engine_output(sample, out)
    return sample


def sample_images(sample: Sample) -> list[str]:
    """The sample's images as SGLang's image_data takes them (PNG data URLs, in placeholder order)."""
    return list((sample.multimodal_inputs or {}).get("image") or [])


def reset_sample(sample: Sample) -> None:
    """Drop the response (back to a fresh prompt)."""
    del sample.tokens[sample.prompt_length:]
    sample.response_length, sample.response, sample.reward = 0, "", None
    sample.loss_mask, sample.rollout_log_probs, sample.status = [], [], Status.PENDING
    sample.weight_versions = []


def _start(args, sample: Sample) -> None:
    """A sample is about to be (re)generated."""
    if sample.response_length and args.mask_offpolicy_in_partial_rollout:
        sample.loss_mask = [0] * sample.response_length   # generated by older weights
    sample.status = Status.PENDING


async def _generate_one(args, sample: Sample, sampling_params: dict) -> list[Sample]:
    """One sample through the (possibly custom) generate function, under one concurrency slot; the sample(s)
    that replace it."""
    state = current_state()
    async with state.semaphore:
        if state.aborted:
            sample.status = Status.ABORTED
            return [sample]
        _start(args, sample)
        try:
            out = await state.generate_fn(args, sample, sampling_params)
        except NoEngineLeft:
            raise
        except Exception as exc:
            raise GenerationError(f"generation failed for prompt index {sample.group_index} (sample "
                                  f"{sample.index}): {type(exc).__name__}: {exc}") from exc
    out = _checked_output(state.generate_fn, out, sample)
    if state.progress is not None:
        state.progress.update(1)
    return out


def _checked_output(fn, out, sample: Sample) -> list[Sample]:
    """A custom generate's answer as a list: one Sample (this one or a new one), or (as slime allows) a non-empty
    list of Samples; they all replace this one in its prompt's group (multi-sample per prompt; they share its group_index, so the
    group step and --group-rm see them together)."""
    name = f"--custom-generate-function-path {fn.__module__}.{fn.__name__}"
    if isinstance(out, Sample):
        out = [out]    # possibly a new Sample (slime's tau-bench builds one from its trajectory)
    if not isinstance(out, (list, tuple)) or not out or not all(isinstance(s, Sample) for s in out):
        got = type(out).__name__ if not isinstance(out, (list, tuple)) else \
            f"a {type(out).__name__} of {[type(s).__name__ for s in out][:5]}"
        raise GenerationError(f"{name} returned {got} for prompt index {sample.group_index}; expected a Sample "
                              "or a non-empty list of Samples")
    if len({id(s) for s in out}) != len(out):
        raise GenerationError(f"{name} returned the same Sample object twice for prompt index "
                              f"{sample.group_index}; return copies (copy.deepcopy(sample)) for extra samples")
    for s in out:
        s.group_index = sample.group_index
    return list(out)


async def _generate_batch(args, samples: list[Sample], sampling_params: dict) -> None:
    """The default generate for several samples of one group in ONE /generate call (SGLang's batch form).

    Same per-sample outcome as ``generate_sample`` on each (a sample is only updated from a successful
    answer, aborted ones keep their partial output), at a fraction of the HTTP and engine overhead."""
    state = current_state()
    await state.semaphore.acquire(len(samples))
    try:
        if state.aborted:
            for s in samples:
                s.status = Status.ABORTED
            return
        todo, params = [], []
        for s in samples:
            _start(args, s)
            p = _request_params(args, s, sampling_params)
            if p is None:
                s.status = Status.TRUNCATED
            else:
                todo.append(s)
                params.append(p)
        if todo:
            try:
                outs = await state.engine_generate_batch([s.tokens for s in todo], params,
                                                         image_data=[sample_images(s) for s in todo])
                for s, out in zip(todo, outs):
                    append_engine_output(s, out)
            except NoEngineLeft:
                raise
            except Exception as exc:
                raise GenerationError(f"generation failed for prompt index {samples[0].group_index} (samples "
                                      f"{[s.index for s in todo]}): {type(exc).__name__}: {exc}") from exc
    finally:
        await state.semaphore.release(len(samples))
    if state.progress is not None:
        state.progress.update(len(samples))


async def generate_group(args, group: list[Sample], sampling_params: dict, rollout_id: int | None = None,
                         evaluation: bool = False) -> list[Sample]:
    """Generate every unfinished sample of one prompt's group, then score the group (if all finished).

    With the default generate function the group's samples go to the engine as one batched request
    (in chunks no larger than the concurrency bound); a custom generate function runs per sample."""
    state = current_state()
    todo = [s for s in group if s.status not in FINISHED]   # finished ones: from an earlier rollout (partial)
    if state.generate_fn is generate_sample:
        size = state.semaphore.total
        await asyncio.gather(*(_generate_batch(args, todo[i:i + size], sampling_params)
                               for i in range(0, len(todo), size)))
    else:
        done = await asyncio.gather(*(_generate_one(args, s, sampling_params) for s in todo))
        replaced = {id(old): new for old, new in zip(todo, done)}
        group[:] = [n for s in group for n in replaced.get(id(s), [s])]
    if all(s.status in FINISHED for s in group):
        hooks = sample_hooks(args)
        if hooks:   # --rollout-sample-hook-path: once per generated sample, right before its reward
            group[:] = [await apply_sample_hooks(args, s, hooks, rollout_id=rollout_id, evaluation=evaluation)
                        if s.reward is None else s for s in group]
        # as slime's generate_and_rm: a reward the generate function set itself (multi_agent, tau-bench) stands;
        # --group-rm scores the whole group
        unscored = group if args.group_rm else [s for s in group if s.reward is None]
        if unscored:
            await assign_rewards(args, unscored)
    return group
