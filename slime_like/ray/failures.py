"""A failure inside a Ray actor, told once and short: which actor, the root cause, where the full traceback is.

Ray wraps an actor's exception in RayTaskError (nested once per hop: trainer -> driver, or rollout manager ->
driver) with every traceback in its text, and an actor that dies in its constructor surfaces as
ActorDiedError. The driver writes the whole text to RUN_DIR/error.log and prints only the root cause.
"""
from __future__ import annotations

import os
import re
import traceback

MAX_MESSAGE_LINES = 6


class EngineLostDuringPush(RuntimeError):
    """A rollout engine stopped answering during a weight push (without --use-fault-tolerance, or past the push
    retries); the message names the engine and the flag, told in one line like a cluster error."""


def _root_cause(exc: BaseException) -> BaseException:
    """The innermost user-level exception under Ray's wrappers."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        cause = getattr(exc, "cause", None)
        if isinstance(cause, BaseException):
            exc = cause
            continue
        break
    return exc


_HEADER = re.compile(r"ray::([\w.]+)\(\)[^(]*\(pid=(\d+), ip=([^,)]+)")


def _actor_name(exc: BaseException) -> str:
    """'RolloutManager.generate (pid 123, node 127.0.0.1)' from Ray's header line of the error."""
    found = _HEADER.search(re.sub(r"\x1b\[[0-9;]*m", "", str(exc)))
    if found:
        return f"{found.group(1)} (pid {found.group(2)}, node {found.group(3)})"
    name = getattr(exc, "function_name", None)
    return name or type(exc).__name__.replace("Error", " error").strip()


def _root_message(exc: BaseException, root: BaseException) -> str:
    if root is not exc:
        text = f"{type(root).__name__}: {root}"
    else:  # ActorDiedError and friends: Ray's message holds the creation task's error; keep its last lines
        lines = [ln for ln in str(exc).splitlines() if ln.strip()]
        errors = [ln for ln in lines if "Error" in ln.split(":", 1)[0]]
        text = errors[-1].strip() if errors else (lines[-1].strip() if lines else type(exc).__name__)
    lines = text.splitlines()
    return "\n".join(lines[:MAX_MESSAGE_LINES]) + ("\n..." if len(lines) > MAX_MESSAGE_LINES else "")


def report_actor_failure(exc: BaseException, run_dir: str, prog: str) -> str:
    """Write the full text to RUN_DIR/error.log; return the short block for the console."""
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, "error.log")
    with open(path, "a") as f:
        f.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)) + "\n")
    root = _root_cause(exc)
    message = _root_message(exc, root).replace("\n", "\n    ")
    return (f"{prog}: error in {_actor_name(exc)}:\n    {message}\n"
            f"  full traceback: {path}")
