"""One forward pass's inputs (MicroBatch) and the attention descriptions of a packed row (block-causal mask for the
local spec, THD cumulative lengths for TransformerEngine): what data.py builds, cp_layout.py builds under context
parallelism, shared_prompt.py builds for --shared-prompt-training, and the losses and attention modules read; and the
helpers those builders share (fixed-size micro-batches, a micro-batch's images, the move to the device)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch


@dataclass
class MicroBatch:
    """Model inputs for one forward pass and where each sample's response logits sit in its output.

    `rows[k, j]`, `cols[k, j]`: output position scoring response token j of the k-th sample;
    `targets[k, j]`: that token id; `valid[k, j]`: 1 for j < R_k (0 pads the ragged responses to Rmax);
    `loss_mask` is `valid` times the sample's loss mask. Per-sample tensors of the batch (advantages, ...)
    are padded the same way into `fields[key]` `[n, Rmax]`.
    """

    sample_ids: list[int]
    tokens: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    packed_seq_params: object | None
    rows: torch.Tensor
    cols: torch.Tensor
    targets: torch.Tensor
    valid: torch.Tensor
    loss_mask: torch.Tensor
    fields: dict = field(default_factory=dict)
    multimodal: dict | None = None  # `pixel_values` / `image_grid_thw` of the samples' images (multimodal_inputs)
    # context parallelism (cp_layout.py): the response token each [n, M] slot holds, and the whole lengths
    response_index: torch.Tensor | None = None
    full_response_lengths: list[int] | None = None
    # Set by response_positions_only: the `[b, P]` sequence positions the model's output holds (None: all of them),
    # and `cols` as they were (positions in the token sequence).
    logit_positions: torch.Tensor | None = None
    source_cols: torch.Tensor | None = None
    # --shared-prompt-training (shared_prompt.py): `position_ids` are each token's rotary position, not its row index
    per_token_positions: bool = False

    @property
    def response_lengths(self) -> list[int]:
        if self.full_response_lengths is not None:
            return self.full_response_lengths
        return [int(x) for x in self.valid.sum(1).tolist()]

    @property
    def sequence_cols(self) -> torch.Tensor:
        """`cols` as positions in the token sequence, whatever the output holds."""
        return self.cols if self.source_cols is None else self.source_cols


def response_positions_only(mb: MicroBatch) -> MicroBatch:
    """The micro-batch for a model that projects only the response-scoring positions through its output layer
    (transformers' 2-D integer `logits_to_keep`, the Megatron trainer's response_rows hook): its output is `[b, P,
    V]` instead of `[b, S, V]`, so the fp32 logits of the prompts (and of the padding) are never built. A packed row
    (b = 1, rows = 0) keeps its samples' valid scoring positions, P = sum of the response lengths; padded rows hold
    one sample each (rows[k] = k) and keep `cols` row by row, P = Rmax. `cols` is re-pointed into the kept
    positions, `rows` is unchanged."""
    b = mb.tokens.shape[0]
    if b == 1:
        valid = mb.valid.bool()
        kept = torch.zeros_like(mb.cols)
        kept[valid] = torch.arange(int(valid.sum()), device=mb.cols.device)
        positions = mb.cols[valid] if valid.any() else mb.cols.reshape(-1)[:1]  # a CP rank may score none
        return replace(mb, cols=kept, logit_positions=positions[None], source_cols=mb.cols)
    per_row = mb.cols.numel() // b
    kept = torch.arange(mb.cols.numel(), device=mb.cols.device).view_as(mb.cols) % per_row
    return replace(mb, cols=kept, logit_positions=mb.cols.reshape(b, per_row), source_cols=mb.cols)


def block_causal_mask(lengths: list[int]) -> torch.Tensor:
    """`[1, 1, S, S]` boolean mask, True = do not attend: causal inside each sample, nothing across samples."""
    total = sum(lengths)
    seq_id = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    same = seq_id[:, None] == seq_id[None, :]
    causal = torch.ones(total, total, dtype=torch.bool).tril()
    return ~(same & causal)[None, None]


def packed_seq_params_for(lengths: list[int], device=None):
    """TransformerEngine's THD description of a packed row (GPU path): cumulative sequence lengths."""
    from megatron.core.packed_seq_params import PackedSeqParams

    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=device)
    cu[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int32, device=device), 0)
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                           max_seqlen_q=max(lengths), max_seqlen_kv=max(lengths))


