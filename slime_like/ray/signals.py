"""Turn SIGTERM (Slurm's scancel, `kill`, a container stop) into an exception, so the driver's `finally:`
blocks stop the engines and actors exactly as on Ctrl-C and no process is orphaned; the driver then exits
with 143 (128 + SIGTERM), the status a process killed by SIGTERM reports (docs/guide.md).

`ray.init` installs its own SIGTERM handler, so ours is installed again right after Ray starts
(ray/cluster.py) -- the last one installed wins."""
import signal


class Terminated(KeyboardInterrupt):
    """Raised in the main thread by SIGTERM; `exit_code` is what the driver exits with after cleaning up."""

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.exit_code = 128 + signum


def exit_cleanly_on_sigterm():
    def _raise(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM kills at once
        raise Terminated(signum)

    signal.signal(signal.SIGTERM, _raise)
