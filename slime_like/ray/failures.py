"""A failure inside a Ray actor, told once and short: which actor, the root cause, where the full traceback is.

Ray wraps an actor's exception in RayTaskError (nested once per hop: trainer -> driver, or rollout manager ->
driver) with every traceback in its text, and an actor that dies in its constructor surfaces as
ActorDiedError. The driver writes the whole text to RUN_DIR/error.log and prints only the root cause.

An actor whose process vanished (SIGKILL from the kernel's OOM killer, a crash) raises ActorDiedError with no
Python error of its own: the block names the actor (its Ray name, e.g. "actor trainer rank 0", set by
ray/trainer_group.py), its pid and node, the driver call that was waiting on it, and what ends a process that
way. Ray's own "(raylet) A worker died or was killed ..." line about the same death goes to error.log instead of
the console (ray/cluster.py), so the console has one block.
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


_DIED_FIELDS = re.compile(r"^\s*(class_name|name|pid|ip): (.+)$", re.M)
_VANISHED = ("the process ended without a Python error: it was killed (SIGKILL; the kernel's OOM killer ends a "
             "process this way when the node runs out of memory) or it crashed (e.g. SIGSEGV); `dmesg | grep -i "
             "oom` on {node} tells which")


def _driver_call(exc: BaseException) -> str | None:
    """The innermost call of our driver code the exception passed through ('TrainerGroup.train_step')."""
    tb, found = exc.__traceback__, None
    while tb is not None:
        code = tb.tb_frame.f_code
        if f"{os.sep}slime_like{os.sep}" in code.co_filename and not code.co_filename.endswith("failures.py"):
            found = getattr(code, "co_qualname", code.co_name)
        tb = tb.tb_next
    return found


def _vanished_actor(exc: BaseException, prog: str) -> str | None:
    """The block for an actor whose process died under it (no Python error inside); None for other errors."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    fields = dict(_DIED_FIELDS.findall(text))
    memory_monitor = type(exc).__name__ == "OutOfMemoryError"  # Ray's own memory monitor killed a task
    if getattr(exc, "actor_init_failed", False) or not (memory_monitor or "class_name" in fields):
        return None
    if memory_monitor:
        pid = re.search(r"pid=(\d+)", text)
        fields.setdefault("pid", pid.group(1) if pid else "")
    who = fields.get("name") or fields.get("class_name") or "a Ray worker"
    where = ", ".join(x for x in (fields.get("class_name") if "name" in fields else None,
                                   fields.get("pid") and f"pid {fields['pid']}",
                                   fields.get("ip") and f"node {fields['ip']}") if x)
    call = _driver_call(exc)
    why = (_MEMORY_MONITOR if memory_monitor else _VANISHED.format(node=fields.get("ip", "its node")))
    return f"{prog}: error: {who}{f' ({where})' if where else ''} died{f' during {call}' if call else ''}\n    {why}"


_MEMORY_MONITOR = ("Ray's memory monitor killed it because the node's memory ran low (lower --micro-batch-size or "
                   "the batch, or give the run more memory)")


def report_actor_failure(exc: BaseException, run_dir: str, prog: str) -> str:
    """Write the full text to RUN_DIR/error.log; return the short block for the console."""
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, "error.log")
    with open(path, "a") as f:
        f.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)) + "\n")
    vanished = _vanished_actor(exc, prog)
    if vanished:
        return f"{vanished}\n  details: {path}"
    root = _root_cause(exc)
    message = _root_message(exc, root).replace("\n", "\n    ")
    return (f"{prog}: error in {_actor_name(exc)}:\n    {message}\n"
            f"  full traceback: {path}")


_WORKER_DIED = "A worker died or was killed while executing a task"
_diverted_to = {"run_dir": None}  # the current run's: one driver process may run several (tests, notebooks)


def divert_worker_death_notices(run_dir: str) -> None:
    """Ray's driver prints "(raylet) A worker died or was killed ..." for every dead worker, beside (and before)
    the error the driver then reports; write those to RUN_DIR/error.log instead. Other raylet messages print."""
    import ray._private.worker as ray_worker

    _diverted_to["run_dir"] = run_dir
    printer = ray_worker.print_to_stdstream
    if getattr(printer, "diverts_worker_deaths", False):
        return

    def print_or_divert(data, ignore_prefix):
        lines = data.get("lines") or []
        if data.get("pid") == "raylet" and any(_WORKER_DIED in str(line) for line in lines):
            run_dir = _diverted_to["run_dir"]
            os.makedirs(run_dir, exist_ok=True)
            with open(os.path.join(run_dir, "error.log"), "a") as f:
                f.write("".join(f"(raylet) {line}\n" for line in lines))
            return
        printer(data, ignore_prefix)

    print_or_divert.diverts_worker_deaths = True
    ray_worker.print_to_stdstream = print_or_divert