def fixed_micro_batches(indices: list[int], micro_batch_size: int) -> list[list[int]]:
    """Consecutive groups of `--micro-batch-size` samples (the last group may be smaller)."""
    if micro_batch_size < 1:
        raise ValueError(f"--micro-batch-size must be >= 1, got {micro_batch_size}")
    return [indices[i:i + micro_batch_size] for i in range(0, len(indices), micro_batch_size)]


def check_token_budget(indices: list[int], lengths, max_tokens) -> None:
    """--max-tokens-per-gpu must hold every sample: a sample is never split."""
    if not max_tokens or max_tokens < 1:
        raise ValueError("--use-dynamic-batch-size needs --max-tokens-per-gpu > 0 "
                         f"(got {max_tokens!r}); e.g. --max-tokens-per-gpu 4096")
    too_long = [(i, lengths[i]) for i in indices if lengths[i] > max_tokens]
    if too_long:
        i, length = too_long[0]
        raise ValueError(f"sample {i} has {length} tokens, more than --max-tokens-per-gpu {max_tokens}; a sample "
                         f"is never split, so raise --max-tokens-per-gpu to at least {max(l for _, l in too_long)}")


def first_fit_decreasing(items: list[int], sizes, capacity: int) -> list[list[int]]:
    """`items` (ids; `sizes[id]` each, none above `capacity`) in as few bins of <= `capacity` as first-fit-decreasing
    finds, ties by id. Each bin keeps its ids sorted and bins are ordered by their first id: reproducible run to run."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(items, key=lambda j: (-sizes[j], j)):
        for b, free in enumerate(room):
            if sizes[i] <= free:
                bins[b].append(i)
                room[b] -= sizes[i]
                break
        else:
            bins.append([i])
            room.append(capacity - sizes[i])
    return sorted((sorted(b) for b in bins), key=lambda b: b[0])


def packed_micro_batches(indices: list[int], lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Pack whole samples into as few micro-batches of <= `max_tokens` tokens as first-fit-decreasing finds.

    A sample is never split. Each bin keeps its samples in batch order (only bin membership changes),
    and bins are ordered by their first sample, so results are reproducible run to run.
    """
    check_token_budget(indices, lengths, max_tokens)
    return first_fit_decreasing(indices, lengths, max_tokens)


def to_device(mb: MicroBatch, device) -> MicroBatch:
    """The micro-batch's tensors on `device` (None: stay on the CPU)."""
    if device is None:
        return mb
    for name in ("tokens", "position_ids", "rows", "cols", "targets", "valid", "loss_mask", "response_index"):
        if getattr(mb, name) is not None:
            setattr(mb, name, getattr(mb, name).to(device))
    if mb.attention_mask is not None:
        mb.attention_mask = mb.attention_mask.to(device)
    psp = mb.packed_seq_params
    if psp is not None and psp.cu_seqlens_q.device != device:
        psp.cu_seqlens_q = psp.cu_seqlens_kv = psp.cu_seqlens_q.to(device)
    mb.fields = {k: v.to(device) for k, v in mb.fields.items()}
    return mb


def multimodal_inputs(batch: dict, sample_ids: list[int]) -> dict | None:
    """The samples' images as one model input: `pixel_values` and `image_grid_thw` of every sample's
    `multimodal_train_inputs` (the processor's output; None for a text sample) concatenated in `sample_ids` order,
    the order of the samples' image tokens in the micro-batch (rows, or segments of a packed row), which is the
    order HF's VLMs fill image tokens in. None when no sample of the micro-batch has images."""
    column = batch.get("multimodal_train_inputs")
    items = [column[i] for i in sample_ids if column[i]] if column else []
    if not items:
        return None
    return {"pixel_values": torch.cat([torch.as_tensor(x["pixel_values"]) for x in items]).float(),
            "image_grid_thw": torch.cat([torch.as_tensor(x["image_grid_thw"], dtype=torch.long).reshape(-1, 3)
                                         for x in items])}
