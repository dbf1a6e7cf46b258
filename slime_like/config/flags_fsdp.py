"""(slime_like) The FSDP2 trainer (`--train-backend fsdp`) and LoRA flags (checked in validate_fsdp.py).

The FSDP trainer loads `--hf-checkpoint` through transformers and shards it with torch's FSDP2
(`fully_shard`); see docs/backends.md. RLinf's `actor.fsdp_config.*` and ROLL's `fsdp2_train`
strategy_config keys map onto these flags (the table is in docs/backends.md).
"""
from __future__ import annotations

import argparse

SHARDING = ("full_shard", "shard_grad_op", "hybrid_shard", "no_shard")
DTYPES = ("fp32", "bf16", "fp16")


def add_fsdp_group(parser):
    g = parser.add_argument_group("fsdp / LoRA", "(slime_like) --train-backend fsdp: HF model, FSDP2, DCP, LoRA")
    a = g.add_argument
    a("--fsdp-sharding-strategy", default="full_shard", choices=SHARDING,
      help="full_shard: params, grads, optimizer state sharded over all ranks, re-gathered per layer. "
           "shard_grad_op: same, but params stay gathered from forward to backward. hybrid_shard: shard within "
           "groups of --fsdp-size ranks, replicate across groups. no_shard: every rank holds everything (DDP).")
    a("--fsdp-size", type=int, default=None,
      help="Ranks per shard group for hybrid_shard (ROLL's fsdp_size); default: all ranks.")
    a("--fsdp-reshard-after-forward", action=argparse.BooleanOptionalAction, default=None,
      help="Free gathered params after each layer's forward (default: on for full_shard / hybrid_shard).")
    a("--fsdp-param-dtype", default=None, choices=DTYPES,
      help="Mixed-precision policy: dtype of gathered params in forward/backward (default: fp32; bf16 with --bf16). "
           "The sharded master params and the optimizer stay fp32.")
    a("--fsdp-reduce-dtype", default="fp32", choices=DTYPES, help="Mixed-precision policy: gradient reduce dtype.")
    a("--fsdp-cpu-offload", action="store_true",
      help="Keep sharded params, grads and optimizer state in CPU memory (FSDP2 CPUOffloadPolicy); GPU only.")
    a("--fsdp-offload-pin-memory", action=argparse.BooleanOptionalAction, default=True,
      help="Pin the CPU-offloaded memory (faster host<->device copies); with --fsdp-cpu-offload.")
    a("--fsdp-forward-prefetch", action="store_true",
      help="Explicitly prefetch the next layer's all-gather during forward (more memory, more overlap).")
    a("--fsdp-defer-grad-sync", action=argparse.BooleanOptionalAction, default=True,
      help="Reduce-scatter gradients once after the step's last micro-batch, not after every micro-batch "
           "(RLinf enable_gradient_accumulation; more memory, less communication; same result).")
    a("--fsdp-autocast", default=None, choices=("bf16", "fp16"),
      help="Run forward/backward under torch.autocast with this dtype (RLinf amp_autocast).")
    a("--lora-rank", type=int, default=0, help="LoRA rank (peft); 0 = train all weights. FSDP trainer only.")
    a("--lora-alpha", type=float, default=16.0, help="LoRA scaling numerator: updates are scaled by alpha / rank.")
    a("--lora-dropout", type=float, default=0.0, help="Dropout on the LoRA branch input.")
    a("--lora-target-modules", nargs="+", default=["all-linear"],
      help="Module names (suffixes, e.g. q_proj v_proj) that get adapters; 'all-linear' = every linear layer "
           "except the output head.")
    a("--lora-save-merged", action="store_true",
      help="With --save-hf: also write the merged (base + adapter) model under <save-hf>/merged.")
    return parser
