"""Megatron-core training backend: model build, HF <-> mcore weights, checkpoints, trainer.

Submodules are imported explicitly (`from slime_like.backends.megatron import model`) so importing the
package never pulls megatron-core or applies the CPU patches by itself.
"""
