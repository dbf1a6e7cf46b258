"""Project only the response-scoring positions through the LM head (issue 26, memory).

megatron-core's GPTModel runs its output layer over every position of the micro-batch: `[S, b, V/tp]` logits, whose
fp32 copies in the loss are the step's peak at a 151,936-token vocabulary, while the loss reads only the positions
that score a response token (micro_batch.response_positions_only). A forward pre-hook on the last stage's output
layer keeps those rows of the decoder's final hidden states, `[S, b, H] -> [P, b, H]` (`logit_positions` `[b, P]`,
positions in this rank's row: a context-parallel rank's own chunks), so the chunk returns `[b, P, V/tp]`.

Sequence parallelism: the hidden states reach the output layer split over TP along the sequence and the layer
all-gathers them itself. The hook gathers them first (its backward keeps this rank's part of the gradient) and turns
the layer's sequence parallelism off for the call, as megatron-core's own last-token inference path does; the layer
then takes the input as replicated and all-reduces its gradient over TP. All-reduce then split is the reduce-scatter
the layer's sequence-parallel backward would have done, so gradients are unchanged. A post-hook (and the context
manager, should the forward raise) restore the flag.

With MTP layers (--enable-mtp-training, mtp.py) megatron-core runs the output layer once per MTP layer first (their
cross entropies read whole sequences) and then for the main model: only that last call is projected.
"""
from __future__ import annotations

import contextlib

import torch


class ResponseRows:
    """The hooks on one output layer; `positions` is set by `projecting` around one forward of its chunk."""

    def __init__(self, output_layer, mtp_calls: int = 0):
        self.layer, self.mtp_calls = output_layer, mtp_calls
        self.positions: torch.Tensor | None = None
        self.calls = 0  # output-layer calls of the current forward
        self._restore_sequence_parallel = False
        output_layer.register_forward_pre_hook(self._keep_rows)
        output_layer.register_forward_hook(self._restore)

    def _keep_rows(self, layer, args):
        self.calls += 1
        if self.positions is None or self.calls <= self.mtp_calls:
            return None
        hidden = args[0]
        if getattr(layer, "sequence_parallel", False):
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False,
                                                          group=layer.tp_group)
            layer.sequence_parallel, self._restore_sequence_parallel = False, True
        positions = self.positions.to(hidden.device)
        batch = torch.arange(positions.shape[0], device=hidden.device)
        return (hidden[positions.t(), batch[None, :]], *args[1:])  # [P, b, H]

    def _restore(self, layer, args, output):
        self.restore()

    def restore(self):
        if self._restore_sequence_parallel:
            self.layer.sequence_parallel, self._restore_sequence_parallel = True, False


def attach(model) -> None:
    """Install the hooks on a GPTModel chunk that holds the LM head (the last pipeline stage's last chunk)."""
    model.response_rows = ResponseRows(model.output_layer, model.config.mtp_num_layers or 0)


def _rows_of(chunk) -> ResponseRows | None:
    while not hasattr(chunk, "response_rows") and hasattr(chunk, "module"):  # DDP / Float16Module wrappers
        chunk = chunk.module
    return getattr(chunk, "response_rows", None)


@contextlib.contextmanager
def projecting(chunk, positions: torch.Tensor | None):
    """Run `chunk`'s forward inside this to get its output at `positions` `[b, P]` only (None, or a chunk without
    the LM head: the whole output / the hidden states, unchanged)."""
    rows = _rows_of(chunk) if positions is not None else None
    if rows is None:
        yield
        return
    rows.positions, rows.calls = positions, 0
    try:
        yield
    finally:
        rows.positions = None
        rows.restore()
