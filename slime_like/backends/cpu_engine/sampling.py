"""Sampling parameters (SGLang's names and defaults) and the batched, per-row sampler.

Pure functions over tensors, no engine state, so they are tested on their own.

Log-probs follow SGLang's default (``SGLANG_RETURN_ORIGINAL_LOGPROB`` unset): the log-prob returned for a
sampled token is ``log_softmax(logits / T)[token]`` -- the temperature-scaled distribution *before* top-k /
top-p truncation -- and ``log_softmax(logits)[token]`` for greedy rows (T == 0). With
``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` in the engine's environment it is always ``log_softmax(logits)``.
Stop-token masking for ``min_new_tokens`` is applied to the logits first, as SGLang's penalizer does.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field

import torch

from slime_like.backends.engine_api.protocol import BadRequest
from slime_like.config.types import FLOAT32_MAX, FLOAT32_TINY

# SGLang's SamplingParams keys. The ones in _UNSUPPORTED are accepted by SGLang but not implemented here;
# a request that sets them to a non-default value gets a clear error instead of being silently ignored.
_SUPPORTED = {"max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop",
              "stop_token_ids", "ignore_eos", "skip_special_tokens", "no_stop_trim", "n",
              "spaces_between_special_tokens", "repetition_penalty"}
_UNSUPPORTED = {"frequency_penalty": 0.0, "presence_penalty": 0.0,
                "json_schema": None, "regex": None, "ebnf": None, "structural_tag": None,
                "custom_params": None, "stream_interval": None, "logit_bias": None, "sampling_seed": None,
                "stop_regex": None}
GREEDY_EPS = 1e-6  # SGLang treats temperature below its epsilon as greedy


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1            # -1 = whole vocabulary
    min_p: float = 0.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    spaces_between_special_tokens: bool = True
    repetition_penalty: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS

    @classmethod
    def from_dict(cls, d: dict | None) -> "SamplingParams":
        """Validate a JSON ``sampling_params`` object field by field (type, range, finite, size): anything else
        is a BadRequest (HTTP 400) naming the field and the value; unknown keys fail with a did-you-mean."""
        if d is None:
            d = {}
        if not isinstance(d, dict):
            raise BadRequest(f"sampling_params must be a JSON object, got {type(d).__name__}")
        known = _SUPPORTED | set(_UNSUPPORTED)
        for key in d:
            if key not in known:
                close = difflib.get_close_matches(str(key), sorted(known), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise BadRequest(f"unknown sampling_params key {key!r}{hint}")
        for key, default in _UNSUPPORTED.items():
            if key in d and d[key] not in (default, None):
                raise BadRequest(f"sampling_params.{key}={d[key]!r} is not supported by the CPU engine "
                                 f"(leave it at {default!r}, or use SGLang on a GPU)")
        get = {k: v for k, v in d.items() if v is not None}.get
        if _int(get("n", 1), "n", 1, MAX_TOKENS) != 1:
            raise BadRequest("sampling_params.n must be 1 on the CPU engine; send n requests instead")
        p = cls(max_new_tokens=_int(get("max_new_tokens", 128), "max_new_tokens", 0, MAX_TOKENS),
                min_new_tokens=_int(get("min_new_tokens", 0), "min_new_tokens", 0, MAX_TOKENS),
                temperature=_real(get("temperature", 1.0), "temperature", 0.0, None),
                top_p=_real(get("top_p", 1.0), "top_p", 0.0, 1.0, low_open=True),
                top_k=_int(get("top_k", -1), "top_k", -1, MAX_TOP_K),
                min_p=_real(get("min_p", 0.0), "min_p", 0.0, 1.0),
                repetition_penalty=_real(get("repetition_penalty", 1.0), "repetition_penalty", 0.0, None,
                                         low_open=True),
                stop=_stop_strings(get("stop", [])),
                stop_token_ids=[_int(t, "stop_token_ids[]", 0, MAX_TOKEN_ID)
                                for t in _list(get("stop_token_ids", []), "stop_token_ids", MAX_STOPS)],
                **{k: _bool(get(k, default), k) for k, default in _FLAGS.items()})
        if p.top_k == 0:
            raise BadRequest("sampling_params.top_k must be -1 (off) or >= 1, got 0")
        return p


MAX_TOKENS = 1 << 20         # far above any context length; the engine checks the real one
MAX_TOP_K = 1 << 30
MAX_TOKEN_ID = (1 << 31) - 1
MAX_STOPS, MAX_STOP_CHARS = 64, 1024
_FLAGS = {"ignore_eos": False, "skip_special_tokens": True, "no_stop_trim": False,
          "spaces_between_special_tokens": True}


def _int(v, name: str, low: int, high: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRequest(f"sampling_params.{name} must be an integer, got {v!r}")
    if not low <= v <= high:
        raise BadRequest(f"sampling_params.{name} must be in [{low}, {high}], got {v}")
    return v


def _real(v, name: str, low: float, high: float | None, low_open: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise BadRequest(f"sampling_params.{name} must be a number, got {v!r}")
    v = float(v)
    if v != v or v in (float("inf"), float("-inf")):
        raise BadRequest(f"sampling_params.{name} must be finite, got {v}")
    if v != 0 and not FLOAT32_TINY <= abs(v) <= FLOAT32_MAX:  # the tensors are float32: 1e-45 is 0 there
        raise BadRequest(f"sampling_params.{name}={v!r} is not representable in float32 (it would be "
                         f"{'inf' if abs(v) > FLOAT32_MAX else '0 or subnormal'})")
    if (v <= low if low_open else v < low) or (high is not None and v > high):
        span = f"{'(' if low_open else '['}{low}, {high if high is not None else 'inf'}]"
        raise BadRequest(f"sampling_params.{name} must be in {span}, got {v}")
    return v


def _bool(v, name: str) -> bool:
    if not isinstance(v, bool):
        raise BadRequest(f"sampling_params.{name} must be true or false, got {v!r}")
    return v


def _list(v, name: str, max_len: int) -> list:
    if not isinstance(v, list) or len(v) > max_len:
        raise BadRequest(f"sampling_params.{name} must be a list of at most {max_len} entries, got {v!r:.100}")
    return v


def _stop_strings(v) -> list[str]:
    stops = [v] if isinstance(v, str) else _list(v, "stop", MAX_STOPS)
    for x in stops:
        if not isinstance(x, str) or not 0 < len(x) <= MAX_STOP_CHARS:
            raise BadRequest(f"sampling_params.stop entries must be non-empty strings of at most {MAX_STOP_CHARS} "
                             f"characters, got {x!r:.100}")
    return stops


def sample_next(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor,
                min_p: torch.Tensor, generator: torch.Generator | None = None,
                return_original_logprob: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return (token ids [B], log-probs [B]).

    logits: [B, V] float32 (already masked for min_new_tokens); temperature 0 means greedy for that row;
    top_k <= 0 or >= V means off. Top-k, then top-p (smallest prefix of the sorted distribution whose mass
    reaches top_p, always keeping the best token), then min-p act on the temperature-scaled probabilities.
    One fused softmax pass gives both the sampling distribution and the returned log-prob (log of the
    sampled token's probability); the division is skipped when every row has temperature 1 or 0.
    """
    logits = logits.float()
    greedy = temperature < GREEDY_EPS
    unit_t = bool(((temperature == 1.0) | greedy).all())
    scaled = logits if unit_t else logits / torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
    probs = torch.softmax(scaled, dim=-1)
    if bool(greedy.all()):
        tokens = logits.argmax(dim=-1)
    else:
        V = probs.shape[-1]
        if bool(((top_k > 0) & (top_k < V)).any() or (top_p < 1).any() or (min_p > 0).any()):
            sorted_p, order = probs.sort(dim=-1, descending=True)
            rank = torch.arange(V).expand_as(sorted_p)
            k = torch.where(top_k > 0, top_k, torch.full_like(top_k, V))
            drop = rank >= k[:, None]
            cum_before = sorted_p.cumsum(dim=-1) - sorted_p  # mass of strictly better tokens
            drop |= cum_before >= top_p[:, None]
            drop |= sorted_p < (min_p[:, None] * sorted_p[:, :1])
            drop[:, 0] = False
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            sampled = order.gather(-1, _categorical(sorted_p, generator)[:, None]).squeeze(-1)
        else:
            sampled = _categorical(probs, generator)
        tokens = torch.where(greedy, logits.argmax(dim=-1), sampled) if bool(greedy.any()) else sampled
    if return_original_logprob and not unit_t:
        return tokens, torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
    return tokens, probs.gather(-1, tokens[:, None]).squeeze(-1).log()


def _categorical(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row from unnormalised probabilities by inverse CDF: the first index whose cumulative mass
    reaches u * total, u ~ U(0, 1]. Same law as torch.multinomial, one uniform per row, and several times
    cheaper on CPU for [batch, vocab] inputs. A zero-probability entry never wins (the CDF does not rise there)."""
    cdf = probs.cumsum(dim=-1)
    u = (1.0 - torch.rand(probs.shape[0], 1, generator=generator)) * cdf[:, -1:]  # in (0, total]
    return torch.searchsorted(cdf, u).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def apply_repetition_penalty(logits: torch.Tensor, seen: list, penalty: float) -> None:
    """In place, one row: SGLang's / transformers' repetition penalty over the tokens already in the prompt or
    the output: a positive logit is divided by `penalty`, a negative one multiplied (so > 1 discourages repeats)."""
    ids = torch.tensor(sorted({t for t in seen if t < logits.shape[-1]}), dtype=torch.long)
    if ids.numel():
        picked = logits[ids]
        logits[ids] = torch.where(picked > 0, picked / penalty, picked * penalty)
