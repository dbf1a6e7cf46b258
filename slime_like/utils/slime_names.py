"""slime's import names (``from slime.utils.types import Sample``) for slime users' code, resolved to slime_like's
own objects.

``install()`` appends ``slime_like/slime_compat/`` -- a directory (not a slime_like subpackage) holding a
``slime`` package of thin modules that re-export slime_like's classes and functions under slime's module paths --
at the END of ``sys.path``, and only when no other ``slime`` is importable: a real slime (installed, or earlier on
the path) is always found first and is never shadowed. It runs wherever user code is loaded
(utils/user_functions.load_function; args.py before the preflight imports the run's functions).
docs/guide.md "Bringing slime code" lists the names provided and those refused, with the reason.
"""
from __future__ import annotations

import importlib.util
import os
import sys

SLIME_NAMES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "slime_compat")


def install() -> bool:
    """Make slime's names importable unless a real slime is; True when ours are the ones in use."""
    if SLIME_NAMES in sys.path:
        return True
    if "slime" in sys.modules or importlib.util.find_spec("slime") is not None:
        return False            # a real slime package: never shadow it
    sys.path.append(SLIME_NAMES)
    return True


def provided() -> bool:
    """The ``slime`` package in use is slime_like's (after install())."""
    spec = importlib.util.find_spec("slime")
    return spec is not None and bool(spec.origin) and spec.origin.startswith(SLIME_NAMES)
