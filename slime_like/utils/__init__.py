"""Small helpers at the bottom of the package: metrics logging, timers, the learning-curve plot, logging setup.

Nothing here imports the rest of slime_like, so every layer may use it.
"""
