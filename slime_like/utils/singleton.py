"""slime's SingletonMeta (slime.utils.misc): a class built once per process; later calls return that instance."""
from __future__ import annotations

import threading


class SingletonMeta(type):
    _instances: dict = {}
    _lock = threading.Lock()

    def __call__(cls, *args, **kwargs):
        with SingletonMeta._lock:
            if cls not in SingletonMeta._instances:
                SingletonMeta._instances[cls] = super().__call__(*args, **kwargs)
        return SingletonMeta._instances[cls]

    def clear_instances(cls):
        SingletonMeta._instances.pop(cls, None)
