"""Hugging Face <-> megatron-core weights for Qwen2/2.5 (and MiMo's main model), Qwen3, Llama 3, Qwen2-MoE, Qwen3-MoE,
GLM-4 dense, GLM-4.5-style MoE and DeepSeek-V3-style MLA (DeepSeek-V3, Kimi-K2, GLM-4.7-Flash), at any TP/PP/EP.

One table (`_rule`) maps each mcore parameter of a chunk to the HF tensor(s) it is made of:

  embedding.word_embeddings / output_layer   <- embed_tokens / lm_head, rows padded to the padded vocab
  linear_qkv (weight, bias)                  <- q/k/v_proj fused per KV group: [q rows of group g, k_g, v_g]
  linear_proj <- o_proj;  linear_fc2 <- down_proj;  linear_fc1 = [gate; up] (each half split over TP; GLM-4 keeps
  the two halves fused in one gate_up_proj);  post_self_attn_layernorm / post_mlp_layernorm <- same names (GLM-4)
  input_layernorm | linear_qkv.layer_norm_weight (TE)      <- input_layernorm
  pre_mlp_layernorm | linear_fc1.layer_norm_weight (TE)    <- post_attention_layernorm
  q_layernorm / k_layernorm <- q_norm / k_norm (Qwen3);  router <- mlp.gate;  experts.E <- experts.E (MoE)
  router.expert_bias (a buffer) <- mlp.gate.e_score_correction_bias;  shared_experts <- shared_experts (GLM-4.5)
  shared_experts.gate_weight <- mlp.shared_expert_gate (Qwen2-MoE, whose shared expert is mlp.shared_expert.*)

Layer indices are global (`layer.layer_number - 1`), so PP stages load/export their own layers.
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
from slime_like.backends.megatron.model import ValueHead, padded_vocab_size
from slime_like.config.hf_config import dropped_mtp_note, family_of, read_hf_config

log = logging.getLogger(__name__)

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_LOCAL_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.linear_fc([12])\.(weight|bias)$")
_GROUPED_EXPERT = re.compile(r"^mlp\.experts\.linear_fc([12])\.(weight|bias)(\d+)$")  # TE grouped GEMM
_SIMPLE = {  # layer-relative mcore name -> layer-relative HF name
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "post_attention_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.linear_proj.bias": "self_attn.o_proj.bias",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
    "mlp.linear_fc2.bias": "mlp.down_proj.bias",
    "mlp.router.weight": "mlp.gate.weight",
    "mlp.router.expert_bias": "mlp.gate.e_score_correction_bias",  # a buffer (DeepSeek-V3 / GLM-4.5 routers)
    "mlp.shared_experts.linear_fc2.weight": "mlp.shared_experts.down_proj.weight",
    "mlp.shared_experts.gate_weight": "mlp.shared_expert_gate.weight",  # Qwen2-MoE: [1, hidden] sigmoid gate
    "post_self_attn_layernorm.weight": "post_self_attn_layernorm.weight",  # GLM-4 dense sandwich norms
    "post_mlp_layernorm.weight": "post_mlp_layernorm.weight",
    "self_attention.q_norm.weight": "self_attn.q_norm.weight",  # MiniMax-M2: one norm over all heads
    "self_attention.k_norm.weight": "self_attn.k_norm.weight",
}
# MiniMax-M2 (Mixtral's names): the MoE block is block_sparse_moe, experts' gate / up / down are w1 / w3 / w2
_BLOCK_SPARSE_MOE = [(re.compile(r"\.mlp\.gate\.e_score_correction_bias$"),
                      ".block_sparse_moe.e_score_correction_bias"),
                     (re.compile(r"\.mlp\.gate\.weight$"), ".block_sparse_moe.gate.weight"),
                     (re.compile(r"\.mlp\.experts\.(\d+)\.gate_proj\."), r".block_sparse_moe.experts.\1.w1."),
                     (re.compile(r"\.mlp\.experts\.(\d+)\.up_proj\."), r".block_sparse_moe.experts.\1.w3."),
                     (re.compile(r"\.mlp\.experts\.(\d+)\.down_proj\."), r".block_sparse_moe.experts.\1.w2.")]

_VLM_TEXT = re.compile(r"^model\.")
# Qwen2-MoE (and Qwen3-Next / Qwen3.5) name their one shared expert in the singular
_SINGULAR_SHARED_EXPERT = [(re.compile(r"\.mlp\.shared_experts\."), ".mlp.shared_expert.")]


# multi-latent attention (DeepSeek-V3): layer-relative mcore name -> (kind, HF name); TE fuses the latent norms.
# Tensors copy unchanged: HF's rope_interleave rotates interleaved pairs of the RoPE part and megatron-core's MLA
# does the same (it de-interleaves q_pe / k_pe before rotating halves).
_MLA = {
    "self_attention.linear_q_down_proj.weight": ("copy", "self_attn.q_a_proj.weight"),
    "self_attention.q_layernorm.weight": ("copy", "self_attn.q_a_layernorm.weight"),
    "self_attention.linear_q_up_proj.layer_norm_weight": ("copy", "self_attn.q_a_layernorm.weight"),
    "self_attention.linear_q_up_proj.weight": ("copy", "self_attn.q_b_proj.weight"),
    "self_attention.linear_q_proj.weight": ("copy", "self_attn.q_proj.weight"),
    "self_attention.linear_kv_down_proj.weight": ("copy", "self_attn.kv_a_proj_with_mqa.weight"),
    "self_attention.kv_layernorm.weight": ("copy", "self_attn.kv_a_layernorm.weight"),
    "self_attention.linear_kv_up_proj.layer_norm_weight": ("copy", "self_attn.kv_a_layernorm.weight"),
    "self_attention.linear_kv_up_proj.weight": ("copy", "self_attn.kv_b_proj.weight"),
    # DeepSeek sparse attention's lightning indexer (backends/megatron/dsa.py: slime's glm5 names)
    "self_attention.wq_b.weight": ("copy", "self_attn.indexer.wq_b.weight"),
    "self_attention.wk.weight": ("copy", "self_attn.indexer.wk.weight"),
    "self_attention.k_norm.weight": ("copy", "self_attn.indexer.k_norm.weight"),
    "self_attention.k_norm.bias": ("copy", "self_attn.indexer.k_norm.bias"),
    "self_attention.weights_proj.weight": ("copy", "self_attn.indexer.weights_proj.weight"),
}


# gated delta net (gated_delta_net.py): mcore-style names <- HF linear_attn.*; in_proj is [q; k; v; z; beta; alpha]
# (each section split over TP), which Qwen3.5 keeps as four tensors and Qwen3-Next as two, interleaved per key head
_GATED_DELTA_NET = {
    "self_attention.in_proj.weight": ("gdn_in", None),
    "self_attention.conv1d.weight": ("gdn_conv", ["conv1d.weight"]),
    "self_attention.dt_bias": ("copy", ["dt_bias"]),
    "self_attention.A_log": ("copy", ["A_log"]),
    "self_attention.out_norm.weight": ("copy", ["norm.weight"]),
    "self_attention.out_proj.weight": ("copy", ["out_proj.weight"]),
}
_GDN_IN_PROJ = {"qwen3_next": ["in_proj_qkvz.weight", "in_proj_ba.weight"],
                "qwen3_5": ["in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight"]}


def unwrap(module):
    """Strip DDP / Float16Module wrappers (they keep the model in `.module`)."""
    while hasattr(module, "module"):
        module = module.module
    return module


# vision-language models (backends/megatron/vision.py): transformers 5's in-memory names, the ones pushed to engines;
# a checkpoint on disk may use the older layout (Qwen2.5-VL: model.layers.* and visual.*), read and written as found
_VLM_LM, _VLM_VISUAL = "model.language_model.", "model.visual."
_LEGACY_VLM = ((_VLM_LM, "model."), (_VLM_VISUAL, "visual."))


def _vlm_legacy_name(name: str) -> str:
    for new, old in _LEGACY_VLM:
        if name.startswith(new):
            return old + name[len(new):]
    return name


def _rule(name: str, chunk, args):
    """(kind, hf_names) for one mcore parameter; kind in copy | vocab | qkv | gate_up | gate_up_fused | gdn_in |
    gdn_conv | skip."""
    if name.startswith("visual."):  # the HF vision tower, kept as transformers' module: its own names
        return "copy", [_VLM_VISUAL + name[len("visual."):]]
    kind, names = _generic_rule(name, chunk, args)
    family = family_of({"model_type": args.hf_model_type})
    renames = _BLOCK_SPARSE_MOE if args.hf_model_type == "minimax_m2" else \
        _SINGULAR_SHARED_EXPERT if family.shared_expert_gate else []  # Qwen2-MoE, Qwen3-Next, Qwen3.5
    for pattern, repl in renames:
        names = [pattern.sub(repl, n) for n in names]
    if args.hf_text_of_vlm:  # Qwen3.5: the text model of a vision-language checkpoint
        names = [_VLM_TEXT.sub("model.language_model.", n) for n in names]
    return kind, names


def _generic_rule(name: str, chunk, args):
    if name == "embedding.word_embeddings.weight":  # (+ DeepSeek-V3 / GLM-4.5 MTP layers' copies: mtp.py)
        return "vocab", ["model.embed_tokens.weight"] + mtp.vocab_copies(chunk, args, "embed_tokens")
    if name == "output_layer.weight":
        if isinstance(chunk.output_layer, ValueHead):
            return "skip", []  # critic value head: not part of the HF LM
        tied = not args.untie_embeddings_and_output_weights
        # tied with PP>1: the last stage keeps its own copy of the embedding for the LM head
        return ("vocab", ["model.embed_tokens.weight"]) if tied else \
            ("vocab", ["lm_head.weight"] + mtp.vocab_copies(chunk, args, "shared_head.head"))
    if name == "decoder.final_layernorm.weight":
        return "copy", ["model.norm.weight"]
    mtp_rule = mtp.hf_rule(name, lambda rest, pre: _layer_rule(rest, pre, name, args), args)
    if mtp_rule is not None:  # --enable-mtp-training: MiMo's model.mtp_layers.N.*
        return mtp_rule
    m = _LAYER.match(name)
    if not m:
        raise KeyError(f"no HF mapping for megatron parameter {name!r}")
    layer = chunk.decoder.layers[int(m.group(1))].layer_number - 1  # global index (PP offset)
    return _layer_rule(m.group(2), f"model.layers.{layer}.", name, args)


def _layer_rule(rest: str, pre: str, name: str, args):
    """(kind, HF names) of a transformer layer's parameter, `rest` its layer-relative name, `pre` the HF prefix of
    the layer (`model.layers.L.`, or an MTP layer's `model.mtp_layers.N.`)."""
    if args.multi_latent_attention and rest in _MLA:
        return _MLA[rest][0], [pre + _MLA[rest][1]]
    if rest in _SIMPLE:
        return "copy", [pre + _SIMPLE[rest]]
    if rest in _GATED_DELTA_NET:  # Qwen3-Next / Qwen3.5 linear-attention layers
        kind, hf = _GATED_DELTA_NET[rest]
        if kind == "gdn_in":
            hf = _GDN_IN_PROJ["qwen3_next" if args.hf_model_type == "qwen3_next" else "qwen3_5"]
        return kind, [f"{pre}linear_attn.{n}" for n in hf]
    if rest.startswith("self_attention.linear_qkv.") and rest.rsplit(".", 1)[1] in ("weight", "bias"):
        kind = rest.rsplit(".", 1)[1]
        return "qkv", [f"{pre}self_attn.{p}_proj.{kind}" for p in "qkv"]
    if rest in ("mlp.linear_fc1.weight", "mlp.linear_fc1.bias"):
        kind = rest.rsplit(".", 1)[1]
        if family_of({"model_type": args.hf_model_type}).fused_gate_up:  # GLM-4: one [gate; up]
            return "gate_up_fused", [f"{pre}mlp.gate_up_proj.{kind}"]
        return "gate_up", [f"{pre}mlp.gate_proj.{kind}", f"{pre}mlp.up_proj.{kind}"]
    if rest == "mlp.shared_experts.linear_fc1.weight":
        return "gate_up", [f"{pre}mlp.shared_experts.gate_proj.weight", f"{pre}mlp.shared_experts.up_proj.weight"]
    e = _LOCAL_EXPERT.match(rest) or _GROUPED_EXPERT.match(rest)
    if e:
        if e.re is _LOCAL_EXPERT:
            local, fc, kind = int(e.group(1)), e.group(2), e.group(3)
        else:
            fc, kind, local = e.group(1), e.group(2), int(e.group(3))
        expert = f"{pre}mlp.experts.{_global_expert(local, args)}."
        if fc == "1":
            return "gate_up", [f"{expert}gate_proj.{kind}", f"{expert}up_proj.{kind}"]
        return "copy", [f"{expert}down_proj.{kind}"]
    raise KeyError(f"no HF mapping for megatron parameter {name!r} (layer-relative {rest!r})")


def _global_expert(local: int, args) -> int:
    from megatron.core import parallel_state as ps

    return ps.get_expert_model_parallel_rank() * (args.num_experts // ps.get_expert_model_parallel_world_size()) + local


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
        return hybrid.split_in_proj(full, args, len(_GDN_IN_PROJ["qwen3_next" if args.hf_model_type == "qwen3_next"
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
        if key not in self.where and _vlm_legacy_name(key) in self.where:
            key = _vlm_legacy_name(key)
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
            kind, hf_names = _rule(name, chunk, args)
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
            kind, hf_names = _rule(name, chunk, args)
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
        _, hf_names = _rule(name, chunk, args)
        mine = _global_expert(0, args)  # this rank's first expert; shift the names to ep_rank's experts
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
    legacy = not any(k.startswith(_VLM_LM) for k in keys) and any(k.startswith("visual.") for k in keys)
    return _vlm_legacy_name if legacy else (lambda name: name)


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
