"""Smoke check of a running Ray cluster: every GPU slot of every node takes an actor.

    RAY_ADDRESS=HEAD:PORT python scripts/ray/cluster_check.py --nodes 2 --gpus-per-node 4 [--out check.json]

One placement group bundle ({"GPU": 1}) per GPU slot, one zero-CPU actor per bundle; each actor reports its
node and the CUDA_VISIBLE_DEVICES Ray gave it. Passes (exit 0) when the cluster has exactly the expected
nodes, each offering --gpus-per-node slots, and every slot got an actor with a distinct (node, GPU) pair.
Exit 1 names the mismatch. --out writes the report as JSON (what the multi-node test reads).
"""
import argparse
import json
import os
import sys
import time
from collections import Counter


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--gpus-per-node", type=int, required=True)
    p.add_argument("--out", help="write the report here as JSON")
    p.add_argument("--timeout", type=float, default=120, help="seconds for the placement group and actors")
    return p.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    os.environ["RAY_AUTH_MODE"] = "token"  # the scripts' clusters always authenticate (scripts/ray/_common.sh)
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    t0 = time.time()
    ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), logging_level="ERROR")
    nodes = [n for n in ray.nodes() if n["Alive"]]
    per_node = {n["NodeID"]: n["Resources"].get("GPU", 0) for n in nodes}
    errors = []
    if len(nodes) != args.nodes:
        errors.append(f"expected {args.nodes} alive node(s), found {len(nodes)}")
    bad = {k[:8]: v for k, v in per_node.items() if v != args.gpus_per_node}
    if bad:
        errors.append(f"expected {args.gpus_per_node} GPU slot(s) per node, found {bad}")

    @ray.remote(num_cpus=0)
    class Probe:
        def where(self):
            return ray.get_runtime_context().get_node_id(), os.environ.get("CUDA_VISIBLE_DEVICES", "")

    total = int(sum(per_node.values()))
    placements = []
    if total:
        pg = placement_group([{"GPU": 1}] * total, strategy="PACK")
        ray.get(pg.ready(), timeout=args.timeout)
        actors = [Probe.options(num_gpus=1, scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i)).remote()
                  for i in range(total)]
        placements = ray.get([a.where.remote() for a in actors], timeout=args.timeout)
        for a in actors:
            ray.kill(a)
        remove_placement_group(pg)
        dup = [k for k, c in Counter(placements).items() if c > 1]
        if dup:
            errors.append(f"GPU slots handed out twice: {dup}")
        used_nodes = {node for node, _ in placements}
        if len(used_nodes) != len(nodes):
            errors.append(f"actors landed on {len(used_nodes)} of {len(nodes)} node(s)")
    else:
        errors.append("the cluster offers no GPU slots (start the nodes with --num-gpus / RAY_NUM_GPUS)")

    report = {"nodes": len(nodes), "gpus": total, "gpus_per_node": {k[:8]: v for k, v in per_node.items()},
              "placements": [[node[:8], cvd] for node, cvd in placements], "errors": errors,
              "seconds": round(time.time() - t0, 2)}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    print(f"cluster check: {len(nodes)} node(s), {total} GPU slot(s), {len(placements)} actor(s) placed "
          f"in {report['seconds']} s" + ("" if not errors else "; FAILED: " + "; ".join(errors)), flush=True)
    ray.shutdown()
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
