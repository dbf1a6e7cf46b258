"""Backend-neutral training pieces shared by every trainer backend: the batch layout and micro-batches
(data.py), the per-micro-batch losses (loss.py) and the RL trainer skeleton (base.py)."""
