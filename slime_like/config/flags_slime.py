"""slime flags (slime/utils/arguments.py) outside the core loop: hooks, weight-sync variants, agent rollout
buffers, CI checks, kernel choices. Names, dests, types and defaults are slime's, so a recipe parses unchanged;
what each one does here (honoured, refused at launch with the reason, or warned as no effect) is in
config/support.py and docs/configuration.md.
"""
from __future__ import annotations

GROUP = "slime extras"


def add_slime_group(parser):
    g = parser.add_argument_group(GROUP, "slime flags for hooks, weight-sync variants, agent rollouts, CI checks "
                                         "(docs/configuration.md says which are honoured here)")
    a = g.add_argument
    # custom code called by the Megatron trainer or the rollout
    a("--custom-megatron-init-path", default=None, help="'module.function' called after Megatron initialises.")
    a("--custom-megatron-before-log-prob-hook-path", default=None,
      help="'module.function' called before each log-prob pass.")
    a("--custom-megatron-before-train-step-hook-path", default=None,
      help="'module.function' called before each train step.")
    a("--custom-pg-loss-reducer-function-path", default=None, help="'module.function' reducing the policy loss only.")
    a("--rollout-sample-hook-path", action="append", default=[],
      help="'module.function' applied to each generated Sample before its reward (repeatable).")
    a("--loss-mask-type", default="qwen", choices=["qwen", "qwen3", "qwen3_5", "distill_qwen"],
      help="Chat-template loss mask of SFT / multi-turn samples.")
    # optimizer / batching
    a("--use-stateless-adam", action="store_true", help="Adam without persistent moments (needs --no-save-optim).")
    a("--balance-by-flops", action="store_true", help="Partition micro-batches by estimated FLOPs, not tokens.")
    a("--data-pad-size-multiplier", type=int, default=128, help="Pad packed sequences to a multiple of this.")
    # weight sync through the file system and its delta variant
    a("--update-weight-transport", default="nccl", choices=["nccl", "disk"],
      help="How weights reach the engines: nccl = tensors (shared memory when colocated, else a process group; gloo "
           "on CPU), disk = a full HF checkpoint per sync under --update-weight-disk-dir, loaded by each engine.")
    a("--update-weight-disk-dir", default=None, help="Directory of disk-based weight syncs (--update-weight-transport "
                                                     "disk); the engines must see it at the same path.")
    a("--update-weight-disk-keep-files", action="store_true", help="Keep the full checkpoints a disk sync wrote.")
    a("--update-weight-local-checkpoint-dir", default=None, help="Engine-host copy kept in sync by /pull_weights.")
    a("--update-weight-delta-encoding", default="xor", choices=["xor", "overwrite"], help="Delta encoding on disk.")
    a("--update-weight-delta-checksum", default="xxh3-128", choices=["xxh3-128", "blake3", "adler32"],
      help="Per-tensor checksum of disk deltas.")
    a("--custom-update-weight-post-write-path", default=None,
      help="'module.function' called after a disk sync wrote its files.")
    # slime's external rollout buffer (agent examples) and rollout data sources
    a("--rollout-buffer-url", default=None, help="URL of an external rollout buffer.")
    a("--fetch-trajectory-retry-times", type=int, default=-1, help="Retries fetching trajectories (-1: forever).")
    a("--rollout-task-type", default="math", help="Task type sent to the rollout buffer.")
    a("--min-batch-collection-ratio", type=float, default=1, help="Fraction of a batch to collect before training.")
    a("--use-distributed-post", action="store_true", help="Post rollout requests from several processes.")
    a("--disable-rollout-global-dataset", action="store_false", dest="rollout_global_dataset",
      help="Do not sample prompts from --prompt-data (the rollout function manages data itself).")
    a("--load-forge-rollout-data", default=None, help="Replay dumped rollouts through slime's forge_load rollout.")
    a("--http-proxy", default=None, help="HTTP proxy for the rollout's requests.")
    a("--rollout-health-check-first-wait", type=float, default=0, help="Seconds each rollout waits before its first engine health check (engines still compiling).")
    # on-policy distillation (slime's add_on_policy_distillation_arguments; docs/guide.md)
    a("--use-opd", action="store_true", default=False,
      help="On-policy distillation: a teacher scores the student's samples; advantages -= coef x (student - "
           "teacher log-prob). Needs --opd-type.")
    a("--opd-type", default=None, choices=["sglang", "megatron"],
      help="sglang: teacher log-probs from a teacher engine during the rollout (--rm-url, the reward function "
           "slime.rollout.on_policy_distillation.reward_func); megatron: a frozen teacher model in the trainer "
           "(--opd-teacher-load).")
    a("--opd-kl-coef", type=float, default=1.0,
      help="Weight of the OPD reverse-KL term (in the advantages, or in the loss with --opd-kl-mode full).")
    a("--opd-kl-mode", default="sampled", choices=["sampled", "full"],
      help="sampled (slime's): the sampled token's student - teacher log-prob, subtracted from its advantage; "
           "full (ours): the exact reverse KL over the whole vocabulary at every response position, a loss term "
           "computed against the teacher model on each micro-batch (--opd-type megatron, one pipeline stage).")
    a("--opd-teacher-load", default=None,
      help="Teacher checkpoint for --opd-type megatron (torch_dist; an HF directory also works here).")
    a("--opd-teacher-ckpt-step", type=int, default=None, help="Iteration of --opd-teacher-load to load (default: latest).")
    # OPSM companion of the slime-only flag
    a("--opsm-delta", type=float, default=1e-4, help="Threshold of off-policy sequence masking.")
    # CI checks
    a("--ci-test", action="store_true", help="Assert slime's CI invariants during the run.")
    a("--ci-disable-kl-checker", action="store_true", help="Skip the CI KL check.")
    a("--ci-save-grad-norm", default=None, help="Save grad norms for a later CI comparison.")
    a("--ci-load-grad-norm", default=None, help="Compare grad norms with a saved CI run.")
    a("--ci-train-rollout-logprob-abs-diff-threshold", type=float, default=0.1,
      help="Bound on |train - rollout log-prob| under --ci-test.")
    # kernels and profiling
    a("--megatron-deepgemm-forward-layers", nargs="+", type=int, default=None,
      help="Layers whose linears use SGLang's block-FP8 DeepGEMM forward.")
    a("--megatron-deepgemm-forward-modules", nargs="+", default=None, help="Module suffixes for the DeepGEMM forward.")
    a("--megatron-deepgemm-moe-forward-layers", nargs="+", type=int, default=None,
      help="MoE layers whose grouped MLP uses DeepGEMM.")
    a("--megatron-deepgemm-moe-forward-modules", nargs="+", default=None, help="Grouped-MLP module suffixes.")
    a("--qwen-gdn-backend", default="fla", choices=["fla", "flashqla"], help="Gated-delta-net kernel backend.")
    a("--memory-recorder", default="torch", choices=["torch", "memray"], help="Memory recorder.")
    a("--memory-snapshot-num-steps", type=int, default=None, help="Steps recorded per memory snapshot.")
    a("--profile-target", nargs="+", default=["train_overall"],
      choices=["train_overall", "train_actor", "train_log_probs"], help="What the profiler records.")
    return parser
