"""Small helpers at the bottom of the package: metrics logging, the learning-curve plot, logging setup.

Nothing here imports the rest of slime_like, so every layer may use it.
"""
