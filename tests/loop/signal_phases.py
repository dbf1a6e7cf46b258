"""Hooks that hold a run in one phase, for the signal tests (tests/loop/test_signals.py).

Each writes RUN_DIR/phase_<name> the moment the run is inside that phase and then waits there (the test sends the
signal to train.py once the file exists, so the signal lands in that phase every time):

- startup:  --custom-megatron-init-path, while the actor trainer is being built (the driver waits in Run.start);
- rollout:  --custom-rm-path, scoring the first sample of rollout 1 (the driver waits in ray.get(generate));
- train:    --custom-megatron-before-train-step-hook-path, before rollout 1's first optimizer step;
- push:     the same hook arms an audit hook that holds the trainer's first connection to an engine after rollout
            1's training (the weight push that follows it);
- save:     the same hook arms an audit hook that holds the trainer's first file opened under --save after it
            (rollout 1's checkpoint).

The rollout actor and the trainers import this module through PYTHONPATH (tests/loop/conftest.py)."""
import asyncio
import os
import sys
import time

HOLD_S = 300  # far longer than any test waits: the run only leaves the phase by the signal
_armed = [False]


def _reached(args, phase: str):
    with open(os.path.join(args.run_dir, f"phase_{phase}"), "w") as f:
        f.write(f"{os.getpid()}\n")
    print(f"signal_phases: holding the run in phase {phase}", flush=True)


def startup(args):
    _reached(args, "startup")
    time.sleep(HOLD_S)


_scored = [0]


async def rollout(args, sample) -> float:
    _scored[0] += 1
    if _scored[0] == args.rollout_batch_size * args.n_samples_per_prompt + 1:   # rollout 1's first sample
        _reached(args, "rollout")
        await asyncio.sleep(HOLD_S)
    return 0.5


def train(args, rollout_id, step_id, model, optimizer, opt_param_scheduler):
    if rollout_id == 1 and step_id == 0:
        _reached(args, "train")
        time.sleep(HOLD_S)


def push(args, rollout_id, step_id, model, optimizer, opt_param_scheduler):
    if rollout_id == 1 and step_id == 0:
        ports = _engine_ports()
        _arm(args, "push", lambda event, a: event == "socket.connect" and isinstance(a[1], tuple)
             and len(a[1]) >= 2 and a[1][1] in ports)


def save(args, rollout_id, step_id, model, optimizer, opt_param_scheduler):
    if rollout_id == 1 and step_id == 0:
        root = os.path.realpath(args.save)
        _arm(args, "save", lambda event, a: event == "open" and isinstance(a[0], str)
             and os.path.realpath(a[0]).startswith(root + os.sep) and a[1] not in (None, "r", "rb"))


def _engine_ports() -> set:
    import psutil

    raylet = psutil.Process(os.getppid())
    ports = set()
    for p in raylet.children(recursive=True):
        argv = p.cmdline()
        if "slime_like.backends.cpu_engine" in " ".join(argv) and "--port" in argv:
            ports.add(int(argv[argv.index("--port") + 1]))
    return ports


def _arm(args, phase, matches):
    if _armed[0]:
        return
    _armed[0] = True
    held = [False]

    def on_event(event, event_args):
        if held[0] or not matches(event, event_args):
            return
        held[0] = True
        _reached(args, phase)
        time.sleep(HOLD_S)

    sys.addaudithook(on_event)
