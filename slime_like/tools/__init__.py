"""Helpers the command-line tools use: MODEL_ARGS from an HF config, tiny test models."""
