"""Loading a tokenizer by name or path (slime's load_tokenizer); remote code only when the caller asks for it."""
from __future__ import annotations


def load_tokenizer(name_or_path: str, **kwargs):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name_or_path, **kwargs)
