"""slime_like: RL post-training of LLMs with megatron-core trainers and SGLang (or CPU) rollout engines.

The version is recorded in every run directory's config.yaml (`slime_like_version`); CHANGELOG.md says what each
one changed. setup.py reads it from this line, without importing the package."""
__version__ = "0.3.0.dev0"
