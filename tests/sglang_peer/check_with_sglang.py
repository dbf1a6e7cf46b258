"""Run under the interpreter that has SGLang (bench/.venv-vllm + `sglang==0.5.23 --no-deps`): check our side with
SGLang's own code and print one JSON line. Usage: python check_with_sglang.py {passthrough|launch|nodes|router|bodies IN.json|responses IN.json|all BODIES RESPONSES}

* passthrough: our parser in generated mode (from SGLang's real ServerArgs); every generated --sglang-* flag, given
  a value of its kind, goes through our parser and build_sglang_command, and SGLang's own parser reads it back.
* launch: build_sglang_command's argv through SGLang's prepare_server_args -> the ServerArgs we intend.
* nodes: the per-node commands of one engine spanning two nodes, each through prepare_server_args.
* bodies: every recorded request body goes into SGLang's own request class for its route (io_struct).
* responses: for each recorded (request, our answer), SGLang's own TokenizerManager builds its answer from the same
  scheduler output (finish reason made by SGLang's FINISH_* classes); the two must have the same keys and kinds.
* router: build_router_command's argv through sglang_router's own parser (parse_router_args) and the Rust router's
  config builder (Router.from_args; nothing is started) -> the RouterArgs we intend. Needs sglang-router installed.
"""
import argparse
import json
import sys


def sglang_parser():
    from sglang.srt.server_args import ServerArgs

    p = argparse.ArgumentParser()
    ServerArgs.add_cli_args(p)
    return p


def sample_value(action):
    """A non-default value of the option's kind, as CLI tokens and as the value SGLang should read back."""
    if action.nargs == 0:                                        # store_true / store_false / custom switches
        return [], True if action.const is None else action.const
    if action.choices:
        for c in action.choices:
            if c != action.default:
                return [str(c)], c
        return None
    if action.type in (int, float):
        v = action.type(7)
        return [str(v)], ([v] if action.nargs in ("+", "*") else v)
    if action.type in (None, str) and action.nargs in (None, "+", "*"):
        return ["slime-like-probe"], (["slime-like-probe"] if action.nargs else "slime-like-probe")
    return None                                                  # json / custom parsers: not probed


def passthrough():
    from slime_like.backends.sglang.engine import build_sglang_command
    from slime_like.config.parser import parse_namespace
    from slime_like.config.sglang_passthrough import LAUNCHER_OWNED

    base = ["--rollout-engine", "sglang", "--hf-checkpoint", "/nonexistent/model"]
    args, _ = parse_namespace(base)
    assert args.sglang_passthrough_mode == "generated", args.sglang_passthrough_mode
    theirs = sglang_parser()
    checked, skipped, failed = 0, [], []
    for action in theirs._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs or action.dest in LAUNCHER_OWNED or action.dest == "help":
            continue
        probe = sample_value(action)
        if probe is None:
            skipped.append(action.dest)
            continue
        tokens, _ = probe
        ours = ["--sglang-" + longs[0][2:], *tokens]
        cmd = []
        try:
            # what SGLang itself makes of the user's flag == what it makes of the command we build from ours
            expected = getattr(theirs.parse_args(["--model-path", "m", longs[0], *tokens]), action.dest)
            a, _ = parse_namespace(base + ours)
            cmd = build_sglang_command(a, port=30000, host="127.0.0.1", base_gpu_id=0, tp_size=1)
            back = theirs.parse_args(cmd[3:])
            got = getattr(back, action.dest)
            if got != expected:
                failed.append(f"{longs[0]}: sent {tokens} -> SGLang read {got!r}, expected {expected!r}")
        except SystemExit:
            failed.append(f"{longs[0]}: SGLang's parser rejected {cmd[3:]}")
        except Exception as e:  # noqa: BLE001
            failed.append(f"{longs[0]}: {type(e).__name__}: {e}")
        checked += 1
    return {"options": len(theirs._actions), "checked": checked, "skipped": skipped, "failed": failed}


