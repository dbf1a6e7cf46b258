"""The decoding core of the embedded CPU engine: a scheduler thread doing continuous batching.

One background thread owns the model. Every iteration it
  1. drops aborted rows (they finish with their partial output, finish_reason ``abort``),
  2. admits waiting requests up to ``max_running_requests``: prefills them together and merges them into the
     running batch (so a request arriving mid-decode joins at the next step, not after the batch drains),
  3. runs one decode step for every running row (new ones included), samples with each row's own parameters, and retires the rows
     that finished (stop token, stop string, max_new_tokens, context length).
Weight updates take ``model_lock`` so they land between two steps. No HTTP or asyncio here: callers pass an
``on_done`` callback, which the HTTP layer turns into a future.
"""
from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import torch

from slime_like.backends.cpu_engine import kv_batch, routing, vision, weights
from slime_like.backends.cpu_engine.sampling import SamplingParams, apply_repetition_penalty, sample_next
from slime_like.backends.engine_api.protocol import BadRequest
from slime_like.backends.engine_api.tensor_serializer import model_bytes

logger = logging.getLogger("slime_like.cpu_engine")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Default request ids: unique per process start + a counter (a uuid4 per request cost more than its decode step).
_RID_PREFIX, _RID_COUNTER = uuid.uuid4().hex[:16] + "-", itertools.count()


