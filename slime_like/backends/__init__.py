"""Trainer backends (megatron/; the interface in trainer_api.py) and rollout engines (engine_api/, sglang/, cpu_engine/)."""
