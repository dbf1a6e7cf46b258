"""Hugging Face <-> megatron-core weights for Qwen2/2.5 (and MiMo's main model), Qwen3, Llama 3, Qwen2-MoE, Qwen3-MoE,
GLM-4 dense, GLM-4.5-style MoE and DeepSeek-V3-style MLA (DeepSeek-V3, Kimi-K2, GLM-4.7-Flash), at any TP/PP/EP.

The HF names of each mcore parameter come from hf_names.py's table (`rule`); here the tensors move.
Loading builds the full mcore-layout tensor, then takes this rank's TP slice along the parameter's
`partition_dim`; exporting all-gathers TP slices (and experts over EP), then splits back into HF tensors.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil

import torch
import torch.distributed as dist

from slime_like.backends.megatron import hf_linear_attention as hybrid
from slime_like.backends.megatron import mtp
from slime_like.backends.megatron.hf_names import GDN_IN_PROJ, VLM_LM, global_expert, rule, vlm_legacy_name
from slime_like.backends.megatron.model import padded_vocab_size
from slime_like.config.hf_config import read_hf_config
from slime_like.config.hf_families import family_of
from slime_like.config.hf_layer_layouts import dropped_mtp_note

log = logging.getLogger(__name__)


def unwrap(module):
    """Strip DDP / Float16Module wrappers (they keep the model in `.module`)."""
    while hasattr(module, "module"):
        module = module.module
    return module


def _tensors(chunk):
    """(name, tensor) of every parameter and of the buffers that are weights (the routers' expert bias)."""
    yield from chunk.named_parameters()
    for name, buf in chunk.named_buffers():
        if name.endswith("router.expert_bias") and buf is not None:
            yield name, buf


def _tp_group(name: str):
    """(rank, size, group) of the TP group a parameter is split over (experts use expert-TP)."""
    from megatron.core import parallel_state as ps

    if ".experts." in name:
        return (ps.get_expert_tensor_parallel_rank(), ps.get_expert_tensor_parallel_world_size(),
                ps.get_expert_tensor_parallel_group())
    return ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_group()


def _heads(args):
    heads = args.num_attention_heads
    groups = args.num_query_groups if args.group_query_attention else heads
    head_dim = args.kv_channels or args.hidden_size // heads
    return heads, groups, head_dim


def _merge(kind, tensors, args):
    """HF tensors -> one full (unsharded) mcore tensor."""
    if kind in ("copy", "gate_up_fused", "gdn_conv"):
        return tensors[0]
    if kind == "gdn_in":
        return hybrid.merge_in_proj(tensors, args)
    if kind == "swap_halves":
        return mtp.swap_halves(tensors[0])
    if kind == "vocab":
        t = tensors[0]
        pad = padded_vocab_size(args) - t.shape[0]
        return torch.cat([t, t.new_zeros((pad,) + tuple(t.shape[1:]))]) if pad > 0 else t
    if kind == "gate_up":
        return torch.cat(tensors)
    heads, groups, hd = _heads(args)  # qkv: per KV group [q (heads/groups rows of hd), k, v]
    if _gated(args):  # + the gates of the group's heads after its queries
        return hybrid.merge_gated_qkv(*tensors, groups, hd)
    q, k, v = (t.reshape(n, -1, *t.shape[1:]) for t, n in zip(tensors, (groups, groups, groups)))
    return torch.cat([q, k, v], dim=1).reshape(-1, *tensors[0].shape[1:])


def _split(kind, full, args, hf_vocab, copies: int = 1):
    """Full mcore tensor -> HF tensors (inverse of _merge)."""
    if kind in ("copy", "gate_up_fused", "gdn_conv"):
        return [full]
    if kind == "gdn_in":
        return hybrid.split_in_proj(full, args, len(GDN_IN_PROJ["qwen3_next" if args.hf_model_type == "qwen3_next"
                                                                else "qwen3_5"]))
    if kind == "vocab":  # one tensor, written under each of its names (the MTP layers' copies: mtp.vocab_copies)
        return [full[:hf_vocab]] * copies
    if kind == "swap_halves":
        return [mtp.swap_halves(full)]
    if kind == "gate_up":
        return list(full.chunk(2))
    heads, groups, hd = _heads(args)
    if _gated(args):
        return hybrid.split_gated_qkv(full, heads, groups, hd)
    per = heads // groups * hd
    g = full.reshape(groups, per + 2 * hd, *full.shape[1:])
    q, k, v = g[:, :per], g[:, per:per + hd], g[:, per + hd:]
    return [x.reshape(-1, *full.shape[1:]) for x in (q, k, v)]


def _gated(args) -> bool:
    return bool(args.attention_output_gate or args.use_gated_attention)


def _sections(kind, full_rows: int, args):
    """Rows of the sections split over TP one by one ([gate; up]: two halves; gated delta net: hf_linear_attention)."""
    if kind in ("gate_up", "gate_up_fused"):
        return [full_rows // 2] * 2
    return hybrid.tp_sections(kind, args)


def _shard(kind, full, param, rank, size, args):
    if not getattr(param, "tensor_model_parallel", False) or size == 1:
        return full
    dim = param.partition_dim
    sections = _sections(kind, full.shape[0], args)
    if sections:  # each section is split over TP so every rank holds e.g. [gate_r; up_r]
        return torch.cat([h.chunk(size, dim=dim)[rank] for h in full.split(sections, dim=0)], dim=0)
    return full.chunk(size, dim=dim)[rank]


def _unshard(kind, local, param, size, group, args):
    if not getattr(param, "tensor_model_parallel", False) or size == 1:
        return local
    parts = [torch.empty_like(local) for _ in range(size)]
    dist.all_gather(parts, local.contiguous(), group=group)
    dim = param.partition_dim
    sections = _sections(kind, local.shape[0] * size, args)
    if sections:
        pieces = [p.split([n // size for n in sections], dim=0) for p in parts]
        return torch.cat([torch.cat([p[i] for p in pieces], dim=dim) for i in range(len(sections))], dim=0)
    return torch.cat(parts, dim=dim)


class _HFReader:
    """Lazy access to tensors of a safetensors checkpoint (single file or sharded with an index)."""

    def __init__(self, hf_dir):
        from safetensors import safe_open

        index = os.path.join(hf_dir, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        else:
            files = sorted(f for f in os.listdir(hf_dir) if f.endswith(".safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors weights in {hf_dir}")
        self.dir, self.where = hf_dir, {}
        self.handles = [safe_open(os.path.join(hf_dir, f), "pt") for f in files]
        for h in self.handles:
            for key in h.keys():
                self.where[key] = h

    def get(self, key):
        if key not in self.where and vlm_legacy_name(key) in self.where:
            key = vlm_legacy_name(key)
        if key not in self.where:
            raise KeyError(f"{self.dir}: tensor {key!r} missing from the HF checkpoint")
        return self.where[key].get_tensor(key)


@torch.no_grad()
def load_hf_weights(model_chunks, hf_dir: str, args):
    """Copy this rank's share of an HF checkpoint into the model chunks (every parameter must be covered)."""
    hf_cfg = read_hf_config(hf_dir, for_training=True)
    if hf_cfg["vocab_size"] > padded_vocab_size(args):
        raise ValueError(f"{hf_dir}: vocab_size {hf_cfg['vocab_size']} exceeds the model's padded vocab "
                         f"{padded_vocab_size(args)}; fix --vocab-size")
    note = dropped_mtp_note(hf_cfg, hf_dir, built=_mtp_layers_built(model_chunks))
    if note:
        log.warning(note)
    reader = _HFReader(hf_dir)
    for chunk in map(unwrap, model_chunks):
        for name, param in _tensors(chunk):
            kind, hf_names = rule(name, chunk, args)
            if kind == "skip":
                continue
            full = _merge(kind, [reader.get(n) for n in hf_names], args)
            rank, size, _ = _tp_group(name)
            local = _shard(kind, full, param, rank, size, args)
            if local.shape != param.shape:
                raise ValueError(f"{name} <- {hf_names}: HF gives {tuple(local.shape)} for this rank, the model "
                                 f"expects {tuple(param.shape)}; do the model flags match {hf_dir}/config.json?")
            param.copy_(local.to(param.dtype))


def _mtp_layers_built(model_chunks) -> int:
    """How many MTP layers the chunks hold (--enable-mtp-training; 0 otherwise)."""
    return sum(len(unwrap(c).mtp.layers) for c in model_chunks if getattr(unwrap(c), "mtp_process", False))


@torch.no_grad()
def iter_hf_weights(model_chunks, args, hf_vocab_size: int | None = None, frozen_vision: bool = False):
    """Yield (hf_name, full tensor) for this rank's PP stage; every rank must iterate (TP/EP gathers).

    A vision tower frozen by --freeze-vision-tower is left out (the engines keep the one they loaded) unless
    `frozen_vision` (an export writes the whole model; a trainer that did not start from --hf-checkpoint pushes it).

    Tensors come out on the rank with tp_rank == 0 and dp_rank == 0 (incl. CP) of each PP stage. They may be
    views of the live parameters (no copy: a weight sync copies them once, into its send buffer): use them
    before the next optimizer step, and copy them to keep them (export_hf does).
    """
    from megatron.core import parallel_state as ps

    hf_vocab = hf_vocab_size or args.vocab_size
    emits = ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank(with_context_parallel=True) == 0
    tied = not args.untie_embeddings_and_output_weights
    for chunk in map(unwrap, model_chunks):
        for name, param in _tensors(chunk):
            kind, hf_names = rule(name, chunk, args)
            if kind == "skip" or (name == "output_layer.weight" and tied):
                continue  # tied: the HF model has no lm_head tensor
            if name.startswith("visual.") and args.freeze_vision_tower and not frozen_vision:
                continue
            _, size, group = _tp_group(name)
            full = _unshard(kind, param.detach(), param, size, group, args)
            pieces = [(hf_names, full)]
            if ".experts." in name and ps.get_expert_model_parallel_world_size() > 1:
                pieces = _gather_experts(name, chunk, args, full)
            for names, tensor in pieces:
                if emits:
                    yield from zip(names, _split(kind, tensor, args, hf_vocab, copies=len(names)))


def _gather_experts(name, chunk, args, full):
    """All-gather one local expert tensor over the EP group -> [(hf_names, tensor)] for every EP rank's expert."""
    from megatron.core import parallel_state as ps

    size, group = ps.get_expert_model_parallel_world_size(), ps.get_expert_model_parallel_group()
    parts = [torch.empty_like(full) for _ in range(size)]
    dist.all_gather(parts, full.contiguous(), group=group)
    local_count = args.num_experts // size
    out = []
    for ep_rank, tensor in enumerate(parts):
        _, hf_names = rule(name, chunk, args)
        mine = global_expert(0, args)  # this rank's first expert; shift the names to ep_rank's experts
        shift = ep_rank * local_count - mine
        out.append(([re.sub(r"experts\.(\d+)\.", lambda m: f"experts.{int(m.group(1)) + shift}.", n)
                     for n in hf_names], tensor))
    return out


def _kept_from_template(name: str, args) -> bool:
    own_tower = family_of({"model_type": args.hf_model_type}).vision_language  # Qwen2.5-VL / Qwen3-VL: built
    return args.hf_text_of_vlm and not own_tower and name.startswith("model.visual.")


def _disk_layout(template_hf_dir: str):
    """Name mapping from the pushed (transformers 5 in-memory) names to the template checkpoint's own layout:
    a VLM saved as model.layers.* / visual.* (Qwen2.5-VL) is written back so."""
    try:
        keys = _HFReader(template_hf_dir).where
    except FileNotFoundError:
        return lambda name: name
    legacy = not any(k.startswith(VLM_LM) for k in keys) and any(k.startswith("visual.") for k in keys)
    return vlm_legacy_name if legacy else (lambda name: name)


def export_hf(model_chunks, args, out_dir: str, template_hf_dir: str):
    """Write an HF checkpoint (safetensors, one file per PP stage + index; config + tokenizer from the template).

    Collective: every rank must call it. Tensors are cast to the template config's dtype.
    """
    from megatron.core import parallel_state as ps

    cfg = read_hf_config(template_hf_dir, for_training=True)
    dtype = getattr(torch, cfg.get("dtype") or cfg.get("torch_dtype") or "float32")
    # copy=True: own storage per tensor (iter_hf_weights may yield views; safetensors refuses shared storage)
    rename = _disk_layout(template_hf_dir)
    tensors = {rename(n): t.to(device="cpu", dtype=dtype, copy=True).contiguous()
               for n, t in iter_hf_weights(model_chunks, args, cfg["vocab_size"], frozen_vision=True)}
    pp, stage = ps.get_pipeline_model_parallel_world_size(), ps.get_pipeline_model_parallel_rank()
    if tensors and stage == 0:  # what the trainer does not build: Qwen3.5's vision tower
        reader = _HFReader(template_hf_dir)
        tensors.update({k: reader.get(k) for k in sorted(reader.where) if _kept_from_template(k, args)})
    fname = "model.safetensors" if pp == 1 else f"model-{stage + 1:05d}-of-{pp:05d}.safetensors"
    os.makedirs(out_dir, exist_ok=True)
    if tensors:
        from safetensors.torch import save_file

        save_file(tensors, os.path.join(out_dir, fname), metadata={"format": "pt"})
    names = [None] * dist.get_world_size() if dist.is_initialized() else None
    if names is not None:
        dist.all_gather_object(names, (fname, sorted(tensors)) if tensors else None)
    else:
        names = [(fname, sorted(tensors))]
    if not dist.is_initialized() or dist.get_rank() == 0:
        if pp > 1:
            weight_map = {k: f for item in names if item for f, keys in [item] for k in keys}
            with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
        for f in os.listdir(template_hf_dir):  # config, generation config, tokenizer files
            if f.endswith((".json", ".jinja", ".txt", ".model", ".tiktoken")) and not f.startswith("model.safetensors"):
                shutil.copy(os.path.join(template_hf_dir, f), os.path.join(out_dir, f))
    if dist.is_initialized():
        dist.barrier()
    return out_dir
