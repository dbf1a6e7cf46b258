"""Run under the interpreter that has SGLang (bench/.venv-vllm + `sglang==0.5.23 --no-deps`): check our side with
SGLang's own code and print one JSON line. Usage: python check_with_sglang.py {passthrough|launch|bodies IN.json|all IN.json}

* passthrough: our parser in generated mode (from SGLang's real ServerArgs); every generated --sglang-* flag, given
  a value of its kind, goes through our parser and build_sglang_command, and SGLang's own parser reads it back.
* launch: build_sglang_command's argv through SGLang's prepare_server_args -> the ServerArgs we intend.
* bodies: every recorded request body goes into SGLang's own request class for its route (io_struct).
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
                                 offload_rollout=True, colocate=True,
                                 sglang_server_args={"mem_fraction_static": 0.7, "context_length": 4096,
                                                     "chunked_prefill_size": 4096, "enable_metrics": True})
    cmd = build_sglang_command(args, port=30007, host="10.0.0.5", base_gpu_id=4, tp_size=2, nccl_port=31000,
                               dist_init_addr="10.0.0.5:5000", nnodes=2, node_rank=1)
    sa = prepare_server_args(cmd[3:])
    want = {"model_path": "/models/Qwen2.5-7B", "tp_size": 2, "port": 30007, "host": "10.0.0.5", "base_gpu_id": 4,
            "random_seed": 7, "enable_memory_saver": True, "nccl_port": 31000, "dist_init_addr": "10.0.0.5:5000",
            "nnodes": 2, "node_rank": 1, "mem_fraction_static": 0.7, "context_length": 4096,
            "chunked_prefill_size": 4096, "enable_metrics": True}
    got = {k: getattr(sa, k) for k in want}
    return {"argv": cmd[1:], "mismatch": {k: [want[k], got[k]] for k in want if got[k] != want[k]}}


ROUTES = {"/generate": "GenerateReqInput", "/update_weights_from_tensor": "UpdateWeightsFromTensorReqInput",
          "/update_weights_from_distributed": "UpdateWeightsFromDistributedReqInput",
          "/update_weights_from_disk": "UpdateWeightFromDiskReqInput",
          "/init_weights_update_group": "InitWeightsUpdateGroupReqInput",
          "/destroy_weights_update_group": "DestroyWeightsUpdateGroupReqInput",
          "/release_memory_occupation": "ReleaseMemoryOccupationReqInput",
          "/resume_memory_occupation": "ResumeMemoryOccupationReqInput",
          "/pause_generation": "PauseGenerationReqInput", "/continue_generation": "ContinueGenerationReqInput",
          "/abort_request": "AbortReq"}


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
    out = {"accepted": {}, "rejected": [], "unmapped": []}
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
            out["accepted"][route] = out["accepted"].get(route, 0) + 1
        except Exception as e:  # noqa: BLE001
            out["rejected"].append(f"{route} {sorted(body)}: {type(e).__name__}: {e}")
    return out


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "all":   # one interpreter start (importing SGLang costs ~30 s here) for the three checks
        result = {"passthrough": passthrough(), "launch": launch(), "bodies": bodies(sys.argv[2])}
    else:
        result = {"passthrough": passthrough, "launch": launch}.get(mode, lambda: bodies(sys.argv[2]))()
    print("RESULT " + json.dumps(result, default=str))
