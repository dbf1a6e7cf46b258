"""Convert a Megatron `torch_dist` checkpoint back to a Hugging Face directory.

The tool is slime_like/tools/convert_megatron_to_hf.py (also `slime-like convert ...`); this wrapper runs it from a
checkout without installing the package."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout, uninstalled

from slime_like.tools.convert_megatron_to_hf import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
