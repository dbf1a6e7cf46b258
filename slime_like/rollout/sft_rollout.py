"""slime's SFT rollout (``--rollout-function-path slime.rollout.sft_rollout.generate_rollout``, also reachable
as ``slime_like.rollout.sft_rollout.generate_rollout``): no generation, the data already holds the answers.

Each prompt record becomes one training sample (use ``--n-samples-per-prompt 1``):
  * a message list (``--input-key messages``, slime's format): the conversation rendered with the tokenizer's
    chat template; the loss covers the assistant turns (their content and end-of-turn tokens, not the
    ``assistant`` header), as slime's ``--loss-mask-type`` generators do. The mask is derived from the
    template itself by rendering growing prefixes of the conversation, so it is right for any template
    whose rendering of earlier turns does not change when a turn is added; a template that rewrites earlier
    turns (e.g. one that drops past reasoning) is refused with the message index. ``--loss-mask-type`` is
    validated but the template decides the mask.
  * a plain string prompt with ``--label-key`` (completion data, e.g. the demo's ``{"prompt", "label"}``):
    tokens = prompt + label + eos; the loss covers label and eos.
The response is everything from the first trained token on (slime's ``get_response_lengths``). Train with
``--loss-type sft_loss`` (``--disable-compute-advantages-and-returns`` skips the RL passes).
"""
from __future__ import annotations

from ..sample import Sample, Status

__all__ = ["generate_rollout", "conversation_tokens", "completion_tokens"]


def _render(tokenizer, messages, tools, generation_prompt: bool) -> list[int]:
    kwargs = {"tools": tools} if tools is not None else {}
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt, **kwargs)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _extend(tokens: list, mask: list, rendered: list, value: int, where: str):
    if rendered[:len(tokens)] != tokens:
        raise ValueError(f"{where}: the chat template renders the earlier turns differently once this one is "
                         "added, so per-turn loss masks cannot be derived from it")
    mask += [value] * (len(rendered) - len(tokens))
    return list(rendered)


def conversation_tokens(tokenizer, messages, tools=None, where: str = "conversation") -> tuple[list, list]:
    """(token ids, loss mask) of a whole conversation: 1 on assistant turns (without their header)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"{where}: message-list SFT data needs a tokenizer with a chat template (--hf-checkpoint); "
                         "use string prompts with --label-key for completion data")
    tokens, mask = [], []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m:
            raise ValueError(f"{where}: message {i} is not a {{'role', 'content'}} object: {m!r:.80}")
        if m["role"] == "assistant":
            tokens = _extend(tokens, mask, _render(tokenizer, messages[:i], tools, True), 0, f"{where} message {i}")
            trained = 1 if m.get("step_loss_mask", 1) == 1 else 0     # slime: step_loss_mask 0 leaves a turn out
            tokens = _extend(tokens, mask, _render(tokenizer, messages[:i + 1], tools, False), trained,
                             f"{where} message {i}")
        else:
            tokens = _extend(tokens, mask, _render(tokenizer, messages[:i + 1], tools, False), 0,
                             f"{where} message {i}")
    return tokens, mask


def completion_tokens(tokenizer, prompt: str, label: str, where: str = "record") -> tuple[list, list]:
    if label is None:
        raise ValueError(f"{where}: a string prompt needs its answer: pass --label-key (or use message lists)")
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError(f"{where}: the tokenizer has no eos token to end the answer with")
    p = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    c = list(tokenizer(str(label), add_special_tokens=False)["input_ids"]) + [eos]
    return p + c, [0] * len(p) + [1] * len(c)


def _fill(sample: Sample, tokens: list, mask: list, where: str) -> None:
    if 1 not in mask:
        raise ValueError(f"{where}: nothing to train on (no assistant turn / empty answer)")
    response_length = len(mask) - mask.index(1)
    sample.tokens, sample.response_length = tokens, response_length
    sample.loss_mask = mask[-response_length:]
    sample.rollout_log_probs = [0.0] * response_length     # no engine produced them; never read by sft_loss
    sample.response, sample.reward, sample.status = "", 0.0, Status.COMPLETED


def generate_rollout(args, rollout_id: int, data_source, evaluation: bool = False):
    """One rollout of SFT samples; evaluation (--eval-prompt-data, needs engines) generates as usual."""
    if evaluation:
        from .generate import generate_rollout as generate_eval

        return generate_eval(args, rollout_id, data_source, evaluation=True)   # a coroutine: awaited by the caller
    from .engines import current_state

    tokenizer = current_state().tokenizer
    args.loss_mask_type      # validated by the parser's choices; the template decides
    groups = data_source.get_samples(int(args.rollout_batch_size))
    for group in groups:
        for sample in group:
            where = f"prompt {sample.group_index}"
            if isinstance(sample.prompt, list):
                tokens, mask = conversation_tokens(tokenizer, sample.prompt, sample.metadata.get("tools"), where)
            else:
                tokens, mask = completion_tokens(tokenizer, sample.prompt, sample.label, where)
            _fill(sample, tokens, mask, where)
    return groups
