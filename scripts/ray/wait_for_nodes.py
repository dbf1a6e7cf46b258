"""Wait until a Ray cluster has N alive nodes and G GPU slots; exit 1 with what is missing on timeout.

    python scripts/ray/wait_for_nodes.py --address HEAD:PORT --nodes 2 --gpus 8 [--timeout 180]

Connects one driver (retrying while the head is still starting), then polls `ray.nodes()`. The error names
the nodes that did join (address, GPUs, CPUs) and what is missing, so a Slurm log says which node failed.
Exit codes: 0 ready, 1 timeout, 2 bad arguments.
"""
import argparse
import os
import socket
import sys
import threading
import time


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--address", default=os.environ.get("RAY_ADDRESS"),
                   help="GCS address HEAD:PORT (default: $RAY_ADDRESS)")
    p.add_argument("--nodes", type=int, required=True, help="alive nodes to wait for")
    p.add_argument("--gpus", type=float, default=0, help="GPU slots in total to wait for (0: do not check)")
    p.add_argument("--timeout", type=float, default=180, help="seconds before giving up")
    p.add_argument("--hint", default="", help="appended to the timeout error (e.g. where the node logs are)")
    args = p.parse_args(argv)
    if not args.address:
        p.error("no cluster address: pass --address HEAD:PORT or set RAY_ADDRESS")
    if not args.address.rpartition(":")[2].isdigit():
        p.error(f"--address {args.address}: expected HOST:PORT (e.g. 10.0.0.1:6379)")
    if args.nodes < 1:
        p.error(f"--nodes {args.nodes}: must be at least 1")
    if args.gpus < 0 or args.timeout <= 0:
        p.error(f"--gpus {args.gpus} must be >= 0 and --timeout {args.timeout} > 0")
    return args


def describe(nodes):
    """One short line per alive node: address, GPU and CPU slots."""
    return "; ".join(f"{n['NodeManagerAddress']} (GPU {n['Resources'].get('GPU', 0):g}, "
                     f"CPU {n['Resources'].get('CPU', 0):g})" for n in nodes) or "none"


def _give_up(args):
    print(f"error: {args.address} accepts connections but no Ray driver could connect within {args.timeout:g} s "
          f"(another service on that port, or a different Ray version on the head). {args.hint}",
          file=sys.stderr, flush=True)
    os._exit(1)


def main(argv=None):
    args = parse(argv)
    os.environ["RAY_AUTH_MODE"] = "token"  # the scripts' clusters always authenticate (scripts/ray/_common.sh)
    import ray

    deadline = time.monotonic() + args.timeout
    host, _, port = args.address.rpartition(":")
    # ray.init() on an address nobody listens on retries forever: first wait for the GCS port to accept.
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
            break
        except OSError as e:
            if time.monotonic() > deadline:
                print(f"error: nothing listens on the Ray head address {args.address} after {args.timeout:g} s "
                      f"({e.strerror or e}): the head did not start, or this host cannot reach it. {args.hint}",
                      file=sys.stderr)
                return 1
            time.sleep(1)
    # A port that accepts but is no GCS would hang ray.init(): a watchdog bounds it by the same deadline.
    watchdog = threading.Timer(max(deadline - time.monotonic(), 5), _give_up, (args,))
    watchdog.daemon = True
    watchdog.start()
    ray.init(address=args.address, logging_level="ERROR", log_to_driver=False)
    watchdog.cancel()

    t0, shown = time.monotonic(), 0.0
    while True:
        alive = [n for n in ray.nodes() if n["Alive"]]
        gpus = sum(n["Resources"].get("GPU", 0) for n in alive)
        if len(alive) >= args.nodes and gpus >= args.gpus:
            print(f"ray cluster ready: {len(alive)} node(s), {gpus:g} GPU slot(s): {describe(alive)}", flush=True)
            return 0
        if time.monotonic() > deadline:
            missing = []
            if len(alive) < args.nodes:
                missing.append(f"{args.nodes - len(alive)} node(s)")
            if gpus < args.gpus:
                missing.append(f"{args.gpus - gpus:g} GPU slot(s)")
            print(f"error: after {args.timeout:g} s the Ray cluster at {args.address} has {len(alive)} of "
                  f"{args.nodes} node(s) and {gpus:g} of {args.gpus:g} GPU slot(s); missing "
                  f"{' and '.join(missing)}. Joined: {describe(alive)}. A worker that cannot reach the head "
                  f"(firewall, wrong interface, a different Ray version) or a node started without --num-gpus "
                  f"shows up here. {args.hint}", file=sys.stderr)
            return 1
        if time.monotonic() - shown > 15:  # a progress line now and then, not every poll
            shown = time.monotonic()
            print(f"waiting for the Ray cluster: {len(alive)}/{args.nodes} node(s), {gpus:g}/{args.gpus:g} GPU "
                  f"slot(s) after {time.monotonic() - t0:.0f} s", flush=True)
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
