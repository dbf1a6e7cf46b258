"""--enable-mtp-training's launch check: the Megatron trainer trains the multi-token-prediction layers of MiMo,
DeepSeek-V3 and GLM-4.5
(backends/megatron/mtp.py); what it cannot build is refused at launch, naming the flag and the checkpoint's
model_type (the flags themselves are model flags: config/model.py)."""
from __future__ import annotations

import os

from slime_like.config.errors import ConfigError
from slime_like.config.hf_config import read_hf_config
from slime_like.config.hf_families import family_of
from slime_like.config.hf_layer_layouts import declared_mtp_layers
from slime_like.registry import TRAINER_BACKENDS


def check_mtp_training(args, report) -> None:
    """--enable-mtp-training (backends/megatron/mtp.py): the MTP layers come from --hf-checkpoint's own MTP weights,
    mapped for MiMo, DeepSeek-V3 and GLM-4.5; what the trainer cannot build is refused at launch (the dry run lists
    it)."""
    if not args.enable_mtp_training:
        return
    if not args.mtp_num_layers:
        raise ConfigError("--enable-mtp-training needs --mtp-num-layers N (the checkpoint's MTP layers, config.json "
                          "num_nextn_predict_layers; slime's MiMo recipe passes --mtp-num-layers 1)")
    refuse = report.launch_refusals.append
    if not TRAINER_BACKENDS.has(args.train_backend, "trains_mtp"):
        refuse(f"--enable-mtp-training with --train-backend {args.train_backend}: "
               f"{TRAINER_BACKENDS.display(args.train_backend)} builds no MTP layers; use --train-backend megatron")
    for size, flag in ((args.pipeline_model_parallel_size, "--pipeline-model-parallel-size"),
                       (args.context_parallel_size, "--context-parallel-size")):
        if size > 1:
            refuse(f"--enable-mtp-training with {flag} {size}: MTP training is built and tested for one pipeline "
                   f"stage without context parallelism (TP, sequence parallelism and DP are fine); use {flag} 1")
    for dest, flag in (("use_routing_replay", "--use-routing-replay"),
                       ("use_rollout_routing_replay", "--use-rollout-routing-replay")):
        if getattr(args, dest):
            refuse(f"--enable-mtp-training with {flag}: the replayed routing covers the main model's MoE layers, "
                   "not an MTP layer's; drop one of them")
    _check_mtp_checkpoint(args, refuse)


def _check_mtp_checkpoint(args, refuse) -> None:
    """The --hf-checkpoint's config.json has MTP layers of a layout whose weights are mapped (hf_families'
    mtp_layout: MiMo's, DeepSeek-V3 / GLM-4.5's)."""
    path = args.hf_checkpoint
    if not path or not os.path.isfile(os.path.join(path, "config.json")):
        return  # no config.json to read here (the trainer's load names what is missing)
    cfg = read_hf_config(path)
    model_type, declared = cfg.get("model_type", ""), declared_mtp_layers(cfg)
    if not family_of(cfg).mtp_layout:
        refuse(f"--enable-mtp-training with --hf-checkpoint {path} (model_type {model_type!r}): the trainer maps the "
               "MTP weights of MiMo (mimo: model.mtp_layers.N.*), DeepSeek-V3 (deepseek_v3) and GLM-4.5 (glm4_moe: "
               "model.layers.<num_hidden_layers + N>.*) only; this model_type's MTP layers are not mapped. Drop "
               "--enable-mtp-training (the MTP layers are then left out and the engines keep their draft)")
    elif declared < args.mtp_num_layers:
        refuse(f"--mtp-num-layers {args.mtp_num_layers} with --enable-mtp-training but {path}/config.json declares "
               f"{declared} MTP layer(s) (num_nextn_predict_layers): the trainer loads MTP layers from the checkpoint; "
               f"use --mtp-num-layers {declared}")
