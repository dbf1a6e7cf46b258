"""Turn SIGTERM (Slurm's scancel, `kill`, a container stop) into KeyboardInterrupt, so the driver's
`finally:` blocks stop the engines and actors exactly as on Ctrl-C and no process is orphaned."""
import signal


def exit_cleanly_on_sigterm():
    def _raise(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM kills at once
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _raise)
