"""The trainer's view of a rollout batch: optimizer-step split, micro-batches, padded or packed model inputs.

`batch` is one data-parallel rank's share of a rollout, the columnar dict of docs/architecture.md
(`tokens`, `response_lengths`, `loss_masks`, `rewards`, `rollout_log_probs`, ... one entry per sample)
plus per-sample 1-D tensors the trainer added (`log_probs`, `ref_log_probs`, `values`, `advantages`,
`returns`).

Position convention (next-token prediction): a sample of total length L with a response of R tokens
has its response tokens at positions [L-R, L); the logits that score them sit one position earlier,
at [L-R-1, L-1). Every per-token quantity the trainer computes (log-probs, entropy, values) is taken at
those logit positions, so all of them line up with `loss_masks` and `rollout_log_probs`.

Two layouts of a micro-batch:
- padded: `[b, S]` rows, right-padded to the longest sample; with causal attention right padding never
  leaks into the real tokens, so no attention mask is needed.
- packed (`--use-dynamic-batch-size`): all samples concatenated into one `[1, sum L]` row, no padding.
  Position ids restart at 0 for each sample. Attention must not cross samples: with the local
  (non-TransformerEngine) layer spec that is a block-diagonal causal boolean mask `[1, 1, S, S]`
  (True = masked, mcore's convention); with TransformerEngine it is `PackedSeqParams(qkv_format="thd")`
  with cumulative sequence lengths, which never materialises an S x S mask.
Under context parallelism (--context-parallel-size > 1) a rank's micro-batch is its 2 chunks of every sample in one
THD row, and the per-token columns hold only the response tokens it scores (cp_layout.py).
"""
from __future__ import annotations

import itertools
import torch

from slime_like.backends.training.micro_batch import (MicroBatch, block_causal_mask, fixed_micro_batches,
                                                      multimodal_inputs, packed_micro_batches, packed_seq_params_for,
                                                      to_device)

REQUIRED_KEYS = ("tokens", "response_lengths", "loss_masks")


def num_samples(batch: dict) -> int:
    return len(batch["tokens"])


def validate_batch(batch: dict, need: tuple[str, ...] = ()) -> None:
    """Check the columns we read exist, have one entry per sample, and per-token columns have length R.

    Raises ValueError naming the key, the sample and the expected length, before any forward pass.
    """
    for key in REQUIRED_KEYS + tuple(need):
        if key not in batch:
            hint = ""
            if key in ("advantages", "returns"):
                hint = " (call compute_advantages(batch) first and add its result to the batch)"
            elif key in ("log_probs", "ref_log_probs"):
                hint = " (call compute_log_probs(batch) first and add its result to the batch)"
            elif key == "values":
                hint = " (call the critic's compute_values(batch) first and add its result to the batch)"
            raise ValueError(f"trainer batch is missing key {key!r}{hint}; it has {sorted(batch)}")
    n = num_samples(batch)
    for key in REQUIRED_KEYS + tuple(need):
        if len(batch[key]) != n:
            raise ValueError(f"trainer batch key {key!r} has {len(batch[key])} entries but 'tokens' has {n}")
    per_token = [k for k in ("loss_masks", "rollout_log_probs", "log_probs", "ref_log_probs", "teacher_log_probs",
                             "values", "advantages", "returns") if k in batch and (k in REQUIRED_KEYS or k in need)]
    for i in range(n):
        total, resp = len(batch["tokens"][i]), int(batch["response_lengths"][i])
        if not 0 < resp < total:
            raise ValueError(f"sample {i}: response_length {resp} must be in [1, len(tokens)-1] = [1, {total - 1}]"
                             " (a response needs at least one prompt token before it to be scored)")
        for key in per_token:
            if len(batch[key][i]) != resp:
                raise ValueError(f"sample {i}: batch[{key!r}] has {len(batch[key][i])} entries, expected the "
                                 f"response length {resp}")


