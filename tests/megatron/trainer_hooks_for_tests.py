"""Tiny slime hooks for tests/megatron/test_trainer_hooks.py; each leaves a trace or changes the update."""
import torch

CALLS = []
REJECT_ALL = False


def init(args):
    CALLS.append(("init", args.lr))


def before_log_prob(args, model, store_prefix):
    CALLS.append(("log_prob", store_prefix, len(model)))


def before_train_step(args, rollout_id, step_id, model, optimizer, opt_param_scheduler):
    CALLS.append(("train_step", rollout_id, step_id, type(optimizer).__name__ != ""))


def all_positive_advantages(args, rollout_data):
    """Every response token gets advantage +1, whatever its reward."""
    rollout_data["advantages"] = [torch.ones(int(n)) for n in rollout_data["response_lengths"]]
    rollout_data["returns"] = [torch.ones(int(n)) for n in rollout_data["response_lengths"]]


def tis_or_reject(args, *, pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths,
                  response_lengths, **kwargs):
    assert [len(m) for m in loss_masks] == list(response_lengths) and len(total_lengths) == len(response_lengths)
    assert all(t > r for t, r in zip(total_lengths, response_lengths))
    masks = [torch.zeros_like(m) for m in loss_masks] if REJECT_ALL else loss_masks
    return pg_loss, masks, {"my_tis": torch.ones_like(pg_loss)}


def wrong_signature(args):
    return None


def flip_first_rollout(args, rollout_id, rollout_data):
    """The actor's batch before training: rollout 0's advantages change sign."""
    CALLS.append(("postprocess", rollout_id, sorted(rollout_data)[:2]))
    if rollout_id == 0:
        rollout_data["advantages"] = [-a for a in rollout_data["advantages"]]


def nll_loss(args, batch, logits, sum_of_sample_mean):
    """--loss-type custom_loss written like slime's: the responses' negative log-likelihood, reduced by the hook."""
    nll = []
    for row, targets in zip(logits, batch["targets"]):
        logp = torch.log_softmax(row[:len(targets)].float(), dim=-1)
        nll.append(-logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1) * batch["loss_masks"][len(nll)])
    loss = sum_of_sample_mean(torch.cat(nll))  # slime's flat layout
    return loss, {"my_nll": loss.detach()}


def double_token_mean(total_lengths, response_lengths, loss_masks, calculate_per_token_loss):
    """A pg-loss reducer: twice the token mean (one micro-batch per step, one DP rank, in slime's sample units)."""
    tokens = sum(float(m.sum()) for m in loss_masks)
    return lambda pg_loss: 2.0 * pg_loss.sum() / tokens * len(response_lengths)


def zero_reducer(total_lengths, response_lengths, loss_masks, calculate_per_token_loss):
    return lambda pg_loss: pg_loss.sum() * 0.0