def launch():
    import types

    from sglang.srt.server_args import prepare_server_args

    from slime_like.backends.sglang.engine import build_sglang_command

    args = types.SimpleNamespace(hf_checkpoint="/models/Qwen2.5-7B", rollout_num_gpus_per_engine=2, seed=7,
                                 offload_rollout=True, colocate=True, trust_remote_code=False,
                                 use_rollout_routing_replay=True, sglang_cli_options={},
                                 sglang_server_args={"mem_fraction_static": 0.7, "context_length": 4096,
                                                     "chunked_prefill_size": 4096, "enable_metrics": True})
    cmd = build_sglang_command(args, port=30007, host="10.0.0.5", base_gpu_id=4, tp_size=2, nccl_port=31000,
                               dist_init_addr="10.0.0.5:5000", nnodes=2, node_rank=1)
    sa = prepare_server_args(cmd[3:])
    want = {"model_path": "/models/Qwen2.5-7B", "tp_size": 2, "port": 30007, "host": "10.0.0.5", "base_gpu_id": 4,
            "random_seed": 7, "enable_memory_saver": True, "nccl_port": 31000, "dist_init_addr": "10.0.0.5:5000",
            "nnodes": 2, "node_rank": 1, "mem_fraction_static": 0.7, "context_length": 4096,
            "chunked_prefill_size": 4096, "enable_metrics": True, "enable_return_routed_experts": True}
    got = {k: getattr(sa, k) for k in want}
    return {"argv": cmd[1:], "mismatch": {k: [want[k], got[k]] for k in want if got[k] != want[k]}}


def nodes():
    """The per-node commands of one engine over two 8-GPU nodes (SGLangEngine.node_launch_command for the nodes
    engine_api.engine_nodes plans) through SGLang's prepare_server_args: one TP group of 16 over both nodes."""
    import types

    from sglang.srt.server_args import prepare_server_args

    from slime_like.backends.engine_api.engine import engine_nodes
    from slime_like.backends.sglang.engine import SGLangEngine

    args = types.SimpleNamespace(hf_checkpoint="/models/Qwen3-235B", rollout_num_gpus_per_engine=16, seed=1,
                                 offload_rollout=False, colocate=False, trust_remote_code=False,
                                 use_rollout_routing_replay=False, sglang_cli_options={},
                                 sglang_server_args={"mem_fraction_static": 0.7})
    out = {"mismatch": [], "argv": []}
    for node, gpus in engine_nodes([list(range(8)), list(range(8))], "10.0.0.5:5000"):
        host = f"10.0.0.{5 + node.node_rank}"
        cmd = SGLangEngine().node_launch_command(args, host=host, port=30000, gpu_ids=gpus, node=node)
        sa = prepare_server_args(cmd[3:])
        want = {"tp_size": 16, "nnodes": 2, "node_rank": node.node_rank, "dist_init_addr": "10.0.0.5:5000",
                "base_gpu_id": 0, "host": host, "port": 30000, "model_path": "/models/Qwen3-235B"}
        got = {k: getattr(sa, k) for k in want}
        out["argv"].append(cmd[3:])
        if got != want:
            out["mismatch"].append({"node": node.node_rank, "want": want, "got": got})
    out["weight_sync_ranks"] = SGLangEngine().weight_sync_ranks(args)
    return out


def disaggregation():
    """A prefill / decode disaggregated run: each engine's command (start_engine's argv: launch command, then the
    role's flags) through SGLang's prepare_server_args, and the driver's --pd-disaggregation router command through
    sglang_router's own parser and config builder."""
    import types

    from sglang.srt.server_args import prepare_server_args

    from slime_like.backends.sglang.engine import SGLangEngine
    from slime_like.backends.engine_api.engine import pd_role

    args = types.SimpleNamespace(hf_checkpoint="/models/GLM-5", rollout_num_gpus_per_engine=2, seed=1,
                                 offload_rollout=True, colocate=True, trust_remote_code=False, prefill_num_servers=1,
                                 use_rollout_routing_replay=False, sglang_cli_options={},
                                 sglang_server_args={"disaggregation_transfer_backend": "nixl"})
    out = {"mismatch": [], "argv": []}
    for index, port in enumerate((30001, 30002, 30003)):
        role = pd_role(args, index)
        bootstrap = 9000 + index if role == "prefill" else None
        engine = SGLangEngine()
        cmd = engine.launch_command(args, host="10.0.0.5", port=port, gpu_ids=[2 * index, 2 * index + 1])
        cmd += engine.disaggregation_args(role, bootstrap)
        sa = prepare_server_args(cmd[3:])
        want = {"disaggregation_mode": role, "disaggregation_transfer_backend": "nixl", "tp_size": 2, "port": port}
        if bootstrap is not None:
            want["disaggregation_bootstrap_port"] = bootstrap
        got = {k: getattr(sa, k) for k in want}
        out["argv"].append(cmd[3:])
        if got != want:
            out["mismatch"].append({"engine": index, "want": want, "got": got})
    out["router"] = _pd_router()
    return out


