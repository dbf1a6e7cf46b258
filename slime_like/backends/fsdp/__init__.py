"""FSDP2 training backend (`--train-backend fsdp`): any Hugging Face causal LM straight from --hf-checkpoint
through transformers, sharded with torch's `fully_shard`, DCP checkpoints, LoRA through peft.

Submodules are imported explicitly so importing the package pulls neither transformers nor peft.
"""
