"""A vision-language --hf-checkpoint (config.json with a vision_config) under the Megatron trainer: the parallelism
its HF vision tower runs under (families with hf_families.MODEL_FAMILIES' vision_language)."""
from __future__ import annotations

from slime_like.config.checkpoint import raw_hf_config
from slime_like.config.errors import ConfigError
from slime_like.config.hf_families import MODEL_FAMILIES


def check_vision_language(args):
    """A vision-language --hf-checkpoint whose tower the Megatron trainer runs (hf_config: vision_language): the
    parallelism the tower runs under (the first pipeline stage's embedding, on full-sequence activations)."""
    cfg = raw_hf_config(args.hf_checkpoint)
    if not cfg or not isinstance(cfg.get("vision_config"), dict):
        return
    text_type = (cfg.get("text_config") or {}).get("model_type")
    if not (text_type in MODEL_FAMILIES and MODEL_FAMILIES[text_type].vision_language):
        return  # a text model trained alone (Qwen3.5: the tower stays as loaded), or refused by read_hf_config
    problems = []
    if args.pipeline_model_parallel_size > 1:
        problems.append(f"--pipeline-model-parallel-size {args.pipeline_model_parallel_size}: the vision tower and "
                        "DeepStack features are not passed between pipeline stages; use 1 (TP works)")
    if args.context_parallel_size > 1:
        problems.append(f"--context-parallel-size {args.context_parallel_size}: M-RoPE positions and the image rows "
                        "are computed over whole samples, not CP shards; use 1")
    if args.sequence_parallel:
        problems.append("--sequence-parallel: the image embeddings replace rows of the full-sequence word "
                        "embeddings; drop --sequence-parallel")
    if problems:
        raise ConfigError(f"--hf-checkpoint {args.hf_checkpoint} is a vision-language model; with --train-backend "
                          "megatron: " + "; ".join(problems))
