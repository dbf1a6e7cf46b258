"""User functions written against slime's import names, as slime's examples write them (imported by the rollout
through --custom-generate-function-path / --custom-rm-path; slime_like.utils.slime_names puts the names within
reach)."""
from slime.rollout.filter_hub.base_types import DynamicFilterOutput
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.http_utils import post
from slime.utils.types import Sample


async def generate_two_turns(args, sample: Sample, sampling_params) -> Sample:
    """slime's multi-turn pattern: GenerateState(args), post() to the router address in args, a tool turn appended
    with loss mask 0 by append_response_tokens."""
    state = GenerateState(args)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    sample.tokens = state.tokenizer(sample.prompt, add_special_tokens=False)["input_ids"]
    sample.loss_mask, sample.rollout_log_probs = [], []
    params = dict(sampling_params, max_new_tokens=4)
    for turn in range(2):
        output = await post(url, {"input_ids": sample.tokens, "sampling_params": params, "return_logprob": True})
        pairs = output["meta_info"]["output_token_logprobs"]
        sample.append_response_tokens(args, tokens=[t for _, t, *_ in pairs], log_probs=[lp for lp, *_ in pairs],
                                      meta_info=output["meta_info"], text=output["text"])
        if turn == 0:
            tool = state.tokenizer(" tool says 7.", add_special_tokens=False)["input_ids"]
            sample.append_response_tokens(args, tokens=tool, trainable=False, text=" tool says 7.")
    sample.metadata["turns"] = 2
    if sample.status not in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED, Sample.Status.ABORTED):
        sample.status = Sample.Status.COMPLETED
    return sample


async def generate_from_text(args, sample: Sample, sampling_params) -> Sample:
    """search-r1 / tau-bench style: a text payload (the engine pool tokenizes it as SGLang does)."""
    state = GenerateState(args)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    output = await post(url, {"text": sample.prompt, "sampling_params": dict(sampling_params, max_new_tokens=3),
                              "return_logprob": True})
    sample.tokens = state.tokenizer(sample.prompt, add_special_tokens=True)["input_ids"]
    pairs = output["meta_info"]["output_token_logprobs"]
    sample.append_response_tokens(args, tokens=[t for _, t, *_ in pairs], log_probs=[lp for lp, *_ in pairs],
                                  meta_info=output["meta_info"], text=output["text"])
    return sample


def reward_length(args, sample):
    return float(sample.response_length)


async def batched_length_reward(args, samples):
    return [float(s.response_length) for s in samples]


def keep_all(args, samples, **kwargs):
    return DynamicFilterOutput(keep=True, reason=None)