def split_steps(n: int, num_steps: int, global_batch_size: int | None, dp_size: int,
                exact: bool = True) -> list[list[int]]:
    """Sample indices of each optimizer step: `num_steps` consecutive chunks of `global_batch_size / dp`.

    The rollout gives every DP rank `num_steps * global_batch_size / dp` samples; any other count means
    the flags and the rollout disagree, which we report instead of silently dropping samples. `exact=False`
    (a custom generate function may return several samples per prompt, as slime allows): any count of at
    least `num_steps` is split into `num_steps` consecutive chunks whose sizes differ by at most one.
    """
    if num_steps < 1:
        raise ValueError(f"--num-steps-per-rollout must be >= 1, got {num_steps}")
    if not exact and n >= num_steps:
        bounds = [round(s * n / num_steps) for s in range(num_steps + 1)]
        return [list(range(bounds[s], bounds[s + 1])) for s in range(num_steps)]
    if global_batch_size:
        if global_batch_size % dp_size:
            raise ValueError(f"--global-batch-size {global_batch_size} is not divisible by the data-parallel "
                             f"size {dp_size}; choose a multiple of {dp_size}")
        per_step = global_batch_size // dp_size
        if per_step * num_steps != n:
            raise ValueError(
                f"this data-parallel rank got {n} samples but --num-steps-per-rollout {num_steps} x "
                f"--global-batch-size {global_batch_size} / dp {dp_size} = {per_step * num_steps}; set "
                "--global-batch-size to rollout_batch_size * n_samples_per_prompt / num_steps_per_rollout")
    else:
        if n % num_steps:
            raise ValueError(f"{n} samples on this rank do not split into --num-steps-per-rollout {num_steps} "
                             "equal optimizer steps")
        per_step = n // num_steps
    return [list(range(s * per_step, (s + 1) * per_step)) for s in range(num_steps)]


def at_least(groups: list[list[int]], count: int) -> list[list[int]]:
    """`groups` with the largest split in halves until there are `count` (megatron-core's interleaved pipeline
    schedule runs at least PP micro-batches). A split group stays within its token budget and keeps its order."""
    groups = [list(g) for g in groups]
    while len(groups) < count:
        big = max(range(len(groups)), key=lambda i: len(groups[i]))
        if len(groups[big]) < 2:
            n = sum(map(len, groups))
            raise ValueError(f"the interleaved pipeline schedule (--num-virtual-stages-per-pipeline-rank / "
                             f"--num-layers-per-virtual-pipeline-stage) runs at least {count} micro-batches "
                             f"(--pipeline-model-parallel-size) per pass, but this data-parallel rank got {n} "
                             "sample(s): raise --global-batch-size (samples per optimizer step) or drop the "
                             "interleaved schedule")
        half = (len(groups[big]) + 1) // 2
        groups[big:big + 1] = [groups[big][:half], groups[big][half:]]
    return groups


def _length(v) -> int:
    if torch.is_tensor(v):
        return v.numel()
    return len(v) if hasattr(v, "__len__") else 1  # a per-sample scalar (e.g. a reward) is one entry


def _flat(values: list, dtype) -> torch.Tensor:
    """All of `values` (ragged 1-D sequences) concatenated into one 1-D tensor, in one conversion.

    A rollout batch holds either python lists (tokens, loss masks) or 1-D tensors (log-probs, advantages);
    one `torch.tensor` / `torch.cat` over the whole column costs a fraction of one call per sample.
    """
    if not values:
        return torch.zeros(0, dtype=dtype)
    if all(torch.is_tensor(v) for v in values):
        return torch.cat([v.reshape(-1) for v in values]).to(dtype)
    if all(isinstance(v, (list, tuple)) for v in values):
        return torch.tensor(list(itertools.chain.from_iterable(values)), dtype=dtype)
    return torch.cat([torch.as_tensor(v, dtype=dtype).reshape(-1) for v in values])


def pad_rows(values: list, width: int, dtype=torch.float32, lengths: list[int] | None = None) -> torch.Tensor:
    """Stack ragged 1-D sequences into `[n, width]`, zero-padded on the right."""
    lengths = [_length(v) for v in values] if lengths is None else lengths
    out = torch.zeros(len(values), width, dtype=dtype)
    out[torch.arange(width) < torch.tensor(lengths, dtype=torch.long)[:, None]] = _flat(values, dtype)
    return out


