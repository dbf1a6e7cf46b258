"""DeepSeek sparse attention (DeepSeek-V3.2 `deepseek_v32`, GLM-5 `glm_moe_dsa`) and slime's --allgather-cp.

The Megatron trainer builds these models' sparse attention exactly (backends/megatron/dsa.py: the lightning
indexer's top index_topk keys per query, attention restricted to them), at any sample length. --allgather-cp is
slime's context-parallel layout for them (backends/training/cp_layout.build_allgather_cp_micro_batch): slime
allows it with --context-parallel-size > 1 for the DSA architectures only, since the other models' attention
expects Megatron's 2 x CP chunks per sample; slime_like keeps the rule. With CP 1 it changes nothing (slime's too).
"""
from __future__ import annotations

import os

from slime_like.config.errors import ConfigError


def sparse_attention_checkpoint(args) -> str | None:
    """config.json's model_type when --hf-checkpoint is a DeepSeek sparse attention model, else None."""
    if args.hf_sparse_attention:
        return args.hf_model_type or "deepseek_v32"
    path = args.hf_checkpoint
    if not path or not os.path.isfile(os.path.join(path, "config.json")):
        return None
    from slime_like.config.hf_config import read_hf_config
    from slime_like.config.hf_families import family_of

    cfg = read_hf_config(path)
    return cfg.get("model_type") if family_of(cfg).sparse_attention else None


def _other_known_model(args) -> str | None:
    """config.json's model_type when it is a family slime_like knows (hf_families.MODEL_FAMILIES) without sparse
    attention; None otherwise (no checkpoint yet, a DSA model, or a type the trainer's own check reports)."""
    path = args.hf_checkpoint
    if not path or not os.path.isfile(os.path.join(path, "config.json")):
        return None
    from slime_like.config.hf_config import read_hf_config
    from slime_like.config.hf_families import MODEL_FAMILIES

    model_type = read_hf_config(path).get("model_type")
    known = model_type in MODEL_FAMILIES and not MODEL_FAMILIES[model_type].sparse_attention
    return model_type if known else None


def check(args, report) -> None:
    """slime's GLM-5 spec names a DSA checkpoint; --allgather-cp (below)."""
    from slime_like.config.slime_paths import GLM5_SPEC

    if tuple(args.spec or ()) == GLM5_SPEC and _other_known_model(args):
        raise ConfigError(f"--spec {' '.join(GLM5_SPEC)}: slime's GLM-5 layer spec builds DeepSeek sparse attention "
                          f"from config.json's indexer, and --hf-checkpoint {args.hf_checkpoint} is model_type "
                          f"{_other_known_model(args)} (not deepseek_v32 / glm_moe_dsa). "
                          "Drop --spec or point --hf-checkpoint at a DeepSeek-V3.2 / GLM-5 checkpoint")
    check_allgather_cp(args, report)
    check_stage_starts(args)


def check_stage_starts(args) -> None:
    """GLM-5's shared-indexer layers reuse the previous full layer's top-k, so every pipeline stage must start on a
    full layer (slime's get_glm5_spec asserts the same; GLM-5.2's recipe picks --decoder-first/last-pipeline-num-layers
    for it). Checked for the plain 1F1B split; the interleaved split is checked when the model is built."""
    from slime_like.config.hf_config import read_hf_config
    from slime_like.config.hf_layer_layouts import sparse_attention_settings
    from slime_like.config.trainer_megatron import pipeline_split_problem

    pp, n = args.pipeline_model_parallel_size, args.num_layers
    first, last = args.decoder_first_pipeline_num_layers, args.decoder_last_pipeline_num_layers
    if pp == 1 or not n or not sparse_attention_checkpoint(args) or pipeline_split_problem(n, pp, first, last):
        return
    shared = set(sparse_attention_settings(read_hf_config(args.hf_checkpoint))["shared_layers"])
    middle = pp - (first is not None) - (last is not None)
    each = (n - (first or 0) - (last or 0)) // middle if middle else 0
    sizes = ([first] if first is not None else []) + [each] * middle + ([last] if last is not None else [])
    starts = [sum(sizes[:k]) for k in range(pp)]
    bad = [(k, s) for k, s in enumerate(starts) if s in shared]
    if bad:
        stage, layer = bad[0]
        raise ConfigError(f"--pipeline-model-parallel-size {pp}: pipeline stage {stage} would start on layer "
                          f"{layer + 1} (1-based), a shared-indexer layer of config.json's indexer_types, which "
                          "reuses the previous full layer's top-k from another stage; choose "
                          "--decoder-first/last-pipeline-num-layers so that every stage starts on a full layer "
                          f"(full layers: {sorted(set(range(n)) - shared)[:12]} ..., 0-based), as slime's glm5 "
                          "recipe does")


def check_allgather_cp(args, report) -> None:
    """--allgather-cp with --context-parallel-size > 1 needs a DeepSeek-V3.2 / GLM-5 checkpoint (raised: invalid on
    any hardware, as slime's own check raises)."""
    if not args.allgather_cp or args.context_parallel_size <= 1:
        return
    model_type = _other_known_model(args)
    if model_type:
        raise ConfigError(f"--allgather-cp with --context-parallel-size {args.context_parallel_size}: supported for "
                          f"DeepSeek sparse attention models only (config.json model_type deepseek_v32 or "
                          f"glm_moe_dsa; this one is {model_type}), as in slime: other models' attention expects "
                          "Megatron's 2 x CP chunks per sample. Remove --allgather-cp or set --context-parallel-size 1")
