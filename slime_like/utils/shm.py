"""Shared-memory weight buffers a killed run left behind.

torch names a shared-memory segment /dev/shm/torch_<creator pid>_<...>. TrainerGroup.kill unlinks the
segments of the ranks it kills; a driver killed with SIGKILL never gets there, and the segments of its ranks
stay until reboot. The next run sweeps them before it starts: a segment of ours (same uid) whose creator is
gone is mapped by nobody who could still look it up by name (only the creator sends its name), so it is
garbage. Segments of live processes and of other users are never touched.
"""
from __future__ import annotations

import glob
import os
import re

_NAME = re.compile(r"torch_(\d+)_")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # another user's live process
        return True
    return True


def sweep_orphaned_segments(shm_dir: str = "/dev/shm") -> list[str]:
    """Unlink torch segments of this uid whose creating process is gone; returns the removed paths."""
    removed = []
    for path in glob.glob(os.path.join(shm_dir, "torch_*")):
        m = _NAME.match(os.path.basename(path))
        try:
            if not m or os.stat(path).st_uid != os.getuid() or _alive(int(m.group(1))):
                continue
            os.unlink(path)
            removed.append(path)
        except OSError:   # gone meanwhile, or not ours to remove
            continue
    return removed
