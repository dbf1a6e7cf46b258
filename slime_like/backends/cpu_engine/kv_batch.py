"""The running batch: a left-padded KV cache whose rows can be added and dropped between decode steps.

This is what makes continuous batching possible on top of a plain transformers model: requests that arrive
while a batch decodes are prefilled on their own, then *merged* into the running cache (both sides are padded on
the left to the same length), and finished rows are *dropped* (index_select; leading columns that are padding for
every remaining row are trimmed). Each row carries

    mask[b, j]   1 where cache column j holds a real token of row b, 0 for left padding
    next_pos[b]  the RoPE position of row b's next token = number of real tokens it has so far
    rope_delta[b]  0 for text; a vision-language row's M-RoPE offset (its image tokens take fewer positions
                 than tokens), added to next_pos on all three axes

so position ids stay correct under any padding (they never depend on the column index).

The cache layers grow by doubling a preallocated buffer instead of ``torch.cat`` on every step, which keeps
a decode step O(new tokens) in copies rather than O(sequence length).
"""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class GrowableLayer(DynamicLayer):
    """A DynamicLayer that appends into a buffer with spare capacity (amortised O(1) per token).

    Row changes (drop finished rows, merge new ones, copy shared-prompt rows) each cost ONE copy into a fresh
    buffer that keeps spare capacity, so the next decode step appends in place instead of growing again."""

    def _adopt(self, kbuf: torch.Tensor, vbuf: torch.Tensor, length: int):
        """Use these [B, H, capacity, D] buffers; their first `length` columns are the cache."""
        self._kbuf, self._vbuf, self._len = kbuf, vbuf, length
        self.keys, self.values = kbuf[:, :, :length], vbuf[:, :, :length]
        self.dtype, self.device, self.is_initialized = kbuf.dtype, kbuf.device, True

    def _set(self, keys: torch.Tensor, values: torch.Tensor, spare: int = 0):
        B, H, T, D = keys.shape
        kbuf, vbuf = keys.new_empty(B, H, T + spare, D), values.new_empty(B, H, T + spare, D)
        kbuf[:, :, :T], vbuf[:, :, :T] = keys, values
        self._adopt(kbuf, vbuf, T)

    def select_rows(self, idx: torch.Tensor, start: int = 0, spare: int = 16):
        """Keep rows `idx` (in that order, repeats allowed) and drop the first `start` columns. Only the live
        columns are copied (gathered straight into the new buffer), not the old spare capacity."""
        B, H, _, D = self._kbuf.shape
        T = self._len - start
        bufs = []
        for old in (self._kbuf, self._vbuf):
            buf = old.new_empty(len(idx), H, T + spare, D)
            torch.index_select(old[:, :, start:self._len], 0, idx, out=buf[:, :, :T])
            bufs.append(buf)
        self._adopt(bufs[0], bufs[1], T)

    def append_rows(self, other: "GrowableLayer", T: int, spare: int = 32):
        """Append `other`'s rows; both sides end up left-padded to T columns (zeros: masked, but finite)."""
        Ba, Bb = self.keys.shape[0], other.keys.shape[0]
        bufs = []
        for a, b in ((self.keys, other.keys), (self.values, other.values)):
            _, H, _, D = a.shape
            buf = a.new_empty(Ba + Bb, H, T + spare, D)
            for rows, x in ((slice(0, Ba), a), (slice(Ba, Ba + Bb), b)):
                pad = T - x.shape[2]
                buf[rows, :, :pad].zero_()
                buf[rows, :, pad:T] = x
            bufs.append(buf)
        self._adopt(bufs[0], bufs[1], T)

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized or self._len == 0:
            self._set(key_states, value_states, spare=max(16, key_states.shape[-2]))
            return self.keys, self.values
        n = key_states.shape[-2]
        if self._len + n > self._kbuf.shape[-2]:
            self._set(self.keys, self.values, spare=max(n, self._len))
        self._kbuf[:, :, self._len:self._len + n] = key_states
        self._vbuf[:, :, self._len:self._len + n] = value_states
        self._len += n
        self.keys, self.values = self._kbuf[:, :, :self._len], self._vbuf[:, :, :self._len]
        return self.keys, self.values


def new_cache() -> DynamicCache:
    cache = DynamicCache()
    cache.layer_class_to_replicate = GrowableLayer
    return cache


def _layers(cache: DynamicCache) -> list[GrowableLayer]:
    return [layer for layer in cache.layers]