def _pd_router() -> dict:
    import types

    try:
        from sglang_router.launch_router import parse_router_args
        from sglang_router.router import Router
    except ImportError as e:
        return {"not_installed": str(e)}
    from slime_like.backends.sglang.router import build_router_command

    args = types.SimpleNamespace(router_args={}, sglang_router_request_timeout_secs=600, engine_api_key="k")
    prefill, decode = [("http://10.0.0.5:30001", 9000)], ["http://10.0.0.5:30002", "http://10.0.0.5:30003"]
    cmd = build_router_command(args, [], host="10.0.0.5", port=30000, pd=(prefill, decode))
    ra = parse_router_args(cmd[3:])
    Router.from_args(ra)   # the Rust side's own validation of the whole config
    return {"argv": cmd[3:], "pd_disaggregation": ra.pd_disaggregation,
            "prefill_urls": [list(p) for p in ra.prefill_urls], "decode_urls": ra.decode_urls,
            "worker_urls": ra.worker_urls}


ROUTES = {"/generate": "GenerateReqInput", "/update_weights_from_tensor": "UpdateWeightsFromTensorReqInput",
          "/update_weights_from_distributed": "UpdateWeightsFromDistributedReqInput",
          "/update_weights_from_disk": "UpdateWeightFromDiskReqInput",
          "/init_weights_update_group": "InitWeightsUpdateGroupReqInput",
          "/destroy_weights_update_group": "DestroyWeightsUpdateGroupReqInput",
          "/release_memory_occupation": "ReleaseMemoryOccupationReqInput",
          "/resume_memory_occupation": "ResumeMemoryOccupationReqInput",
          "/pause_generation": "PauseGenerationReqInput", "/continue_generation": "ContinueGenerationReqInput",
          "/abort_request": "AbortReq", "/weights_checker": "CheckWeightsReqInput"}


# sglang modules that import torchvision at module level (vision model configs), reached from io_struct through
# the model-config registry. The only torchvision PyPI offers here is CUDA-linked and breaks vLLM's import in this
# venv, so these modules get placeholders (their names resolve to empty classes); the request classes never use them.
TORCHVISION_USERS = ("sglang.srt.multimodal.internvl_utils", "sglang.srt.configs.deepseek_ocr",
                     "sglang.srt.configs.unlimited_ocr")


