"""Multi-token prediction (MTP) layers trained with the policy, as slime's --enable-mtp-training does.

With --enable-mtp-training the actor's GPTModel gets megatron-core's MultiTokenPredictionBlock (--mtp-num-layers
layers, on the last pipeline stage). MTP layer k reads the main model's final hidden state at position t and the
embedding of token t+k and predicts token t+k+1 through the shared output layer; megatron-core adds
`--mtp-loss-scaling-factor / mtp_num_layers x` its masked mean cross entropy to the gradient (MTPLossAutoScaler)
while the model's output stays the policy's logits. Here:

- `block_spec`: the MTP block spec for a chunk (None where it is not built: other roles, other stages);
- `hf_rule` / `vocab_copies`: the HF names of an MTP parameter (MiMo's `model.mtp_layers.N.*`, DeepSeek-V3 /
  GLM-4.5's `model.layers.<num_hidden_layers + N>.*`), so --hf-checkpoint loads them, HF exports and weight pushes
  carry them (SGLang's EAGLE / NextN drafts read exactly these names);
- `forward_kwargs` / `policy_logits`: the labels and loss mask megatron-core's MTP loss needs, and the policy
  logits recovered from the output layer (given labels, GPTModel would return the main cross entropy instead,
  computed in place over the logits: `attach` skips it);
- `take_step_loss`: the MTP loss of the last optimizer step for the metrics (mean over micro-batches, as slime).

The loss targets are the sample's own tokens: labels are the next tokens (the policy's targets), the loss mask
is the policy's (trained response tokens), and megatron-core rolls both one place per MTP layer, so MTP layer k
is scored on trained response tokens t+k+1 only.
"""
from __future__ import annotations

import re

import torch

# MTP-only parts: megatron-core's name -> the checkpoint's, per layout (hf_families.ModelFamily.mtp_layout).
# MiMo (XiaomiMiMo's modeling_mimo.py, SGLang's mimo_mtp.py): model.mtp_layers.N.*. DeepSeek-V3 / GLM-4.5 (SGLang's
# deepseek_nextn.py / glm4_moe_nextn.py): model.layers.<num_hidden_layers + N>.*, which also hold copies of the
# embedding and the LM head (embed_tokens, shared_head.head: vocab_copies).
_OWN = {
    "mimo": {"enorm.weight": "token_layernorm.weight", "hnorm.weight": "hidden_layernorm.weight",
             "eh_proj.weight": "input_proj.weight", "final_layernorm.weight": "final_layernorm.weight"},
    "appended": {"enorm.weight": "enorm.weight", "hnorm.weight": "hnorm.weight", "eh_proj.weight": "eh_proj.weight",
                 "final_layernorm.weight": "shared_head.norm.weight"},
}
_MTP = re.compile(r"^mtp\.layers\.(\d+)\.(.+)$")
_TRANSFORMER = "transformer_layer."


def _layout(args) -> str:
    from slime_like.config.hf_families import family_of

    return family_of({"model_type": args.hf_model_type}).mtp_layout


def _prefix(args, index: int) -> str:
    if _layout(args) == "mimo":
        return f"model.mtp_layers.{index}."
    return f"model.layers.{args.num_layers + index}."


def builds_mtp(args, role: str) -> bool:
    """Whether the `role` model gets MTP layers: the trained actor with --enable-mtp-training (the reference and
    the critic never use them)."""
    return bool(args.enable_mtp_training) and role == "actor"


