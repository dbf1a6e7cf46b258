"""`python -m slime_like COMMAND ...`: the same as the `slime-like` command (slime_like/cli.py)."""
import sys

from slime_like.cli import main

sys.exit(main())
