"""The two training loops, read top to bottom: train.py (synchronous, slime's order) and train_async.py (one-step-off
and fully async). The root train.py / train_async.py and `slime-like train` are thin wrappers around them."""
