"""slime.utils.misc: load_function (slime_like's loader, slime's paths resolved first) and SingletonMeta."""
from slime_like.rollout.hooks import load_function as _load
from slime_like.utils.singleton import SingletonMeta


def load_function(path):
    """slime's load_function(path): the callable at 'module.attr' (clear errors naming the path)."""
    return _load(path, "load_function")


__all__ = ["SingletonMeta", "load_function"]
