"""Engine faults injected from inside a rollout, for the fault-tolerance loop tests.

Used as --custom-generate-function-path engine_faults.<name> (the rollout actor imports this folder through
PYTHONPATH, as toy_task). Each wraps the default generate; on the FAULT_AT_CALL-th sample of the run (the 17th
sample of rollout 1 with the tests' 8 x 8 rollouts: the rollout's earlier requests are in flight on both
engines) it signals the engine server listening on one of the pool's URLs (and writes that URL to
RUN_DIR/engine_faults.txt), then generates as usual.
"""
import os
import signal
import sys
import time

import psutil

from slime_like.rollout.engines import current_state
from slime_like.rollout.generate import generate_sample

FAULT_AT_CALL = 64 + 16
_calls = [0]


def _server_pid(url: str) -> int:
    port = int(url.rsplit(":", 1)[1])
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return conn.pid
    raise RuntimeError(f"no process of ours listens on {url}")


async def _generate_with_fault(args, sample, sampling_params, engine: int, sig: int, actor_kill_at: int = 0):
    _calls[0] += 1
    if _calls[0] == FAULT_AT_CALL:
        url = current_state().pool.urls[engine]
        pid = _server_pid(url)
        print(f"engine_faults: signal {sig} to rollout engine {url} (pid {pid})", flush=True)
        os.kill(pid, sig)
        with open(os.path.join(args.run_dir, "engine_faults.txt"), "a") as f:   # which URL failed, for the test
            f.write(url + "\n")
    if _calls[0] == actor_kill_at:   # the engine's Ray actor and its server die together (e.g. a lost node)
        server = psutil.Process(_server_pid(current_state().pool.urls[0]))
        actor = server.parent()
        print(f"engine_faults: kill -9 of the engine actor pid {actor.pid} and its server {server.pid}", flush=True)
        actor.kill()
        server.kill()
    return await generate_sample(args, sample, sampling_params)


async def kill_engine0(args, sample, sampling_params):
    """kill -9 of the first engine mid-rollout."""
    return await _generate_with_fault(args, sample, sampling_params, 0, signal.SIGKILL)


async def stop_engine1(args, sample, sampling_params):
    """SIGSTOP of the second engine mid-rollout: its port still accepts connections, nothing answers. Then, at
    the 17th sample of rollout 3, kill -9 of the first engine's Ray actor and its server."""
    return await _generate_with_fault(args, sample, sampling_params, 1, signal.SIGSTOP, actor_kill_at=3 * 64 + 16)



def kill_an_engine_while_training(args, rollout_id, step_id, model, optimizer, opt_param_scheduler):
    """(--custom-megatron-before-train-step-hook-path, in the trainer) kill -9 of one engine server as rollout 2's
    training starts: no rollout runs, so only the health check before the weight push can find it."""
    if rollout_id != 2 or step_id != 0:
        return
    raylet = psutil.Process(os.getppid())   # the trainer and the engine actors are workers of this run's raylet
    engines = [p for p in raylet.children(recursive=True) if "slime_like.backends.cpu_engine" in " ".join(p.cmdline())]
    victim = min(engines, key=lambda p: p.pid)
    print(f"engine_faults: kill -9 of engine server pid {victim.pid} while training rollout {rollout_id}", flush=True)
    victim.kill()


def record_router_workers(rollout_id, args, samples, metrics, rollout_time):
    """(--custom-rollout-log-function-path, in the rollout manager) after each rollout, the router's workers
    {URL: healthy} as one line of RUN_DIR/router_workers.jsonl, taken while the run's engines are up."""
    import json

    from slime_like.backends.sglang.router import list_workers

    workers = list_workers(f"http://{args.sglang_router_ip}:{args.sglang_router_port}", args.engine_api_key)
    with open(os.path.join(args.run_dir, "router_workers.jsonl"), "a") as f:
        f.write(json.dumps({"rollout_id": rollout_id, "workers": {u: ok for u, (_, ok) in workers.items()}}) + "\n")
    return False   # the run logs its metrics as usual


def kill_an_engine_during_the_push(args, rollout_id, step_id, model, optimizer, opt_param_scheduler):
    """(--custom-megatron-before-train-step-hook-path, in trainer rank 0, the weight sender) as rollout 1's training
    starts, an audit hook that kills -9 the first engine server the moment this process connects to it for the
    third time: the third weight-update request of the push after this training step (the sender opens a connection
    per request), so the engine has loaded part of the new weights and the push to the other goes on."""
    _fault_during_push(rollout_id, step_id, stop=False)


def stop_an_engine_during_the_push(args, rollout_id, step_id, model, optimizer, opt_param_scheduler):
    """As kill_an_engine_during_the_push, but SIGSTOP: the engine accepts the connection and never answers."""
    _fault_during_push(rollout_id, step_id, stop=True)


def _fault_during_push(rollout_id, step_id, stop: bool):
    if rollout_id != 1 or step_id != 0:
        return
    raylet = psutil.Process(os.getppid())
    engines = [p for p in raylet.children(recursive=True) if "slime_like.backends.cpu_engine" in " ".join(p.cmdline())]
    victim = min(engines, key=lambda p: p.pid)
    argv = victim.cmdline()
    port, connects = int(argv[argv.index("--port") + 1]), [0]

    def on_connect(event, event_args):
        if event != "socket.connect" or connects[0] >= 3:
            return
        address = event_args[1]
        if isinstance(address, tuple) and len(address) >= 2 and address[1] == port:
            connects[0] += 1
            if connects[0] == 3:
                print(f"engine_faults: {'SIGSTOP' if stop else 'kill -9'} of engine server pid {victim.pid} (port "
                      f"{port}) during the weight push", flush=True)
                if stop:
                    victim.suspend()
                    return
                victim.kill()
                for _ in range(500):   # gone (a zombie holds no socket): this connection is refused
                    if not victim.is_running() or victim.status() == psutil.STATUS_ZOMBIE:
                        break
                    time.sleep(0.01)

    sys.addaudithook(on_connect)
