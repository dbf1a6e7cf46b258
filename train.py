"""Synchronous RL post-training (the loop is slime_like/loops/train.py); slime's recipes run `python train.py ...`.

Usage: python train.py [Megatron / slime flags ...]   (python train.py --dry-run ... checks and plans only)
"""
import sys

from slime_like.loops.train import main

if __name__ == "__main__":
    sys.exit(main())