def _placeholder_vision_modules():
    import types

    class _Placeholder(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return type(name, (), {"model_type": f"placeholder_{name}"})

    for name in TORCHVISION_USERS:
        sys.modules.setdefault(name, _Placeholder(name))


def bodies(path):
    _placeholder_vision_modules()
    import msgspec
    from sglang.srt.managers import io_struct

    with open(path) as f:
        recorded = json.load(f)
    out = {"accepted": {}, "rejected": [], "unmapped": [], "images": []}
    for route, body in recorded:
        if route not in ROUTES:
            out["unmapped"].append(route)
            continue
        cls = getattr(io_struct, ROUTES[route])
        try:
            obj = cls(**body)               # unknown field names fail here (TypeError)
            if issubclass(cls, msgspec.Struct):   # wrong types fail SGLang's own typed decoding (its wire format)
                msgspec.json.decode(msgspec.json.encode(obj), type=cls)
            if route == "/generate":
                obj.normalize_batch_and_arguments()   # SGLang's own single/batch validation
                out["images"] += _sglang_image_sizes(obj)
            out["accepted"][route] = out["accepted"].get(route, 0) + 1
        except Exception as e:  # noqa: BLE001
            out["rejected"].append(f"{route} {sorted(body)}: {type(e).__name__}: {e}")
    return out


def _sglang_image_sizes(obj):
    """[width, height] of every image of a normalized GenerateReqInput, decoded by SGLang's own load_image (what
    its multimodal processors call on each image_data item)."""
    from sglang.srt.utils import load_image

    items = obj.image_data if obj.image_data is not None else []
    entries = items if obj.is_single is False else [items]
    flat = [x for entry in entries for x in (entry if isinstance(entry, list) else [entry] if entry else [])]
    return [list(load_image(x)[0].size) for x in flat]


def _sglang_finish_reason(fr):
    """The finish reason SGLang's scheduler would send for ours, made by SGLang's own classes."""
    from sglang.srt.managers import schedule_batch as sb

    if fr is None:
        return None
    if fr["type"] == "stop":
        m = fr["matched"]
        return (sb.FINISH_MATCHED_STR(m) if isinstance(m, str) else sb.FINISH_MATCHED_TOKEN(m)).to_json()
    if fr["type"] == "length":
        return sb.FINISH_LENGTH(fr["length"]).to_json()
    return sb.FINISH_ABORT(fr.get("message"), fr.get("status_code"), fr.get("err_type")).to_json()


def _published(model_path):
    """SGLang's process-wide config for a tokenizer process (the TokenizerManager reads it), default flags."""
    from sglang.srt.runtime_context import publish
    from sglang.srt.server_args import prepare_server_args

    publish(prepare_server_args(["--model-path", model_path, "--device", "cpu"]), role="tokenizer")


def sglang_answer(request: dict, ours: dict) -> dict:
    """SGLang's /generate answer for `request`, built by its own TokenizerManager._handle_batch_output from the
    scheduler output that carries our tokens, text, counts and log-probs (a manager object without its processes)."""
    import asyncio

    from sglang.srt.managers import io_struct, tokenizer_manager as tm
    from sglang.srt.observability.req_time_stats import APIServerReqTimeStats

    obj = io_struct.GenerateReqInput(**request)
    obj.normalize_batch_and_arguments()
    meta, ids = ours["meta_info"], list(ours["output_ids"])
    mgr = object.__new__(tm.TokenizerManager)
    state = tm.ReqState(out_list=[], finished=False, event=asyncio.Event(), obj=obj, time_stats=APIServerReqTimeStats())
    mgr.rid_to_state = {meta["id"]: state}
    for name, value in dict(enable_metrics=False, incremental_streaming_output=False, skip_tokenizer_init=False,
                            dump_requests_folder=None, crash_dump_folder=None, enable_lora=False).items():
        setattr(mgr, name, value)   # the server's defaults
    lps = meta.get("output_token_logprobs") or []
    nothing = dict.fromkeys(("input_top_logprobs_val", "input_top_logprobs_idx", "output_top_logprobs_val",
                             "output_top_logprobs_idx", "input_token_ids_logprobs_val", "input_token_ids_logprobs_idx",
                             "output_token_ids_logprobs_val", "output_token_ids_logprobs_idx"), [])
    recv = io_struct.BatchStrOutput(
        rids=[meta["id"]], finished_reasons=[_sglang_finish_reason(meta["finish_reason"])],
        output_strs=[ours["text"]], output_ids=[ids], prompt_tokens=[meta["prompt_tokens"]],
        completion_tokens=[len(ids)], reasoning_tokens=[0], cached_tokens=[meta["cached_tokens"]],
        input_token_logprobs_val=[[]], input_token_logprobs_idx=[[]],
        output_token_logprobs_val=[[x[0] for x in lps]], output_token_logprobs_idx=[[x[1] for x in lps]],
        output_token_entropy_val=None, output_token_sampling_mask=None, output_hidden_states=None,
        routed_experts=None, indexer_topk=None, placeholder_tokens_idx=None, placeholder_tokens_val=None,
        retraction_counts=[0], **nothing)
    asyncio.run(mgr._handle_batch_output(recv))
    return json.loads(json.dumps(state.out_list[-1]))   # as the HTTP layer serialises it


def shape(value, path="") -> dict:
    """{json path: kind} of a JSON value (lists: their first element), to compare two answers' structure."""
    kinds = {bool: "bool", int: "int", float: "number", str: "str", type(None): "null"}
    if isinstance(value, dict):
        out = {path or "/": "object"}
        for k, v in value.items():
            out.update(shape(v, f"{path}/{k}"))
        return out
    if isinstance(value, list):
        return {path: "list", **(shape(value[0], path + "[]") if value else {})}
    return {path: kinds.get(type(value), type(value).__name__)}


def responses(path, model_path):
    """Each of our answers against the one SGLang's own code builds for the same request and tokens."""
    _placeholder_vision_modules()
    _published(model_path)
    with open(path) as f:
        cases = json.load(f)
    out = {"checked": 0, "differences": [], "keys": None}
    for name, request, ours in cases:
        theirs = sglang_answer(request, ours)
        a, b = shape(ours), shape(theirs)
        diff = {p: [a.get(p), b.get(p)] for p in sorted(set(a) | set(b)) if a.get(p) != b.get(p)}
        if ours["meta_info"]["finish_reason"] != theirs["meta_info"]["finish_reason"]:
            diff["finish_reason"] = [ours["meta_info"]["finish_reason"], theirs["meta_info"]["finish_reason"]]
        if diff:
            out["differences"].append({"case": name, "ours_vs_sglang": diff})
        out["checked"] += 1
        out["keys"] = sorted(theirs["meta_info"])
    return out


def router():
    """Our router command read by the router's own parser and config builder."""
    import types

    from sglang_router.launch_router import parse_router_args
    from sglang_router.router import Router

    from slime_like.backends.sglang.router import POLICIES, build_router_command

    urls = ["http://10.0.0.5:30001", "http://10.0.0.6:30002"]
    cases = [({}, {"policy": "cache_aware", "request_timeout_secs": 14400}),
             ({"policy": "round_robin", "balance_abs_threshold": 16, "dp_aware": True, "request_timeout_secs": 60},
              {"policy": "round_robin", "balance_abs_threshold": 16, "dp_aware": True, "request_timeout_secs": 60})]
    cases += [({"policy": p}, {"policy": p}) for p in POLICIES]
    out = {"checked": 0, "mismatch": [], "rejected": []}
    for extra, want in cases:
        # the run's secret: the router must send it to the engines (their --api-key)
        args = types.SimpleNamespace(router_args=dict(extra), sglang_router_request_timeout_secs=14400,
                                     engine_api_key="peer-secret")
        cmd = build_router_command(args, urls, host="10.0.0.5", port=30000)
        want = {"host": "10.0.0.5", "port": 30000, "worker_urls": urls, "api_key": "peer-secret", **want}
        try:
            ra = parse_router_args(cmd[3:])
            got = {k: getattr(ra, k) for k in want}   # before from_args, which turns policy into an enum
            Router.from_args(ra)                     # the Rust side's own validation of the whole config
        except (SystemExit, Exception) as e:   # noqa: BLE001
            out["rejected"].append(f"{cmd[3:]}: {type(e).__name__}: {e}")
            continue
        if got != want:
            out["mismatch"].append({"argv": cmd[3:], "want": want, "got": got})
        out["checked"] += 1
    return out


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "all":   # one interpreter start (importing SGLang costs ~30 s here) for every check
        result = {"passthrough": passthrough(), "launch": launch(), "nodes": nodes(),
                  "disaggregation": disaggregation(), "bodies": bodies(sys.argv[2]),
                  "responses": responses(sys.argv[3], sys.argv[4])}
        try:
            import sglang_router  # noqa: F401
            result["router"] = router()
        except ImportError as e:
            result["router"] = {"not_installed": str(e)}
    elif mode == "responses":
        result = responses(sys.argv[2], sys.argv[3])
    else:
        result = {"passthrough": passthrough, "launch": launch, "nodes": nodes, "router": router,
                  "disaggregation": disaggregation}.get(
            mode, lambda: bodies(sys.argv[2]))()
    print("RESULT " + json.dumps(result, default=str))
