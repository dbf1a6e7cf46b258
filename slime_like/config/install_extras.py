"""Which install extra of setup.py provides a third-party module, for the messages of an import that failed:
`pip install "slime_like[rollout]"` instead of "is it on PYTHONPATH?". tests/config/test_light_dry_run.py checks
the table against setup.py's extras."""
from __future__ import annotations

import importlib.util

# top-level module -> extra (the first extra that installs its package; torch comes with rollout, megatron, fsdp)
EXTRA_OF_MODULE = {
    "aiohttp": "rollout", "math_verify": "rollout", "pylatexenc": "rollout", "pyarrow": "rollout", "tqdm": "rollout",
    "torch": "rollout", "transformers": "rollout", "tokenizers": "rollout", "safetensors": "rollout",
    "megatron": "megatron", "numpy": "megatron", "peft": "fsdp", "accelerate": "fsdp", "ray": "ray",
    "psutil": "ray", "wandb": "wandb", "tensorboard": "tensorboard", "matplotlib": "plot",
}


def missing_extra(error: BaseException) -> str | None:
    """'pip install "slime_like[rollout]"' when `error` is an import of a module an extra provides, else None."""
    name = getattr(error, "name", None) if isinstance(error, ImportError) else None
    extra = EXTRA_OF_MODULE.get((name or "").split(".")[0])
    return f'pip install "slime_like[{extra}]"' if extra else None


# what every run imports (the Ray driver, the engine client, the models), and each trainer backend's own
RUN_MODULES = ("ray", "aiohttp", "torch", "transformers")
BACKEND_MODULES = {"megatron": ("megatron",), "fsdp": ("peft",)}


def extras_missing_for_a_run(train_backend: str) -> str | None:
    """The one-line refusal of a run whose extras are not installed (checked without importing them), or None."""
    modules = (*RUN_MODULES, *BACKEND_MODULES.get(train_backend, ()))
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    extras = ",".join(sorted({EXTRA_OF_MODULE[m] for m in missing}))
    return (f"a run needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not installed here "
            f'(this install is the light core, enough for --dry-run): pip install "slime_like[{extras}]" '
            '(or "slime_like[all]": everything a CPU machine runs)')
