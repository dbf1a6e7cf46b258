"""Convert a Hugging Face checkpoint into a Megatron `torch_dist` checkpoint (iteration 0).

The tool is slime_like/tools/convert_hf_to_megatron.py (also `slime-like convert ...`); this wrapper runs it from a
checkout without installing the package."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout, uninstalled

from slime_like.tools.convert_hf_to_megatron import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
