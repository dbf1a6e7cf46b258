"""--use-opd --opd-type sglang: a teacher engine scores the student's sampled tokens during the rollout (slime's
slime.rollout.on_policy_distillation, which config/slime_paths.py maps here).

    --custom-rm-path slime.rollout.on_policy_distillation.reward_func
    --custom-reward-post-process-path slime.rollout.on_policy_distillation.post_process_rewards
    --rm-url http://TEACHER:PORT/generate

`reward_func` sends the sample's tokens to the teacher's SGLang-API /generate with max_new_tokens 0,
return_logprob and logprob_start_len 0, and keeps the teacher's log-probs of the response tokens in
`sample.teacher_log_probs` (slime keeps the whole answer as the reward and extracts them in the post-process;
here the reward stays a number, 0.0, so every other reward consumer keeps working). `post_process_rewards` trains on
zero task reward (pure distillation, slime's recipe) and logs the raw rewards. The trainer then subtracts
--opd-kl-coef x (student - teacher log-prob) from the advantages (backends/training/opd.py).
"""
from __future__ import annotations

from slime_like.utils.auth import auth_headers


async def teacher_log_probs(args, tokens: list[int], response_length: int) -> list[float]:
    """The teacher's log-probs of the last `response_length` tokens, each given everything before it."""
    import aiohttp

    if not args.rm_url:
        raise ValueError("--opd-type sglang: the teacher-scoring reward needs --rm-url http://TEACHER:PORT/generate")
    payload = {"input_ids": list(tokens), "return_logprob": True, "logprob_start_len": 0,
               "sampling_params": {"temperature": args.rollout_temperature, "max_new_tokens": 0,
                                   "skip_special_tokens": False}}
    timeout = aiohttp.ClientTimeout(total=args.rm_timeout)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.post(args.rm_url, json=payload, headers=auth_headers()) as resp:
            if resp.status != 200:
                raise RuntimeError(f"--rm-url {args.rm_url} (the OPD teacher) answered HTTP {resp.status}: "
                                   f"{(await resp.text())[:300]}")
            body = await resp.json()
    scored = (body.get("meta_info") or {}).get("input_token_logprobs") or []
    if len(scored) != len(tokens):
        raise RuntimeError(f"--rm-url {args.rm_url} (the OPD teacher) returned {len(scored)} prompt log-probs for "
                           f"{len(tokens)} tokens: it must serve SGLang's logprob_start_len / input_token_logprobs")
    return [float(item[0]) for item in scored[len(tokens) - response_length:]]


async def reward_func(args, sample, **kwargs) -> float:
    """slime's teacher-scoring reward: sets sample.teacher_log_probs; the task reward is 0 (pure distillation)."""
    sample.teacher_log_probs = await teacher_log_probs(args, sample.tokens, sample.response_length)
    return 0.0


def post_process_rewards(args, samples, **kwargs) -> tuple[list[float], list[float]]:
    """slime's pair: (raw rewards for the logs, rewards trained on = 0); the teacher log-probs are already set."""
    missing = [s.index for s in samples if s.teacher_log_probs is None]
    if missing:
        raise ValueError(f"samples {missing[:5]} have no teacher_log_probs: use --custom-rm-path "
                         "slime.rollout.on_policy_distillation.reward_func with this post-process")
    return [float(s.reward or 0.0) for s in samples], [0.0] * len(samples)
