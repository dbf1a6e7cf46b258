"""slime_like: RL post-training of LLMs with megatron-core trainers and SGLang (or CPU) rollout engines."""
from setuptools import find_packages, setup

setup(
    name="slime_like",
    version="0.1.0",
    description=__doc__,
    python_requires=">=3.11",
    packages=find_packages(include=["slime_like", "slime_like.*"]),
    # The light core: what `train.py --dry-run` needs. Heavy parts are extras (pinned in requirements.txt).
    install_requires=["pyyaml>=6", "omegaconf>=2.4,<2.5"],  # omegaconf: --config RLinf / ROLL files
    extras_require={
        "megatron": ["torch==2.13.0", "megatron-core>=0.16,<0.20", "transformers>=5,<6", "tokenizers", "safetensors"],
        "ray": ["ray[default]==2.60.0"],
        "rollout": ["aiohttp>=3.9", "math-verify[antlr4_13_2]>=0.9", "tqdm"],
        "sglang": ["sglang>=0.5", "sglang-router"],
        "vllm": ["vllm"],
        "wandb": ["wandb"],
        "tensorboard": ["tensorboard"],
        "test": ["pytest", "pytest-timeout", "matplotlib"],
    },
    scripts=[],
)
