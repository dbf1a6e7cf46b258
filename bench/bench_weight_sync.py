"""Weight sync trainer -> engine against the memory-copy floor, on the real CPU engine.

    python bench/bench_weight_sync.py [--sizes tiny,100m] [--repeat 5] [--engines cpu,vllm]

For each model: start the embedded CPU engine (`launcher.start_engine(args, kind="cpu")`), load the same
checkpoint's state dict in this process (a plain HF state dict stands in for the trainer's exported weights),
and time, median of --repeat:

* floor: the same bytes copied once in memory, the physical floor of moving them on one machine -- the faster of
  `t.clone()` of every tensor (fresh memory, page faults included) and `dst.copy_(t)` into tensors allocated
  once (a warm memcpy; usually the faster one for big models);
* colocated: `TensorWeightSender.send` (/update_weights_from_tensor: one shared-memory segment per sync, shared
  by its buckets; the engine copies out of it) inside `paused()` (pause + continue; the update requests carry
  flush_cache), the send alone, and with keep_buffer=True (one segment kept for every sync);
* disaggregated: `DistributedWeightSender.send` over a gloo group (/update_weights_from_distributed + one
  broadcast per tensor, received straight into the engine's parameters), and with
  load_format='flattened_bucket' (one broadcast per bucket); `connect()` (group set-up, once per run) is timed
  separately;
* in-loop (--in-loop sizes, default 100m): what train.py's `time/update_weights` measures when colocated --
  `TensorWeightSender.send(MegatronTrainer.iter_hf_weights())` from a real megatron-core trainer built on the
  same checkpoint in this process (its construction is not timed); and the same with keep_buffer=True.

The state dict's tensors are plain memory, as the trainer's parameters are: a sender that moved them into shared
memory once would look fast here and not in the loop, where iter_hf_weights yields them afresh each sync.

Ratios are sync / floor from the same run. Each path is checked: sending a doubled q_proj must change the engine's greedy
log-probs and sending the originals back must restore them (a sync that did nothing would be fast). Writes bench/results/bench_weight_sync.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402


def load_state(model_dir: str) -> dict:
    from safetensors.torch import load_file

    sd = {}
    for f in sorted(os.listdir(model_dir)):
        if f.endswith(".safetensors"):
            sd.update(load_file(os.path.join(model_dir, f)))
    return {k: v.float().contiguous() for k, v in sd.items()}


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fingerprint(url: str):
    """Greedy log-probs of 3 tokens after a fixed prompt: they change iff the engine's weights changed."""
    from slime_like.backends.engine_api.client import post

    out = post(url, "/generate", {"input_ids": [3, 4, 12, 5, 6, 13], "return_logprob": True,
                                  "sampling_params": {"max_new_tokens": 3, "temperature": 0.0, "ignore_eos": True}})
    return [round(float(x[0]), 5) for x in out["meta_info"]["output_token_logprobs"]]


def build_trainer(model_dir: str):
    """A megatron-core actor on `model_dir` in this process (world size 1), as the Ray trainer actor builds it."""
    from slime_like.args import parse_args
    from slime_like.backends.megatron.trainer import MegatronTrainer

    args = parse_args(["--hf-checkpoint", model_dir, "--rollout-batch-size", "4", "--n-samples-per-prompt", "2",
                       "--num-rollout", "1", "--colocate", "--actor-num-gpus-per-node", "1",
                       "--global-batch-size", "8", "--micro-batch-size", "8", "--lr", "1e-6"], exit_on_error=False)
    return MegatronTrainer(args, role="actor", master_port=free_port())


