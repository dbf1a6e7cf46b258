"""Vision-language models in megatron-core: the language model is mcore's GPTModel, the vision tower transformers'.

Qwen2.5-VL and Qwen3-VL (`VLM_FAMILIES`, keyed by config.json's text_config.model_type):
- the HF vision tower (transformers' own module, built from config.json's vision_config) turns each sample's
  `multimodal_train_inputs` (pixel_values, image_grid_thw: the processor's output) into one embedding per image
  placeholder token, which replaces that token's word embedding (transformers' masked_scatter, in row order);
- Qwen3-VL's DeepStack: the tower's intermediate features are added to the image tokens' hidden states after the
  first decoder layers (a forward hook per layer, as Qwen3VLTextModel does after each of its layers);
- M-RoPE: the 3-D positions are transformers' own get_rope_index (called on the config, without the HF model),
  and the rotary angles follow the family's channel layout: Qwen2.5-VL gives contiguous sections of the rotary
  channels to temporal / height / width (mrope_section), Qwen3-VL interleaves them (T H W T H W ...). megatron-core's
  MultimodalRotaryEmbedding does the sectioned layout only (and allocates on CUDA), so MRopeEmbedding replaces it.

The vision tower is replicated on every TP rank (it is small and runs before the TP-split decoder); its parameters
are plain (not tensor-parallel) and train or stay frozen by --freeze-vision-tower (slime's name is unknown; see
docs/guide.md). A text-only sample in a VLM batch gets positions 0..L-1 on all three axes, as in transformers.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch

from megatron.core.models.gpt import GPTModel


@dataclass(frozen=True)
class VisionFamily:
    module: str            # transformers module holding the classes below
    tower: str             # the vision tower class (config.json's vision_config)
    model: str             # the HF model class whose get_rope_index computes the 3-D positions
    interleaved_mrope: bool
    deepstack: bool


VLM_FAMILIES = {
    "qwen2_5_vl_text": VisionFamily("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl",
                                    "Qwen2_5_VisionTransformerPretrainedModel", "Qwen2_5_VLModel",
                                    interleaved_mrope=False, deepstack=False),
    "qwen3_vl_text": VisionFamily("transformers.models.qwen3_vl.modeling_qwen3_vl", "Qwen3VLVisionModel",
                                  "Qwen3VLModel", interleaved_mrope=True, deepstack=True),
}


def hf_vlm_config(hf_dir: str):
    """transformers' config of the whole VLM (vision_config, image_token_id, text_config's rope parameters)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(hf_dir, local_files_only=True)


# ----------------------------------------------------------------------------------------------- M-RoPE angles
def channel_axes(half_dim: int, section: list[int], interleaved: bool) -> torch.Tensor:
    """Which position axis (0 temporal, 1 height, 2 width) drives each of the half_dim rotary frequencies."""
    if sum(section) != half_dim:
        raise ValueError(f"rope mrope_section {section} sums to {sum(section)}, the rotary half-dimension is "
                         f"{half_dim}: config.json's text_config does not match the model")
    if not interleaved:  # Qwen2-VL / Qwen2.5-VL: [T]*s0 + [H]*s1 + [W]*s2
        return torch.repeat_interleave(torch.arange(3), torch.tensor(section))
    axes = torch.zeros(half_dim, dtype=torch.long)  # Qwen3-VL: T by default, H at 1, 4, ..., W at 2, 5, ...
    for axis in (1, 2):
        axes[axis:3 * section[axis]:3] = axis
    return axes


class MRopeEmbedding(torch.nn.Module):
    """Replaces GPTModel.rotary_pos_emb: (position_ids [3, b, s], mrope_section) -> angles [s, b, 1, dim] in
    megatron-core's non-interleaved layout (the two halves repeat the frequencies, as transformers' cat)."""

    def __init__(self, kv_channels: int, rotary_base: float, section: list[int], interleaved: bool):
        super().__init__()
        half = kv_channels // 2
        inv_freq = 1.0 / (rotary_base ** (torch.arange(0, kv_channels, 2, dtype=torch.float32) / kv_channels))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("axes", channel_axes(half, list(section), interleaved), persistent=False)

    def forward(self, position_ids, mrope_section=None, cp_group=None):
        pos = position_ids.to(self.inv_freq.device).float()                 # [3, b, s]
        freqs = pos[..., None] * self.inv_freq                              # [3, b, s, half]
        picked = freqs.gather(0, self.axes.view(1, 1, 1, -1).expand(1, *freqs.shape[1:])).squeeze(0)
        emb = torch.cat([picked, picked], dim=-1)                           # [b, s, dim]
        return emb.transpose(0, 1)[:, :, None, :].contiguous()


class RopeIndex:
    """transformers' get_rope_index of the family, run on its config (no HF weights): the 3-D positions."""

    def __init__(self, family: VisionFamily, config):
        model_cls = getattr(importlib.import_module(family.module), family.model)
        # get_rope_index and get_vision_position_ids read only self.config: bind them to a config holder
        holder = type("RopeIndexHolder", (), {"get_rope_index": model_cls.get_rope_index,
                                               "get_vision_position_ids": model_cls.get_vision_position_ids})
        self.impl = holder()
        self.impl.config = config
        self.image_token_id, self.video_token_id = config.image_token_id, config.video_token_id

    def positions(self, ids: torch.Tensor, grids) -> torch.Tensor:
        """[3, L] positions of one sample's tokens `ids` [L]; `grids` yields the (t, h, w) of its images in order
        (each run of image placeholder tokens is one image, as get_rope_index reads them)."""
        types = (ids == self.image_token_id).int() + 2 * (ids == self.video_token_id).int()
        runs = int(((types[1:] == 1) & (types[:-1] != 1)).sum()) + int(types[0] == 1) if ids.numel() else 0
        if not runs:
            return torch.arange(ids.numel(), device=ids.device).view(1, -1).expand(3, -1)
        mine = torch.stack([next(grids) for _ in range(runs)])
        pos, _ = self.impl.get_rope_index(ids[None], mm_token_type_ids=types[None], image_grid_thw=mine)
        return pos[:, 0]