def _pad_left(x: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    if n == 0:
        return x
    shape = list(x.shape)
    shape[dim] = n
    return torch.cat([x.new_zeros(shape), x], dim=dim)


class RunningBatch:
    """Rows in a shared KV cache. `rows` is any per-row payload (the engine stores its Request objects)."""

    def __init__(self):
        self.rows: list = []
        self.cache: DynamicCache | None = None
        self.mask = torch.zeros(0, 0, dtype=torch.long)
        self.next_pos = torch.zeros(0, dtype=torch.long)
        self.rope_delta = torch.zeros(0, dtype=torch.long)
        self.last_tokens = torch.zeros(0, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.rows)

    def merge(self, other: "RunningBatch") -> None:
        """Append `other`'s rows; both caches are left-padded to the longer one."""
        if len(other) == 0:
            return
        if len(self) == 0:
            self.__dict__.update(other.__dict__)
            return
        Ta, Tb = self.mask.shape[1], other.mask.shape[1]
        T = max(Ta, Tb)
        for la, lb in zip(_layers(self.cache), _layers(other.cache)):
            la.append_rows(lb, T)
        self.mask = torch.cat([_pad_left(self.mask, T - Ta, 1), _pad_left(other.mask, T - Tb, 1)], dim=0)
        self.next_pos = torch.cat([self.next_pos, other.next_pos])
        self.rope_delta = torch.cat([self.rope_delta, other.rope_delta])
        self.last_tokens = torch.cat([self.last_tokens, other.last_tokens])
        self.rows = self.rows + other.rows

    def keep(self, keep_idx: list[int]) -> None:
        """Keep only the rows at `keep_idx` (in that order) and trim all-padding leading columns."""
        if len(keep_idx) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in keep_idx]
        if not keep_idx:
            self.__init__()
            return
        idx = torch.tensor(keep_idx, dtype=torch.long)
        mask = self.mask.index_select(0, idx)
        used = mask.any(dim=0).nonzero()
        start = int(used[0]) if len(used) else mask.shape[1]
        self.mask = mask[:, start:]
        for layer in _layers(self.cache):
            layer.select_rows(idx, start)
        self.next_pos = self.next_pos.index_select(0, idx)
        self.rope_delta = self.rope_delta.index_select(0, idx)
        self.last_tokens = self.last_tokens.index_select(0, idx)


@torch.inference_mode()
def prefill(model, prompts: list[list[int]], rows: list, images: list | None = None,
            vision_inputs=None) -> tuple[RunningBatch, torch.Tensor]:
    """Run the prompts (left-padded) through the model; return the new batch and last-position logits [B, V].

    Identical prompts (the n samples of one RL prompt, sent together) are computed once and their KV rows
    copied: prefill work scales with the distinct prompts, like a prefix cache hit in SGLang. A vision-language
    model passes each prompt's `images` (an object with a `key` naming its pixels, or None) and
    `vision_inputs(ids, mask, distinct_images) -> (forward kwargs with position_ids, rope deltas [B])`; prompts
    are identical only with identical images."""
    images = list(images) if images is not None else [None] * len(prompts)
    index: dict[tuple, int] = {}
    which = [index.setdefault((tuple(p), getattr(im, "key", None)), len(index)) for p, im in zip(prompts, images)]
    distinct = [list(p) for p, _ in index]
    first = {}
    for j, i in enumerate(which):
        first.setdefault(i, j)
    distinct_images = [images[first[i]] for i in range(len(distinct))]
    T = max(len(p) for p in distinct)
    ids = torch.zeros(len(distinct), T, dtype=torch.long)
    mask = torch.zeros(len(distinct), T, dtype=torch.long)
    for i, p in enumerate(distinct):
        ids[i, T - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, T - len(p):] = 1
    if vision_inputs is None:
        extra = {"position_ids": (mask.cumsum(dim=1) - 1).clamp(min=0)}
        deltas = torch.zeros(len(distinct), dtype=torch.long)
    else:
        extra, deltas = vision_inputs(ids, mask, distinct_images)
    batch = RunningBatch()
    batch.cache = new_cache()
    out = model(input_ids=ids, attention_mask=mask, past_key_values=batch.cache, use_cache=True, logits_to_keep=1,
                **extra)
    logits = out.logits[:, -1, :]
    if len(distinct) < len(prompts):
        idx = torch.tensor(which, dtype=torch.long)
        for layer in _layers(batch.cache):
            layer.select_rows(idx)
        mask, logits, deltas = mask.index_select(0, idx), logits.index_select(0, idx), deltas.index_select(0, idx)
    batch.rows, batch.mask = list(rows), mask
    batch.next_pos = mask.sum(dim=1)
    batch.rope_delta = deltas
    return batch, logits


@torch.inference_mode()
def decode_step(model, batch: RunningBatch) -> torch.Tensor:
    """Feed each row's last token; return logits [B, V]."""
    batch.mask = torch.cat([batch.mask, torch.ones(len(batch), 1, dtype=torch.long)], dim=1)
    # a 2-D position is the same on M-RoPE's three axes (transformers' Qwen-VL text models expand it)
    out = model(input_ids=batch.last_tokens[:, None], attention_mask=batch.mask,
                position_ids=(batch.next_pos + batch.rope_delta)[:, None], past_key_values=batch.cache, use_cache=True)
    batch.next_pos = batch.next_pos + 1
    return out.logits[:, -1, :]