class PackedBatch:
    """A rollout batch as tensors, packed once: each column one flat 1-D tensor plus per-sample offsets.

    `tokens` is every sample's token ids concatenated (one conversion of the whole column); a per-token
    column (`loss_masks`, log-probs, advantages, ...) is packed the first time a micro-batch asks for it.
    build_micro_batch then only indexes these tensors: no per-token Python list between the rollout batch
    and the loss, however many micro-batches and passes (scoring, each optimizer step) read the batch.
    """

    def __init__(self, batch: dict):
        self.batch = batch
        self.tokens, self.tok_start, self.tok_len = self._pack(batch["tokens"], torch.long)
        self.resp_len = torch.tensor([int(r) for r in batch["response_lengths"]], dtype=torch.long)
        self._token_source = batch["tokens"]
        self._columns: dict = {}

    @staticmethod
    def _pack(values: list, dtype):
        lens = torch.tensor([_length(v) for v in values], dtype=torch.long)
        return _flat(values, dtype), torch.cumsum(lens, 0) - lens, lens

    def packs(self, batch: dict) -> bool:
        """Whether this packing still describes `batch` (the same dict holding the same token column)."""
        return batch is self.batch and batch["tokens"] is self._token_source

    def column(self, key: str, dtype=torch.float32):
        """(flat values, start of each sample, entries of each sample) of a ragged per-sample column."""
        source = self.batch[key]
        cached = self._columns.get((key, dtype))
        if cached is None or cached[0] is not source:  # a column replaced since (e.g. new advantages)
            cached = self._columns[key, dtype] = (source, self._pack(source, dtype))
        return cached[1]

    def padded(self, key: str, ids: torch.Tensor, width: int, dtype=torch.float32) -> torch.Tensor:
        """Samples `ids` of column `key` as `[n, width]` rows, zero-padded on the right (pad_rows' result)."""
        flat, start, lens = self.column(key, dtype)
        j = torch.arange(width)[None, :]
        inside = j < lens[ids][:, None]
        if flat.numel() == 0:
            return torch.zeros(len(ids), width, dtype=dtype)
        gathered = flat[(start[ids][:, None] + j).clamp(max=flat.numel() - 1)]
        return torch.where(inside, gathered, torch.zeros((), dtype=dtype))

    def gathered(self, key: str, ids: torch.Tensor, index: torch.Tensor, valid: torch.Tensor,
                 dtype=torch.float32) -> torch.Tensor:
        """Entries `index[k, j]` of sample ids[k] of column `key`, zero where `valid` is 0 (a CP rank's tokens)."""
        flat, start, _ = self.column(key, dtype)
        if flat.numel() == 0:
            return torch.zeros(index.shape, dtype=dtype)
        return flat[(start[ids][:, None] + index).clamp(max=flat.numel() - 1)] * valid.to(dtype)


def build_micro_batch(batch, sample_ids: list[int], packed: bool, use_te: bool = False,
                      field_keys: tuple[str, ...] = (), pad_id: int = 0, device=None) -> MicroBatch:
    """Turn samples `sample_ids` of the batch (a columnar dict or its PackedBatch) into model inputs plus
    response gather indices. Every tensor is gathered from the PackedBatch's flat columns."""
    pb = batch if isinstance(batch, PackedBatch) else PackedBatch(batch)
    ids = torch.tensor(sample_ids, dtype=torch.long)
    lens_t, resp_t, gstart = pb.tok_len[ids], pb.resp_len[ids], pb.tok_start[ids]
    n, rmax, width = len(sample_ids), int(resp_t.max()), int(lens_t.max())
    j = torch.arange(rmax)[None, :]
    valid = (j < resp_t[:, None]).float()
    step = j * valid.long()  # padded response slots repeat the sample's first response position
    if packed:
        starts = torch.cumsum(lens_t, 0) - lens_t  # where each sample begins in the packed row
        total = int(lens_t.sum())
        offset = torch.repeat_interleave(starts, lens_t, output_size=total)
        position_ids = (torch.arange(total) - offset)[None]
        tokens = pb.tokens[torch.repeat_interleave(gstart, lens_t, output_size=total) + position_ids[0]][None]
        rows = torch.zeros(n, rmax, dtype=torch.long)
        first_logit = starts + lens_t - resp_t - 1
        lens = lens_t.tolist()
        attention_mask = None if use_te else block_causal_mask(lens)
        psp = packed_seq_params_for(lens, device) if use_te else None
    else:
        cols = torch.arange(width)[None, :]
        inside = cols < lens_t[:, None]
        gathered = pb.tokens[(gstart[:, None] + cols).clamp(max=pb.tokens.numel() - 1)]
        tokens = torch.where(inside, gathered, torch.full((), pad_id, dtype=torch.long))
        position_ids = cols.expand(n, -1).contiguous()
        rows = torch.arange(n)[:, None].expand(n, rmax).contiguous()
        first_logit = lens_t - resp_t - 1
        attention_mask, psp = None, None
    # Padded response slots point at the sample's first logit: a valid index whose value is masked out.
    cols = first_logit[:, None] + step
    targets = pb.tokens[(gstart + lens_t - resp_t)[:, None] + step] * valid.long()
    loss_mask = pb.padded("loss_masks", ids, rmax) * valid
    fields = {key: pb.padded(key, ids, rmax) for key in field_keys if key in pb.batch}
    mb = MicroBatch(sample_ids, tokens, position_ids, attention_mask, psp, rows, cols, targets, valid, loss_mask,
                    fields, multimodal_inputs(pb.batch, sample_ids))
    return to_device(mb, device)


