"""SIGTERM (Slurm's scancel, `kill`, a container stop) and SIGINT (Ctrl-C) stop a run the same clean way in every
phase (start-up, rollout, train, weight push, save): the signal becomes an exception in the driver's main thread,
the `finally:` blocks on the way out stop the engines and actors, no process is orphaned, and the driver prints
one line and exits 128 + the signal number -- 143 for SIGTERM, 130 for SIGINT, what a shell reports for a process
the signal killed (docs/guide.md).

Two things stand in the way, both handled here:
- while the driver waits in `ray.get` / `ray.wait`, Ray runs the Python handler from its C++ wait loop and then
  raises a plain `KeyboardInterrupt` of its own in place of our exception; so the handler records the signal and
  `stopped_by` recognises Ray's KeyboardInterrupt as that signal;
- `ray.init` installs its own SIGTERM handlers (in Python `sys.exit(15)`; in its C++ core worker a failure handler
  that aborts): `ray_init_keeps_our_handlers` keeps Ray's Python one out and puts ours back after Ray started.
A second signal of the same kind kills at once (the default action), for a clean-up that hangs.
"""
from __future__ import annotations

import contextlib
import signal

HANDLED = (signal.SIGTERM, signal.SIGINT)
_received: list = []   # the signals received since `handle_signals` was entered, in order


class Terminated(KeyboardInterrupt):
    """Raised in the main thread by SIGTERM / SIGINT; `exit_code` is what the driver exits with after cleaning up."""

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum
        self.exit_code = 128 + signum
        self.name = signal.Signals(signum).name


def _raise(signum, frame):
    _received.append(signum)
    signal.signal(signum, signal.SIG_DFL)  # a second one of the same kind kills at once
    raise Terminated(signum)


@contextlib.contextmanager
def handle_signals():
    """While the block runs, SIGTERM and SIGINT raise Terminated; the previous handlers come back afterwards (the
    tests run train.main in-process, under pytest's own SIGINT handling)."""
    previous = {s: signal.getsignal(s) for s in HANDLED}
    _received.clear()
    for s in HANDLED:
        signal.signal(s, _raise)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def stopped_by(exc: BaseException) -> Terminated | None:
    """The signal that stopped the run, given the exception that reached the driver's top: our Terminated, or the
    KeyboardInterrupt Ray raised in its place after our handler ran. None for anything else."""
    if isinstance(exc, Terminated):
        return exc
    if isinstance(exc, KeyboardInterrupt) and _received:
        return Terminated(_received[0])
    return None


@contextlib.contextmanager
def ray_init_keeps_our_handlers():
    """Around ray.init: Ray's calls to install its Python SIGTERM handler do nothing (it looks the function up on
    `ray._private.utils` at each call), and afterwards ours are installed again at the C level, where Ray's core
    worker put its failure handler (which prints "*** SIGTERM received" and aborts: exit 134)."""
    from ray._private import utils

    ours = signal.getsignal(signal.SIGTERM) is _raise  # only inside handle_signals
    original = utils.set_sigterm_handler
    if ours:
        utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        utils.set_sigterm_handler = original
        if ours:
            for s in HANDLED:
                if s not in _received:  # one already received stays at the default: the next one kills
                    signal.signal(s, _raise)
