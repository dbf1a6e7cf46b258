"""slime_like: RL post-training of LLMs with megatron-core trainers and SGLang (or CPU) rollout engines."""
import pathlib
import re

from setuptools import find_packages, setup

HERE = pathlib.Path(__file__).parent


def _pins() -> dict:
    """requirements.txt's exact pins by package name: the extras below take their versions from there, so
    `pip install "slime_like[all]"` installs the stack the tests ran on (one place to bump a version)."""
    pins = {}
    for line in (HERE / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name = re.split(r"[\[=<>~!]", line, maxsplit=1)[0].lower()
            pins[name] = line
    return pins


PINS = _pins()
# slime_like.__version__, read as text: importing the package here would need its dependencies installed
VERSION = re.search(r'^__version__ = "([^"]+)"', (HERE / "slime_like" / "__init__.py").read_text(), re.M).group(1)


def pinned(*names: str) -> list:
    return [PINS[n] for n in names]


EXTRAS = {
    # the trainer: megatron-core on torch, HF configs / weights
    "megatron": pinned("torch", "megatron-core", "transformers", "tokenizers", "safetensors", "numpy"),
    # the FSDP2 trainer (--train-backend fsdp): the HF model through transformers, LoRA through peft; no
    # megatron-core (tests/fsdp/test_fsdp_without_megatron.py trains with it blocked)
    "fsdp": pinned("torch", "transformers", "peft", "accelerate", "safetensors", "numpy"),
    # the Ray layer (placement, actors, the run's own cluster)
    "ray": pinned("ray", "psutil", "zstandard", "xxhash"),   # zstandard / xxhash: delta weight sync's sender
    # rollout: engine client, data sources, reward graders, the embedded CPU engine (torch + transformers)
    "rollout": pinned("aiohttp", "math-verify", "pylatexenc", "pyarrow", "tqdm", "torch", "transformers",
                      "tokenizers", "safetensors", "zstandard", "xxhash"),
    "wandb": pinned("wandb"),
    "tensorboard": pinned("tensorboard"),
    "plot": pinned("matplotlib"),
    "test": pinned("pytest", "pytest-timeout", "matplotlib", "openai"),
    # GPU engines: not installable on the CPU machine the pins were tested on, so ranges only
    "sglang": ["sglang>=0.5", "sglang-router"],
    "vllm": ["vllm"],
}
# everything a CPU machine runs (train.py end to end, logging, the tests); GPU engines stay separate extras
EXTRAS["all"] = sorted({r for k in ("megatron", "fsdp", "ray", "rollout", "wandb", "tensorboard", "plot", "test")
                        for r in EXTRAS[k]})

setup(
    name="slime_like",
    version=VERSION,
    description=__doc__,
    python_requires=">=3.11",
    packages=find_packages(include=["slime_like", "slime_like.*"]),
    # slime's import names (utils/slime_names.py): a plain directory put on sys.path, not a slime_like subpackage
    package_data={"slime_like": ["slime_compat/slime/*.py", "slime_compat/slime/**/*.py"]},
    # The light core: what `train.py --dry-run` needs (pyyaml; omegaconf for --config RLinf / ROLL files).
    install_requires=pinned("pyyaml", "omegaconf"),
    extras_require=EXTRAS,
    # `slime-like train | train-async | dry-run | convert | demo | plot` (also `python -m slime_like ...`)
    entry_points={"console_scripts": ["slime-like = slime_like.cli:main"]},
)
