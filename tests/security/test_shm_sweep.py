"""Issue 19, finding 12: a shared-memory weight buffer left by a SIGKILLed run is swept at the next start;
segments of live processes stay. Real segments in /dev/shm, created by real processes."""
import os
import subprocess
import sys

from slime_like.utils.shm import sweep_orphaned_segments

MAKE_SEGMENT = ("import os, sys, torch, torch.multiprocessing as m; m.set_sharing_strategy('file_system'); "
                "s = torch.UntypedStorage._new_shared(4096); print(s._share_filename_cpu_()[1].decode(), flush=True); "
                "sys.stdin.read()")


def _segment(mode):
    p = subprocess.Popen([sys.executable, "-c", MAKE_SEGMENT, mode], stdout=subprocess.PIPE, stdin=subprocess.PIPE,
                         text=True)
    name = p.stdout.readline().strip()
    return p, "/dev/shm" + name if name.startswith("/") else "/dev/shm/" + name


def test_orphaned_segment_is_swept_and_a_live_one_kept():
    import signal
    import time

    import psutil

    dead, orphan = _segment("die")
    for child in psutil.Process(dead.pid).children(recursive=True):   # torch's shm manager, as Ray's kill does
        child.send_signal(signal.SIGKILL)
    os.kill(dead.pid, signal.SIGKILL)
    dead.wait()
    time.sleep(0.5)
    live, kept = _segment("live")
    try:
        assert os.path.exists(orphan), "a SIGKILLed creator leaves its segment behind"
        removed = sweep_orphaned_segments()
        assert orphan in removed and not os.path.exists(orphan)
        assert os.path.exists(kept) and kept not in removed
    finally:
        live.stdin.close()
        live.wait()