@dataclass
class Request:
    input_ids: list[int]
    params: SamplingParams
    return_logprob: bool = False
    return_text_in_logprobs: bool = False
    rid: str = field(default_factory=lambda: f"{_RID_PREFIX}{next(_RID_COUNTER)}")
    on_done: Callable[["Request"], None] | None = None
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    logprob_start_len: int = -1                 # >= 0: score_prompts fills input_logprobs from this position
    input_logprobs: list = field(default_factory=list)
    finish_reason: dict | None = None
    abort_message: str | None = None
    created: float = field(default_factory=time.time)
    finished_at: float = 0.0
    return_routed_experts: bool = False
    routed_rows: list = field(default_factory=list)  # [n, L, k] int32 chunks: prompt rows, then one per decode
    images: "vision.PromptImages | None" = None     # a vision-language prompt's processed image_data

    def routed_experts_b64(self) -> str:
        return routing.encode(self.routed_rows)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class CPUEngine:
    def __init__(self, model_path: str, dtype: str = "float32", max_running_requests: int = 512,
                 random_seed: int = 0, context_length: int | None = None, weight_dirs: list[str] | None = None):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if dtype not in DTYPES:
            raise ValueError(f"--dtype {dtype!r} is not supported; choose one of {sorted(DTYPES)}")
        if not os.path.isfile(os.path.join(model_path, "config.json")):
            raise FileNotFoundError(f"--model-path {model_path!r} has no config.json (expected a Hugging Face model dir)")
        self.model_path, self.dtype = model_path, DTYPES[dtype]
        self.served_model_path = model_path   # version 0 of a delta weight sync (/pull_weights)
        # /update_weights_from_disk loads from these only (default: the served model's parent directory)
        self.weight_dirs = list(weight_dirs or [os.path.dirname(os.path.realpath(model_path))])
        # a vision-language checkpoint (Qwen2.5-VL, Qwen3-VL): its image-text class, and its image processor
        self.vision = vision.VisionServing(model_path) if vision.is_vision_checkpoint(model_path) else None
        if self.vision is not None:
            from transformers import AutoModelForImageTextToText as model_class
        else:
            model_class = AutoModelForCausalLM
        self.model = model_class.from_pretrained(model_path, dtype=self.dtype, attn_implementation="sdpa")
        self.model.eval().requires_grad_(False)
        # the largest weight payload this engine maps (fixed at start: release_memory_occupation empties the params)
        self.max_payload_bytes = model_bytes(t.numel() for t in self.model.state_dict().values())
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        cfg = self.model.config.get_text_config()
        self.vocab_size = cfg.vocab_size
        self.context_length = context_length or getattr(cfg, "max_position_embeddings", 1 << 30)
        self.eos_ids = weights.eos_token_ids(self.model, self.tokenizer)
        self.max_running_requests = max_running_requests
        self.generator = torch.Generator().manual_seed(random_seed)
        self.return_original_logprob = os.environ.get("SGLANG_RETURN_ORIGINAL_LOGPROB", "").lower() in ("1", "true")
        self.weight_version = "default"
        self.model_lock = threading.RLock()     # held for one step / one weight update
        self._weights_checker = weights.WeightsChecker()
        self._cond = threading.Condition()      # guards the queues below
        self._waiting: deque[Request] = deque()
        self._inflight: dict[int, Request] = {}  # every submitted, unfinished request (so none is ever lost)
        self._abort_rids: set[str] = set()
        self._abort_all = False
        self._paused = False
        self.released = False
        self.batch = kv_batch.RunningBatch()
        self.routing = routing.RoutingRecorder(self.model)   # MoE routers' top-k per token (return_routed_experts)
        self.stats = {"decode_steps": 0, "decode_rows": 0, "max_batch_size": 0, "prefill_calls": 0,
                      "prefill_rows": 0, "max_prefill_batch_size": 0, "generated_tokens": 0, "finished_requests": 0,
                      "generate_calls": 0}   # HTTP /generate calls (a batched call counts once)
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="cpu-engine-scheduler", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ requests
    def submit(self, req: Request) -> None:
        """Validate and queue a request; raises BadRequest before any model work."""
        self.submit_many([req])

    def submit_many(self, reqs: list[Request]) -> None:
        """Validate every request, then queue them all at once (one wake-up of the scheduler): a batch is
        prefilled together. Raises BadRequest, queuing nothing, if any request is invalid."""
        for r in reqs:
            self.validate(r)
        queued = []
        for r in reqs:
            if r.params.max_new_tokens == 0:
                r.finish_reason = {"type": "length", "length": 0}
                self._finish(r, counted=False)
            else:
                queued.append(r)
        if queued:
            with self._cond:
                for r in queued:
                    self._inflight[id(r)] = r
                self._waiting.extend(queued)
                self._cond.notify_all()

    def validate(self, req: Request) -> None:
        n = len(req.input_ids)
        if n == 0:
            raise BadRequest("input_ids is empty")
        bad = [t for t in req.input_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise BadRequest(f"input_ids contain ids outside [0, {self.vocab_size}): {bad[:5]}")
        if n >= self.context_length:
            raise BadRequest(f"The input ({n} tokens) is longer than the model's context length "
                             f"({self.context_length} tokens).")
        if self.released:
            raise BadRequest("engine memory is released; call /resume_memory_occupation first")
        if self.vision is not None:
            self.vision.check_placeholders(req.input_ids, req.images, f"request {req.rid}")
        elif req.images is not None:
            raise BadRequest(f"image_data: this model ({type(self.model).__name__}) is a text model; serve a "
                             "vision-language checkpoint (Qwen2.5-VL, Qwen3-VL) to send images")
        if req.return_routed_experts and not self.routing.supported:
            raise BadRequest(f"return_routed_experts: this model ({type(self.model).__name__}) has no MoE router "
                             "that reports its top-k experts (the CPU engine records transformers' *TopKRouter "
                             "modules: Qwen3-MoE, Qwen2-MoE, Mixtral)")

    def abort(self, rid: str | None = None, abort_all: bool = False) -> None:
        """Abort one request (queued or running) or all of them; running ones keep their partial output."""
        with self._cond:
            if abort_all:
                self._abort_all = True
            elif rid and any(r.rid == rid for r in self._inflight.values()):
                # only live requests: a stale rid must not abort a later request that reuses it
                self._abort_rids.add(rid)
            self._cond.notify_all()

    def pause(self, abort_running: bool = False) -> None:
        with self._cond:
            self._paused = True
            if abort_running:
                self._abort_all = True
            self._cond.notify_all()

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def num_requests(self) -> int:
        return len(self._waiting) + len(self.batch)

    def shutdown(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=10)

    # ------------------------------------------------------------------ scheduler
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stop and (self._paused and not self._abort_all or self.released
                                          or not (self._waiting or len(self.batch) or self._abort_all)):
                    self._cond.wait()
                if self._stop:
                    return
            try:
                with self.model_lock, torch.inference_mode():
                    self._step()
            except Exception as e:  # never let one bad step kill the server silently
                logger.exception("scheduler step failed")
                self._fail_all(f"engine step failed: {type(e).__name__}: {e}")

    def _take_aborts(self) -> tuple[bool, set[str]]:
        with self._cond:
            all_, rids = self._abort_all, self._abort_rids
            self._abort_all, self._abort_rids = False, set()
            kept = deque()
            for r in self._waiting:
                if all_ or r.rid in rids:
                    r.finish_reason = {"type": "abort", "message": "Abort before prefill"}
                    self._finish(r)
                else:
                    kept.append(r)
            self._waiting = kept
            return all_, rids

    def _step(self) -> None:
        all_, rids = self._take_aborts()
        if all_ or rids:
            keep = []
            for i, r in enumerate(self.batch.rows):
                if all_ or r.rid in rids:
                    r.finish_reason = {"type": "abort", "message": "Aborted by /abort_request"}
                    self._finish(r)
                else:
                    keep.append(i)
            self.batch.keep(keep)
        if self._paused:
            return
        with self._cond:
            n_new = min(len(self._waiting), self.max_running_requests - len(self.batch))
            new = [self._waiting.popleft() for _ in range(max(0, n_new))]
        if new:
            fresh, logits = self._prefill(new)
            if any(r.return_routed_experts for r in new):
                rows = routing.prefill_rows(self.routing.capture(), [r.input_ids for r in new])
                for r, row in zip(new, rows):
                    if r.return_routed_experts:
                        r.routed_rows.append(row)
            self.stats["prefill_calls"] += 1
            self.stats["prefill_rows"] += len(new)
            self.stats["max_prefill_batch_size"] = max(self.stats["max_prefill_batch_size"], len(new))
            self._sample_and_retire(fresh, logits)
            self.batch.merge(fresh)
        # Decode in the same iteration: a trickle of arriving requests must not stall the running rows.
        if len(self.batch):
            logits = kv_batch.decode_step(self.model, self.batch)
            if any(r.return_routed_experts for r in self.batch.rows):
                step = self.routing.capture()                    # [B, L, k]: each row's fed-back token
                for i, r in enumerate(self.batch.rows):
                    if r.return_routed_experts:
                        r.routed_rows.append(step[i:i + 1])
            self.stats["decode_steps"] += 1
            self.stats["decode_rows"] += len(self.batch)
            self.stats["max_batch_size"] = max(self.stats["max_batch_size"], len(self.batch))
            self._sample_and_retire(self.batch, logits)

    def _prefill(self, new: list[Request]):
        if self.vision is None:
            return kv_batch.prefill(self.model, [r.input_ids for r in new], new)

        def vision_inputs(ids, mask, images):
            return vision.prefill_inputs(self.model, self.vision.image_token_id, ids, mask, images)
        return kv_batch.prefill(self.model, [r.input_ids for r in new], new, images=[r.images for r in new],
                                vision_inputs=vision_inputs)

    def _sample_and_retire(self, batch: kv_batch.RunningBatch, logits: torch.Tensor) -> None:
        rows: list[Request] = batch.rows
        logits = logits.float()
        for i, r in enumerate(rows):  # min_new_tokens: stop tokens are impossible until the minimum is reached
            if r.params.repetition_penalty != 1.0:
                apply_repetition_penalty(logits[i], r.input_ids + r.output_ids, r.params.repetition_penalty)
            if len(r.output_ids) < r.params.min_new_tokens:
                stops = list(r.params.stop_token_ids) + ([] if r.params.ignore_eos else list(self.eos_ids))
                stops = [t for t in stops if t < logits.shape[-1]]
                if stops:
                    logits[i, stops] = float("-inf")
        tokens, logprobs = sample_next(logits, *_param_columns(batch), self.generator, self.return_original_logprob)
        batch.last_tokens = tokens
        keep = []
        for i, (r, t, lp) in enumerate(zip(rows, tokens.tolist(), logprobs.tolist())):
            r.output_ids.append(t)
            r.output_logprobs.append(lp)
            self.stats["generated_tokens"] += 1
            r.finish_reason = self._check_finished(r, t)
            if r.finished:
                self._finish(r)
            else:
                keep.append(i)
        batch.keep(keep)

    def _check_finished(self, r: Request, t: int) -> dict | None:
        p, n = r.params, len(r.output_ids)
        if n >= p.min_new_tokens:
            if (not p.ignore_eos and t in self.eos_ids) or t in p.stop_token_ids:
                return {"type": "stop", "matched": t}
            if p.stop:
                # The tail long enough to contain any stop string (every token decodes to >= 1 char or nothing).
                tail_len = max(len(s) for s in p.stop) + 1
                tail = self.tokenizer.decode(r.output_ids[-tail_len:], skip_special_tokens=p.skip_special_tokens)
                for s in p.stop:
                    if s and s in tail:
                        return {"type": "stop", "matched": s}
        if n >= p.max_new_tokens or len(r.input_ids) + n >= self.context_length:
            return {"type": "length", "length": n}
        return None

    def _finish(self, r: Request, counted: bool = True) -> None:
        r.finished_at = time.time()
        with self._cond:  # RLock: _finish may run while the scheduler already holds it
            self._inflight.pop(id(r), None)
        if counted:
            self.stats["finished_requests"] += 1
        if r.on_done is not None:
            r.on_done(r)

    def _fail_all(self, message: str) -> None:
        with self._cond:
            pending = list(self._inflight.values())
            self._waiting.clear()
        self.batch = kv_batch.RunningBatch()
        for r in pending:
            r.finish_reason = {"type": "abort", "message": message, "status_code": 500, "err_type": "InternalError"}
            self._finish(r)

    # ------------------------------------------------------------------ weights (run in a worker thread)
    def update_weights(self, named_tensors, weight_version: str | None = None) -> int:
        """Copy (name, tensor) pairs into the live parameters in place; returns how many were loaded."""
        with self.model_lock:
            n = weights.load_named_tensors(self.model, named_tensors)
            if weight_version is not None:
                self.weight_version = weight_version
            return n

    def update_weights_from_disk(self, model_path: str, weight_version: str | None = None) -> int:
        with self.model_lock:
            n = weights.load_from_disk(self.model, model_path, self.weight_dirs)
            self.model_path = model_path
            if weight_version is not None:
                self.weight_version = weight_version
            return n

    def score_prompts(self, reqs: list[Request]) -> None:
        """SGLang's prompt log-probs (logprob_start_len >= 0): log p(token_i | tokens_<i) for i >= start, None for
        token 0 (nothing before it), temperature-scaled like the output log-probs; one forward per prompt, between
        two scheduler steps (weights cannot change under it)."""
        with self.model_lock, torch.inference_mode():
            for r in reqs:
                if r.logprob_start_len < 0:
                    continue
                ids = torch.tensor([r.input_ids])
                inputs = {"input_ids": ids} if self.vision is None else \
                    vision.score_inputs(self.vision.image_token_id, r.input_ids, r.images)
                logits = self.model(**inputs).logits[0].float()
                t = r.params.temperature  # the same distribution as the output log-probs (sampling.py)
                if t > 0 and t != 1.0 and not self.return_original_logprob:
                    logits = logits / t
                logp = torch.log_softmax(logits, dim=-1)
                scored = logp[:-1].gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1).tolist()
                r.input_logprobs = ([None] + scored)[r.logprob_start_len:]

    def check_weights(self, action: str) -> tuple[bool, str]:
        """SGLang's /weights_checker actions (snapshot / reset_tensors / compare): weights.WeightsChecker."""
        with self.model_lock:
            return self._weights_checker.handle(self.model, action)

    def release_memory(self) -> None:
        """Free the parameter storage (the weights' memory really goes away); generation waits until resume."""
        with self._cond:
            self.released = True
        with self.model_lock:
            self._shapes = weights.release(self.model)

    def resume_memory(self) -> None:
        """Reallocate the parameters and reload them from the last disk source (model path or from-disk update).

        Like SGLang without a CPU backup, the trainer is expected to push its current weights right after."""
        with self.model_lock:
            if self.released:
                weights.reallocate(self.model, self._shapes)
                weights.load_from_disk(self.model, self.model_path, self.weight_dirs)
        with self._cond:
            self.released = False
            self._cond.notify_all()


def _param_columns(batch: kv_batch.RunningBatch) -> tuple[torch.Tensor, ...]:
    """(temperature, top_p, top_k, min_p) per row, rebuilt only when the batch's rows change (every row change
    makes a new `rows` list), not on every decode step."""
    cached = getattr(batch, "_param_columns", None)
    if cached is not None and cached[0] is batch.rows:
        return cached[1]
    ps = [r.params for r in batch.rows]
    cols = (torch.tensor([p.temperature for p in ps], dtype=torch.float32),
            torch.tensor([p.top_p for p in ps], dtype=torch.float32),
            torch.tensor([p.top_k for p in ps], dtype=torch.long),
            torch.tensor([p.min_p for p in ps], dtype=torch.float32))
    batch._param_columns = (batch.rows, cols)
    return cols