def block_spec(config, layer_spec, use_te: bool, vp_stage=None):
    """megatron-core's MTP block spec for this chunk: its transformer layer is the decoder's (the last layer's
    spec), None on chunks that do not hold the MTP layers."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec

    return get_gpt_mtp_block_spec(config, layer_spec, use_transformer_engine=use_te, vp_stage=vp_stage)


def hf_rule(name: str, layer_rule, args):
    """(kind, HF names) of MTP parameter `name` (`mtp.layers.N.*`), None for any other parameter.

    `layer_rule(rest, prefix)` maps a decoder layer's layer-relative name under an HF prefix (hf_names.py):
    the MTP layer's transformer layer is one. MiMo concatenates [hidden; token] before input_proj and megatron-core
    [token; hidden] before eh_proj: kind "swap_halves" swaps the two column halves both ways (DeepSeek-V3 and
    GLM-4.5 concatenate as megatron-core does)."""
    m = _MTP.match(name)
    if not m:
        return None
    layout = _layout(args)
    if layout not in _OWN:
        raise KeyError(f"no HF mapping for megatron MTP parameter {name!r}: model_type {args.hf_model_type!r} has no "
                       "mapped MTP layout (config/mtp.py refuses --enable-mtp-training for it)")
    prefix, rest = _prefix(args, int(m.group(1))), m.group(2)
    if rest.startswith(_TRANSFORMER):
        return layer_rule(rest[len(_TRANSFORMER):], prefix)
    if rest not in _OWN[layout]:
        raise KeyError(f"no HF mapping for megatron MTP parameter {name!r}")
    kind = "swap_halves" if layout == "mimo" and rest == "eh_proj.weight" else "copy"
    return kind, [prefix + _OWN[layout][rest]]


def vocab_copies(chunk, args, part: str) -> list:
    """HF names of the copies DeepSeek-V3 / GLM-4.5 checkpoints keep of the embedding (`part` "embed_tokens") or the
    LM head ("shared_head.head") in each MTP layer: megatron-core's MTP layers use the model's own, so these are
    read from the first name and written as copies of it. [] without MTP layers or for MiMo."""
    if not getattr(chunk, "mtp_process", False) or _layout(args) != "appended":
        return []
    return [f"{_prefix(args, i)}{part}.weight" for i in range(len(chunk.mtp.layers))]


def swap_halves(tensor: torch.Tensor) -> torch.Tensor:
    """[a | b] -> [b | a] along the input (column) dimension; its own inverse."""
    first, second = tensor.chunk(2, dim=1)
    return torch.cat([second, first], dim=1)


def response_loss_mask(mb) -> torch.Tensor:
    """`[b, S]` float mask over the micro-batch's sequence positions: 1 where the position's next token is a
    trained response token (the policy loss's positions and mask, scattered back into the rows)."""
    full = torch.zeros(mb.tokens.shape, dtype=torch.float32, device=mb.tokens.device)
    # padded response slots repeat a real position with mask 0: accumulate so they add nothing
    full.index_put_((mb.rows.reshape(-1), mb.sequence_cols.reshape(-1)), mb.loss_mask.reshape(-1).float(),
                    accumulate=True)
    return full


def forward_kwargs(mb, num_layers: int) -> dict:
    """GPTModel's `labels` and `loss_mask` for the MTP loss of micro-batch `mb`.

    labels[t] = token t+1 (the policy's target); megatron-core rolls labels and mask one place per MTP layer.
    Samples packed in one row: a roll would let the next sample's first tokens in, so positions closer than
    `num_layers` to their sample's start are left out (they are prompt tokens unless a prompt is that short)."""
    tokens = mb.tokens
    labels = torch.roll(tokens, shifts=-1, dims=-1)
    labels[..., -1] = 0
    mask = response_loss_mask(mb) * (mb.position_ids >= num_layers).to(torch.float32)
    return {"labels": labels, "loss_mask": mask}


class LogitsKeeper:
    """Keeps a forward's output-layer outputs. Given labels, GPTModel calls the output layer once per MTP layer, then
    once for the main model, and returns the main model's cross entropy, computed in place over those logits
    (megatron-core's vocab-parallel cross entropy overwrites its input). The main call's logits are the policy's:
    `skips` tells the model's loss to leave them alone, `take` hands them to the trainer (they carry
    MTPLossAutoScaler, so their backward also runs the MTP loss's)."""

    def __init__(self, num_layers: int):
        self.num_layers, self.outputs = num_layers, []

    def reset(self, *_):
        self.outputs = []

    def __call__(self, module, inputs, output):
        self.outputs.append(output[0])

    def skips(self, logits) -> bool:
        return len(self.outputs) == self.num_layers + 1 and logits is self.outputs[-1]

    def take(self) -> torch.Tensor:
        """The policy logits `[b, s, V]` (GPTModel's layout without labels), fp32 as Float16Module returns them."""
        outputs, self.outputs = self.outputs, []
        if len(outputs) != self.num_layers + 1:
            raise RuntimeError(f"the MTP model's output layer ran {len(outputs)} times, not {self.num_layers + 1}")
        logits = outputs[-1].transpose(0, 1).contiguous()
        return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def attach(model) -> None:
    """Give a GPTModel chunk that holds MTP layers its LogitsKeeper (registered after the padded-vocab mask hook,
    so it keeps the masked logits), and a language-model loss that skips the policy logits (the trainer's loss
    reads them; the MTP layers' cross entropies still run)."""
    keeper = model.mtp_logits = LogitsKeeper(model.config.mtp_num_layers)
    model.register_forward_pre_hook(keeper.reset)
    model.output_layer.register_forward_hook(keeper)
    cross_entropy = model.compute_language_model_loss

    def loss_unless_policy(labels, logits):
        if keeper.skips(logits):
            return torch.zeros(labels.shape, dtype=logits.dtype, device=logits.device)
        return cross_entropy(labels, logits)

    model.compute_language_model_loss = loss_unless_policy


def policy_logits(chunk, output):
    """What the trainer's loss reads from a forward with MTP labels: the policy logits on a chunk with MTP layers,
    `output` (hidden states sent down the pipeline) elsewhere."""
    keeper = getattr(chunk, "mtp_logits", None)
    return keeper.take() if keeper is not None else output


def take_step_loss(num_microbatches: int, all_reduce, dp_size: int) -> dict:
    """{"mtp_loss": mean over the step's micro-batches and data-parallel ranks of each micro-batch's masked mean MTP
    cross entropy, averaged over the MTP layers}, read from (and clearing) megatron-core's tracker; {} where this
    rank ran no MTP layer. `all_reduce(tensor)` sums over the data-parallel group (gloo has no AVG)."""
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    tracker = MTPLossLoggingHelper.tracker
    values = tracker.get("values")
    if values is None:
        return {}
    per_layer = all_reduce(values.detach().to(torch.float64).cpu()) / (dp_size * max(num_microbatches, 1))
    values.zero_()
    return {"mtp_loss": float(per_layer.mean())}