def unpad_rows(x: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]:
    """Inverse of pad_rows: per-sample 1-D float32 CPU tensors."""
    x = x.detach().float().cpu()
    return [x[k, :r].clone() for k, r in enumerate(lengths)]


class MicroBatcher:
    """The micro-batches of one trainer rank: fixed-size groups of similar length, or token-budget groups
    (--use-dynamic-batch-size) packed into one row where the backend's attention allows it (`pack_rows`)."""

    def __init__(self, args, *, pack_rows: bool, use_te: bool, device, min_micro_batches: int = 1,
                 cp: tuple[int, int] = (1, 0), row_multiple: int = 1):
        self.args, self.pack_rows, self.use_te, self.device = args, pack_rows, use_te, device
        self.min_micro_batches = min_micro_batches  # the interleaved pipeline schedule needs >= PP of them
        self.cp, self.row_multiple = cp, row_multiple  # (CP size, CP rank); cp_layout.py when the size is > 1
        self.packed_batch = None

    def reset(self) -> None:
        """A new public trainer call: its batch is packed afresh (a rollout-data hook may have edited it)."""
        self.packed_batch = None

    def split(self, batch: dict, indices: list[int], field_keys=(), max_tokens: int | None = None) -> list:
        args = self.args
        packed = bool(args.use_dynamic_batch_size)
        # One tensor conversion per column for every micro-batch of every pass over this call's batch (the
        # actor's, reference's and teacher's scoring; each optimizer step of train_step).
        if self.packed_batch is None or not self.packed_batch.packs(batch):
            self.packed_batch = PackedBatch(batch)
        if args.shared_prompt_training:  # one row per micro-batch, prompts once (shared_prompt.py)
            return self._split_shared(indices, field_keys, max_tokens)
        if packed:
            lengths = [len(t) for t in batch["tokens"]]
            groups = packed_micro_batches(indices, lengths, max_tokens or args.max_tokens_per_gpu)
        else:
            # Similar lengths share a micro-batch, so rows carry less padding (demo shape: ~16% fewer tokens).
            # The step's loss is a token sum over all its micro-batches: grouping changes only float rounding.
            by_length = sorted(indices, key=lambda i: len(batch["tokens"][i]))
            groups = fixed_micro_batches(by_length, args.micro_batch_size)
        groups = at_least(groups, self.min_micro_batches)
        if self.cp[0] > 1:  # each sample cut into 2 x CP chunks (or, --allgather-cp, the stream into CP pieces)
            from slime_like.backends.training import cp_layout

            build = cp_layout.build_allgather_cp_micro_batch if args.allgather_cp \
                else cp_layout.build_cp_micro_batch
            return [to_device(build(self.packed_batch, g, *self.cp, row_multiple=self.row_multiple,
                                    field_keys=field_keys), self.device) for g in groups]
        return [build_micro_batch(self.packed_batch, g, packed=packed and self.pack_rows, use_te=self.use_te,
                                  field_keys=field_keys, device=self.device) for g in groups]

    def _split_shared(self, indices: list[int], field_keys, max_tokens: int | None) -> list:
        from slime_like.backends.training import shared_prompt

        args = self.args
        dynamic = bool(args.use_dynamic_batch_size)
        groups = shared_prompt.micro_batch_groups(
            self.packed_batch, indices, micro_batch_size=None if dynamic else args.micro_batch_size,
            max_tokens=(max_tokens or args.max_tokens_per_gpu) if dynamic else None)
        groups = at_least(groups, self.min_micro_batches)
        return [shared_prompt.build_shared_micro_batch(self.packed_batch, g, field_keys, self.device) for g in groups]

    def for_scoring(self, batch: dict) -> list:
        """Every sample of the batch, under --log-probs-max-tokens-per-gpu's budget when set."""
        max_tokens = self.args.log_probs_max_tokens_per_gpu or self.args.max_tokens_per_gpu
        return self.split(batch, list(range(num_samples(batch))), max_tokens=max_tokens)
