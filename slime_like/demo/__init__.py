"""The CPU demo's task: 2-digit addition with an exact-match reward (arith.py), its SFT warm-up (sft.py) and
`python -m slime_like.demo.prepare OUT_DIR`, which builds the data, the tiny model and the warmed-up checkpoint.
"""
