"""Issue 31 item 8: every run left its private Ray's temp dir behind (/tmp/slr_ray_*, sockets and session logs).
The driver removes it at exit, a normal one and SIGTERM's alike (our handler raises Terminated, which the entry
point turns into exit 143; this bare driver, under the same handle_signals, lets it end the process); a real Ray
started by init_ray."""
import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

DRIVER = """
import os, signal, sys
from slime_like.args import make_args
from slime_like.ray.cluster import init_ray
from slime_like.ray.signals import handle_signals
with handle_signals():  # as the entry point runs a run (without it Ray's core worker handles SIGTERM: abort)
    said = init_ray(make_args(num_gpus_per_node=1))
    print(said, os.path.isdir(said.split("temp dir ")[1].rstrip(")")), flush=True)
    if sys.argv[1] == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()
"""


@pytest.mark.parametrize("how", ["return", "sigterm"])
def test_the_private_ray_temp_dir_is_removed_at_exit(how):
    out = subprocess.run([sys.executable, "-c", DRIVER, how], capture_output=True, text=True, timeout=300)
    found = re.search(r"temp dir (\S+)\) True", out.stdout)
    assert found, out.stdout + out.stderr
    assert (out.returncode == 0) if how == "return" else ("Terminated: signal 15" in out.stderr), out.stderr[-2000:]
    assert not os.path.exists(found.group(1))
