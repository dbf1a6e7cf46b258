"""Print the MODEL_ARGS of a scripts/models/*.sh file from a Hugging Face config.json.

    python -m slime_like.tools.model_args /models/Qwen2.5-7B            # dir or config.json
    python -m slime_like.tools.model_args /models/Qwen2.5-7B > scripts/models/qwen2.5-7B.sh

Only architecture flags are written (layers, sizes, heads, norms, RoPE, vocabulary, embeddings tying, MoE
routing shape). Training choices -- parallelism, recomputation, MoE kernels, aux-loss weight -- belong in
the recipe. Covers Qwen2/2.5, Qwen3, Qwen3-MoE, Llama 3.x and GLM-4 configs.
"""
from __future__ import annotations

import argparse
import os
import sys

from slime_like.config.errors import ConfigError
from slime_like.config.hf_config import model_flags_from_hf, read_hf_config


def render(tokens: list, title: str) -> str:
    """Bash text: one flag per line, values on the flag's line (slime's style)."""
    lines, i = [], 0
    while i < len(tokens):
        flag = tokens[i]
        values = []
        while i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            values.append(tokens[i + 1])
            i += 1
        quoted = [f'"{v}"' if any(c in v for c in "[]*()' ") else v for v in values]
        lines.append("   " + " ".join([flag] + quoted))
        i += 1
    return f"# {title}\nMODEL_ARGS=(\n" + "\n".join(lines) + "\n)\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("path", help="HF checkpoint directory or its config.json")
    p.add_argument("--title", default=None, help="comment line at the top (default: the source path)")
    a = p.parse_args(argv)
    try:
        if not os.path.exists(a.path):
            raise ConfigError(f"{a.path}: no such file or directory")
        cfg = read_hf_config(a.path)
        tokens = model_flags_from_hf(cfg)
    except ConfigError as e:
        print(f"model_args: error: {e}", file=sys.stderr)
        return 2
    except KeyError as e:
        print(f"model_args: error: {a.path}: config.json has no {e.args[0]!r}; not a decoder-only LM config "
              "this tool knows (Qwen2/3, Qwen3-MoE, Llama, GLM-4)", file=sys.stderr)
        return 2
    title = a.title or f"MODEL_ARGS generated from {a.path} by python -m slime_like.tools.model_args"
    sys.stdout.write(render(tokens, title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
