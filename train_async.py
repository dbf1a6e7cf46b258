"""Asynchronous RL, one-step-off or fully async (the loops are slime_like/loops/train_async.py).

Usage: python train_async.py [the same flags as train.py]
"""
import sys

from slime_like.loops.train_async import main

if __name__ == "__main__":
    sys.exit(main())
