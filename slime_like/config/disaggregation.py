"""Prefill / decode disaggregation (slime's --prefill-num-servers, or the prefill / decode server groups of an
--sglang-config layout file): the first N rollout engines only prefill (SGLang's --disaggregation-mode prefill, each
with its own --disaggregation-bootstrap-port), the others only decode (--disaggregation-mode decode). The driver's
sglang-router runs with --pd-disaggregation and sends each request to one prefill and one decode engine, which
hand the KV cache over through SGLang's transfer backend (--sglang-disaggregation-transfer-backend, mooncake by
default, or nixl; RDMA NICs: --sglang-disaggregation-ib-device). Every engine, prefill or decode, holds the policy's
weights and receives every weight push.

slime's rules kept: at least one engine decodes; not with --rollout-external-engine-addrs; --prefill-num-servers and
a layout file's groups are one setting, so not both. Refused at launch: an engine without a KV transfer between
servers (the CPU engine prefills and decodes in one process), and --use-fault-tolerance (a restarted prefill engine
would have to rejoin the router with its bootstrap port: not built). Each engine's role: engine_api/engine.pd_role.
"""
from __future__ import annotations

from slime_like.config.errors import ConfigError
from slime_like.config.types import Int
from slime_like.registry import ROLLOUT_ENGINES

def add_disaggregation_flags(g):
    g.add_argument("--prefill-num-servers", type=Int(1), default=None,
                   help="Prefill / decode disaggregation: the first N rollout engines only prefill, the others only "
                        "decode, behind an sglang-router in --pd-disaggregation mode (SGLang; slime's flag).")
    return g


def check_disaggregation(args, report) -> None:
    """After the cluster check resolved --rollout-num-gpus and --rollout-engine."""
    n = args.prefill_num_servers
    if n is None or args.debug_train_only:
        return
    where = f"--prefill-num-servers {n}"
    if args.rollout_external_engine_addrs:
        raise ConfigError(f"{where} with --rollout-external-engine-addrs: the engines' prefill / decode roles are set "
                          "when this run starts them (slime's rule too); drop one")
    if args.sglang_router_ip:
        raise ConfigError(f"{where} with --sglang-router-ip {args.sglang_router_ip}: the router in front of prefill "
                          "and decode engines must run with --pd-disaggregation and know each prefill engine's "
                          "bootstrap port, so the driver starts it; drop --sglang-router-ip / --sglang-router-port")
    engines = (args.rollout_num_gpus or 0) // max(1, args.rollout_num_gpus_per_engine)
    if n >= engines:
        raise ConfigError(f"{where}: the run has {engines} rollout engine(s) of {args.rollout_num_gpus_per_engine} "
                          f"GPU(s) (--rollout-num-gpus {args.rollout_num_gpus}), so none would decode; lower it below "
                          f"{engines} or give the engines more GPUs")
    if not ROLLOUT_ENGINES.has(args.rollout_engine, "pd_disaggregation"):
        report.refuse(f"{where} with --rollout-engine {args.rollout_engine}: "
                      f"{ROLLOUT_ENGINES.display(args.rollout_engine)} prefills and decodes in one process and has "
                      "no KV-cache transfer between servers; prefill / decode disaggregation needs SGLang engines "
                      "(--rollout-engine sglang) with a transfer backend (mooncake or nixl, RDMA NICs)")
    if args.use_fault_tolerance:
        report.refuse(f"{where} with --use-fault-tolerance: restarting a prefill or decode engine (rejoining the "
                      "--pd-disaggregation router with its role and bootstrap port) is not built; drop one")


def roles_text(args, engines: int) -> str:
    """The dry run's note on the engines' roles ('' when not disaggregated)."""
    n = args.prefill_num_servers
    if not n:
        return ""
    return f" ({n} prefill, {engines - n} decode: prefill / decode disaggregation)"