def bench_one(model_dir: str, repeat: int, bucket_bytes: int, in_loop: bool = False, kind: str = "cpu") -> dict:
    from slime_like.backends.engine_api.launcher import start_engine
    from slime_like.backends.engine_api.weight_sync import DistributedWeightSender, TensorWeightSender, paused

    sd = load_state(model_dir)
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    args = SimpleNamespace(hf_checkpoint=model_dir, sglang_server_args={}, seed=0, save=tempfile.mkdtemp(),
                           offload_rollout=False, rollout_num_gpus_per_engine=1,
                           vllm_server_args={"max_model_len": 256}, vllm_cli_options={})
    eng = start_engine(args, kind=kind, port=free_port(), env={"OMP_NUM_THREADS": "1"})
    res = {"engine": kind, "model_dir": model_dir, "tensors": len(sd), "bytes": nbytes,
           "loadavg_start": os.getloadavg()}
    try:
        urls = [eng.url]
        probe = next(k for k in sd if k.endswith("q_proj.weight"))
        items = lambda scale: [(k, v * scale if k == probe else v) for k, v in sd.items()]  # noqa: E731

        res["floor_clone_s"] = timed(lambda: [t.clone() for t in sd.values()], repeat)
        dst = {k: torch.empty_like(v) for k, v in sd.items()}
        res["floor_copy_s"] = timed(lambda: [dst[k].copy_(v) for k, v in sd.items()], repeat)

        col = TensorWeightSender(urls)
        col.connect()
        base = fingerprint(eng.url)
        col.send(items(2.0), bucket_bytes)  # warm-up; the check: a doubled q_proj changes the log-probs ...
        changed = fingerprint(eng.url)
        col.send(items(1.0), bucket_bytes)  # ... and sending the originals back restores them
        res["colocated_check"] = changed != base and fingerprint(eng.url) == base

        def col_paused():
            with paused(urls):
                col.send(items(1.0), bucket_bytes)
        res["colocated_paused_s"] = timed(col_paused, repeat)
        res["colocated_send_s"] = timed(lambda: col.send(items(1.0), bucket_bytes), repeat)
        keep = TensorWeightSender(urls, keep_buffer=True)  # one segment for every sync (close() frees it)
        keep.send(items(2.0), bucket_bytes)
        changed = fingerprint(eng.url)
        keep.send(items(1.0), bucket_bytes)
        res["colocated_keep_check"] = changed != base and fingerprint(eng.url) == base
        res["colocated_keep_send_s"] = timed(lambda: keep.send(items(1.0), bucket_bytes), repeat)

        dist = DistributedWeightSender(urls, backend="gloo", master_address="127.0.0.1", timeout_s=120)
        t = time.perf_counter()
        dist.connect()
        res["disaggregated_connect_s"] = time.perf_counter() - t
        dist.send(items(3.0), bucket_bytes)
        changed = fingerprint(eng.url)
        dist.send(items(1.0), bucket_bytes)
        res["disaggregated_check"] = changed != base and fingerprint(eng.url) == base
        res["disaggregated_send_s"] = timed(lambda: dist.send(items(1.0), bucket_bytes), repeat)
        dist.load_format = "flattened_bucket"  # same group: one broadcast per bucket
        dist.send(items(3.0), bucket_bytes)
        changed = fingerprint(eng.url)
        dist.send(items(1.0), bucket_bytes)
        res["disaggregated_flat_check"] = changed != base and fingerprint(eng.url) == base
        res["disaggregated_flat_send_s"] = timed(lambda: dist.send(items(1.0), bucket_bytes), repeat)
        dist.close()

        if in_loop:
            trainer = build_trainer(model_dir)
            col.send(items(2.0), bucket_bytes)  # perturb; the trainer's weights (the checkpoint's) restore them
            col.send(trainer.iter_hf_weights(), bucket_bytes)
            res["in_loop_check"] = fingerprint(eng.url) == base
            res["in_loop_colocated_s"] = timed(lambda: col.send(trainer.iter_hf_weights(), bucket_bytes), repeat)
            res["in_loop_keep_s"] = timed(lambda: keep.send(trainer.iter_hf_weights(), bucket_bytes), repeat)
        keep.close()
    finally:
        eng.stop()
    for k in [k for k in res if k.endswith("_s") and isinstance(res[k], list)]:
        res[k + "_median"] = statistics.median(res[k])
    # The floor: the cheaper of clone (fresh memory: page faults on every big allocation) and copy_ into
    # tensors allocated once (a warm memcpy, what an engine that owns its parameters really has to do).
    floor = res["floor_s_median"] = min(res["floor_clone_s_median"], res["floor_copy_s_median"])
    for k in ("colocated_paused", "colocated_send", "colocated_keep_send", "disaggregated_send",
              "disaggregated_flat_send", "in_loop_colocated", "in_loop_keep"):
        if k + "_s_median" in res:
            res[k + "_over_floor"] = res[k + "_s_median"] / floor
    res["loadavg_end"] = os.getloadavg()
    return res


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="tiny,100m")
    p.add_argument("--engines", default="cpu", help="engines of ours to push into: cpu, vllm (needs bench/.venv-vllm)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--bucket-mb", type=int, default=512, help="--update-weight-buffer-size in MiB")
    p.add_argument("--in-loop", default="100m", help="sizes that also time the in-loop path (megatron trainer "
                   "-> colocated send); '' for none")
    p.add_argument("--work-dir", default=os.path.join(ROOT, "runs", "bench_e2e"),
                   help="where bench_e2e.py prepares the models (reused here)")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "bench_weight_sync.json"))
    a = p.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # the engines' tensor route needs a run secret (its payload names shared memory); engines, senders and
    # clients all read it from the environment, as in a run
    os.environ.setdefault("SLIME_LIKE_ENGINE_API_KEY", __import__("secrets").token_hex(16))
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from bench_e2e import SIZES, prepare

    sizes = [s.strip() for s in a.sizes.split(",") if s.strip()]
    bad = [s for s in sizes if s not in SIZES]
    if bad:
        sys.exit(f"--sizes: unknown {bad}; choose from {sorted(SIZES)}")
    paths = prepare(a.work_dir)
    result = {"nproc": os.cpu_count(), "torch_threads": torch.get_num_threads(), "repeat": a.repeat,
              "bucket_bytes": a.bucket_mb << 20, "sizes": {}}
    for kind in a.engines.split(","):
        for size in sizes:
            print(f"[bench_weight_sync] {kind} {size} ...", flush=True)
            key = size if kind == "cpu" else f"{size}/{kind}"
            result["sizes"][key] = bench_one(paths[size], a.repeat, a.bucket_mb << 20,
                                             in_loop=size in a.in_loop.split(","), kind=kind)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    cols = [("coloc+pause", "colocated_paused"), ("coloc send", "colocated_send"), ("coloc keep", "colocated_keep_send"),
            ("dist send", "disaggregated_send"), ("dist flat", "disaggregated_flat_send"),
            ("in-loop", "in_loop_colocated"), ("in-loop keep", "in_loop_keep")]
    print(f"\n{'size':6} {'MB':>7} {'floor':>8} " + " ".join(f"{c:>11} {'x':>4}" for c, _ in cols)
          + f" {'connect':>7}  checks")
    for size, r in result["sizes"].items():
        cells = []
        for _, k in cols:
            if k + "_s_median" in r:
                cells.append(f"{r[k + '_s_median']:10.4f}s {r[k + '_over_floor']:4.1f}")
            else:
                cells.append(f"{'-':>11} {'':>4}")
        checks = "/".join(str(r.get(k)) for k in ("colocated_check", "colocated_keep_check", "disaggregated_check",
                                                 "disaggregated_flat_check", "in_loop_check") if k in r)
        print(f"{size:6} {r['bytes'] / 1e6:7.1f} {r['floor_s_median']:7.4f}s " + " ".join(cells)
              + f" {r['disaggregated_connect_s']:6.2f}s  {checks}")
    print(f"(medians of {a.repeat}; goal: sync within 3x of the floor; wrote {a.out})")


if __name__ == "__main__":
    main()