def _segments(position_ids: torch.Tensor):
    """(row, start, length) of each sample: a row per sample (padded rows), or the samples of one packed row, whose
    positions restart at 0 where a sample starts (training/data.py's layouts)."""
    rows, width = position_ids.shape
    if rows > 1 or width == 0:
        return [(k, 0, width) for k in range(rows)]
    starts = (position_ids[0] == 0).nonzero().flatten().tolist() + [width]
    return [(0, a, b - a) for a, b in zip(starts[:-1], starts[1:])]


class VisionGPTModel(GPTModel):
    """GPTModel whose first stage embeds images through the HF vision tower (`self.visual`) and whose rotary
    embedding is M-RoPE. forward takes the micro-batch's images as `multimodal` (training/data.py)."""

    def attach_vision(self, hf_config, family: VisionFamily, rotary_base: float, dtype):
        from transformers import PreTrainedModel

        self.family, self.hf_vlm_config = family, hf_config
        self.image_token_id = hf_config.image_token_id
        text = hf_config.text_config
        rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
        section = rope.get("mrope_section")
        if not section:
            raise ValueError("config.json text_config has no rope mrope_section: not a Qwen-VL M-RoPE model")
        self.position_embedding_type, self.mrope_section = "mrope", list(section)
        self.rotary_pos_emb = MRopeEmbedding(self.config.kv_channels, rotary_base, section, family.interleaved_mrope)
        self.rope_index = RopeIndex(family, hf_config)
        self._deepstack = None
        if self.pre_process:
            tower_cls = getattr(importlib.import_module(family.module), family.tower)
            assert issubclass(tower_cls, PreTrainedModel)
            self.visual = tower_cls._from_config(hf_config.vision_config, dtype=dtype)
        if family.deepstack:
            for layer in self.decoder.layers:
                layer.register_forward_hook(self._add_deepstack)

    def forward(self, input_ids, position_ids, attention_mask, decoder_input=None, *, multimodal=None, **kwargs):
        """`position_ids` [b, s] are training/data.py's 1-D positions (they locate the samples of a packed row);
        `multimodal`: the micro-batch's images, {"pixel_values", "image_grid_thw"} in sample order, or None."""
        grid = multimodal["image_grid_thw"] if multimodal is not None else None
        mrope_positions = self._positions(input_ids, position_ids, grid)
        self._deepstack = None
        if self.pre_process and decoder_input is None and multimodal is not None:
            decoder_input = self._embed(input_ids, multimodal)
        return super().forward(input_ids, mrope_positions, attention_mask, decoder_input=decoder_input, **kwargs)

    def _positions(self, input_ids, position_ids, grid) -> torch.Tensor:
        out = torch.zeros(3, *input_ids.shape, dtype=torch.long, device=input_ids.device)
        grids = iter(torch.as_tensor(grid).reshape(-1, 3)) if grid is not None else iter(())
        for row, start, n in _segments(position_ids):
            try:
                out[:, row, start:start + n] = self.rope_index.positions(input_ids[row, start:start + n], grids)
            except StopIteration:
                raise ValueError("the micro-batch's tokens hold more images (runs of image placeholder tokens) than "
                                 "its image_grid_thw rows: a sample's tokens and its multimodal_train_inputs "
                                 "disagree") from None
        return out

    def _embed(self, input_ids, multimodal):
        """Word embeddings [s, b, h] with each image token's row replaced by the vision tower's output."""
        embeds = self.embedding(input_ids=input_ids, position_ids=None)
        mask = input_ids == self.image_token_id
        device = embeds.device
        pixels = multimodal["pixel_values"].to(device, self.visual.dtype)
        grid = torch.as_tensor(multimodal["image_grid_thw"]).reshape(-1, 3).to(device)
        out = self.visual(pixels, grid_thw=grid, return_dict=True)
        image_embeds = out.pooler_output
        if int(mask.sum()) != image_embeds.shape[0]:
            raise ValueError(f"the micro-batch has {int(mask.sum())} image placeholder tokens but its images give "
                             f"{image_embeds.shape[0]} embeddings (image_grid_thw {grid.tolist()}): a sample's "
                             "tokens and its multimodal_train_inputs disagree")
        bsh = embeds.transpose(0, 1).masked_scatter(mask[..., None], image_embeds.to(embeds.dtype))
        if self.family.deepstack:
            self._deepstack = (mask, [f.to(embeds.dtype) for f in out.deepstack_features])
        return bsh.transpose(0, 1).contiguous()

    def _add_deepstack(self, layer, inputs, output):
        """Qwen3-VL: after decoder layer i (global index) < len(features), image tokens' hidden += features[i]."""
        if self._deepstack is None:
            return output
        mask, features = self._deepstack
        index = layer.layer_number - 1
        if index >= len(features):
            return output
        hidden, rest = (output[0], output[1:]) if isinstance(output, tuple) else (output, None)
        added = torch.zeros_like(hidden.transpose(0, 1)).masked_scatter(mask[..., None], features[index])
        hidden = hidden + added.transpose(0, 1)
        return (hidden, *rest) if rest is not None else hidden
