"""Per-micro-batch losses of the trainers (Megatron and FSDP), built from slime_like.algorithms' pure functions.

Backend-neutral: `output` is the model's logits `[b, S, V]` (or values `[b, S, 1]` for the critic) and
the MicroBatch says where each response token is scored. Only Megatron has tensor parallelism; the FSDP
trainer always sees the full vocabulary (TP = 1).

What lives here and not in algorithms/: the tensor-parallel part. Under TP each rank holds a vocabulary
slice of the logits `[.., V/tp]`; `vocab_parallel_logprobs_entropy` computes log p(target) and the
entropy with three all-reduces of `[n, R]` statistics (max, sum exp, target logit) and never gathers the
full vocabulary. At TP=1 it equals torch's log_softmax at the target and the entropy of the full softmax
(tests/megatron/test_trainer_data.py checks that).

Aggregation over a step (many micro-batches, many DP ranks) must give one token-mean:
    L = sum over every valid token t of the step, on every DP rank, of l_t / N_step
mcore's schedule divides each micro-batch loss by the number of micro-batches and DDP averages
gradients over DP, so a micro-batch returns  sum_t l_t * (n_microbatches * dp / N_step)  (`scale`).
With --calculate-per-token-loss the micro-batch returns the plain sum and its token count, and mcore
itself divides the gradients by the token count all-reduced over DP (finalize_model_grads) - the same
objective, reached through Megatron's own path.
"""
from __future__ import annotations

import sys

import torch

from slime_like import algorithms as alg
from slime_like.backends.training.micro_batch import MicroBatch
from slime_like.backends.training.hooks import custom_tis as custom_tis_call, total_lengths
from slime_like.backends.training import custom_loss as C


def _tp():
    """(group, size, rank) of tensor parallelism; no TP before mcore's parallel state exists.

    Looked up in sys.modules: a backend that never imported megatron-core (FSDP) has no TP, and must not
    pay megatron-core's import for asking."""
    ps = sys.modules.get("megatron.core.parallel_state")
    if ps is None or not ps.model_parallel_is_initialized():
        return None, 1, 0
    return ps.get_tensor_model_parallel_group(), ps.get_tensor_model_parallel_world_size(), \
        ps.get_tensor_model_parallel_rank()


def _sequence_mean_over_cp():
    """GSPO's / OPSM's per-sequence mean under context parallelism: each CP rank holds part of every response,
    so the masked sums and counts are all-reduced over the CP group (detached statistics: no gradient flows
    through them); {} (the plain masked mean) without CP. Keyword arguments of algorithms' seq_mean."""
    ps = sys.modules.get("megatron.core.parallel_state")
    if ps is None or not ps.model_parallel_is_initialized() or ps.get_context_parallel_world_size() == 1:
        return {}
    group = ps.get_context_parallel_group()

    def seq_mean(x, valid):
        both = torch.stack([(x * valid).sum(-1).double(), valid.sum(-1).double()])
        torch.distributed.all_reduce(both, group=group)
        return (both[0] / both[1].clamp(min=1)).to(x.dtype)

    return {"seq_mean": seq_mean}


def _reduce_sum(x: torch.Tensor, group, tp: int) -> torch.Tensor:
    """Sum over the TP ranks' vocabulary slices; the backward is the identity (megatron's
    reduce_from_tensor_model_parallel_region): every TP rank computes the same loss, so each rank's slice gets
    exactly dL/d(sum)."""
    if tp == 1:
        return x
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    return reduce_from_tensor_model_parallel_region(x.contiguous(), group=group)


def _shifted_logits(logits: torch.Tensor, vocab_size: int | None, tp_info):
    """(logits - max over the whole vocabulary, exp of that, its sum over the whole vocabulary) of a slice.

    `vocab_size`: the model's real vocabulary (HF config). Megatron pads the output layer to a multiple of
    128 x TP; those padding columns are not tokens (the rollout engine never samples them), so they are
    excluded from the softmax - otherwise log-probs would depend on the TP size. They get a large finite
    negative (not -inf): exp() gives exactly 0 and 0 * shifted stays finite, so neither the entropy, a KL nor
    any gradient sees a NaN; masked_fill passes no gradient to the padding. The max is a constant shift
    (detached), which is exact."""
    group, tp, rank = tp_info
    logits = logits.float()
    v_local = logits.size(-1)
    start = rank * v_local
    if vocab_size is not None and start + v_local > vocab_size:
        padding = torch.arange(start, start + v_local, device=logits.device) >= vocab_size
        logits = logits.masked_fill(padding, -1e30)
    m = logits.detach().max(dim=-1, keepdim=True).values
    if tp > 1:
        torch.distributed.all_reduce(m, op=torch.distributed.ReduceOp.MAX, group=group)
    shifted = logits - m
    exp = shifted.exp()
    return shifted, exp, _reduce_sum(exp.sum(dim=-1), group, tp)


def vocab_parallel_logprobs_entropy(logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool = True,
                                    vocab_size: int | None = None):
    """log p(targets) and entropy from vocab-sharded logits `[..., V_local]` (temperature already applied).

        m = max_v z_v (all ranks),  Z = sum_v exp(z_v - m),  log p(y) = (z_y - m) - log Z,
        H = log Z - sum_v p_v (z_v - m)
    Sums over the vocabulary are local sums followed by an all-reduce (_reduce_sum).
    """
    tp_info = _tp()
    group, tp, rank = tp_info
    shifted, exp, sum_exp = _shifted_logits(logits, vocab_size, tp_info)
    v_local = shifted.size(-1)
    start = rank * v_local
    log_z = sum_exp.log()
    in_slice = (targets >= start) & (targets < start + v_local)
    local = (targets - start).clamp(0, v_local - 1)
    target_logit = _reduce_sum(shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1) * in_slice, group, tp)
    logp = target_logit - log_z
    if not with_entropy:
        return logp, None
    entropy = log_z - _reduce_sum((exp * shifted).sum(dim=-1), group, tp) / sum_exp
    return logp, entropy


def vocab_parallel_reverse_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                              vocab_size: int | None = None) -> torch.Tensor:
    """KL(student || teacher) over the whole vocabulary at every position, from vocab-sharded logits
    `[..., V_local]` of both models (same sharding, temperature applied); the teacher is a constant.

        KL = sum_v p_v (log p_v - log q_v),   log p_v = (z_v - m) - log Z  (q likewise from the teacher)
    The exact per-position reverse KL that --opd-kl-mode full trains on (the sampled mode's d_t is a one-token
    estimate of it). Padding columns have p_v = 0 and add nothing."""
    tp_info = _tp()
    s_shifted, s_exp, s_sum = _shifted_logits(student_logits, vocab_size, tp_info)
    t_shifted, _, t_sum = _shifted_logits(teacher_logits.detach(), vocab_size, tp_info)
    log_ratio = (s_shifted - s_sum.log().unsqueeze(-1)) - (t_shifted - t_sum.log().unsqueeze(-1))
    p = s_exp / s_sum.unsqueeze(-1)
    return _reduce_sum((p * log_ratio).sum(dim=-1), tp_info[0], tp_info[1])


def response_logits(output: torch.Tensor, mb: MicroBatch, temperature: float = 1.0) -> torch.Tensor:
    """`[n, Rmax, V_local]` logits scoring each response token (divided by the sampling temperature,
    so they describe the distribution the rollout engine sampled from)."""
    logits = output[mb.rows, mb.cols]
    return logits / temperature if temperature != 1.0 else logits


def response_values(output: torch.Tensor, mb: MicroBatch) -> torch.Tensor:
    """`[n, Rmax]` critic values at the same positions as the log-probs (value head output size 1)."""
    return output[mb.rows, mb.cols, 0].float()


def policy_terms(args, output: torch.Tensor, mb: MicroBatch, hooks: dict | None = None, step=None, teacher=None, *,
                 estimator):
    """Per-token actor loss `[n, R]` and metric sums for one micro-batch.

        l_t = w_t * pg_t + kl_loss_coef * kl_t - entropy_coef * H_t  [+ opd_kl_coef * KL_t(student || teacher)]
    pg_t: PPO / GSPO clipped surrogate or CISPO (algorithms.policy_loss, kind from --advantage-estimator), times
    the off-policy sequence mask with --use-opsm (algorithms.opsm_mask);
    w_t: truncated importance-sampling weights (--use-tis); kl_t: algorithms.kl_penalty with
    --kl-loss-type against the reference log-probs (--use-kl-loss), times pi/pi_old with --use-unbiased-kl.
    When the batch has no old-policy
    `log_probs` (on-policy, one step per rollout) the current log-probs, detached, are the old ones.
    `teacher` (--opd-kl-mode full): mb -> the frozen teacher's response logits, for the last, bracketed term.
    `estimator`: the run's algorithms.EstimatorSpec (the trainer looks it up once), for its ratio kind.
    """
    mask = mb.loss_mask
    logits = response_logits(output, mb, args.rollout_temperature)
    logp, entropy = vocab_parallel_logprobs_entropy(logits, mb.targets, vocab_size=args.vocab_size)
    old = mb.fields.get("log_probs", logp.detach())
    kind = estimator.policy_loss_kind  # token- or sequence-level ratio
    cp_mean = _sequence_mean_over_cp()  # GSPO's / OPSM's per-sequence means under CP
    pg, pg_metrics = alg.policy_loss(logp, old, mb.fields["advantages"], mask, args.eps_clip,
                                     eps_clip_high=args.eps_clip_high, eps_clip_c=args.eps_clip_c, kind=kind,
                                     **cp_mean)
    if args.use_opsm:   # slime: drop off-policy sequences pushed down (their old policy: the batch's old log-probs)
        keep, dropped = alg.opsm_mask(logp, old, mb.fields["advantages"], mask, args.opsm_delta, **cp_mean)
        pg = pg * keep
        pg_metrics["opsm_clipfrac"] = dropped
    sums = {"pg_loss": (pg * mask).sum().detach(), "entropy": (entropy * mask).sum().detach()}
    # Without a separate old-policy pass (on-policy) this is the trainer-vs-engine gap of the same weights.
    if (args.get_mismatch_metrics or "log_probs" not in mb.fields) \
            and "rollout_log_probs" in mb.fields:
        diff = (old - mb.fields["rollout_log_probs"]).abs()
        sums["train_rollout_logprob_abs_diff"] = (diff * mask).sum().detach()
    if "teacher_log_probs" in mb.fields:  # --use-opd: the sampled reverse KL to the teacher, logged
        sums["opd_reverse_kl"] = ((old - mb.fields["teacher_log_probs"]) * mask).sum().detach()
    pg = _importance_weighted(args, pg, old, mb, hooks, sums)
    reducer = (hooks or {}).get("custom_pg_loss_reducer_function_path")
    pg_share = None
    if reducer:  # slime: the policy loss alone is reduced by the user's function; the other terms as usual
        pg_share = C.reduced_pg_loss(reducer, args, pg, mb, step, total_lengths(mb))
        pg = torch.zeros_like(pg)
    loss = pg
    if args.use_kl_loss:
        loss = loss + args.kl_loss_coef * _kl_loss(args, logp, old, mb, sums)
    if args.entropy_coef:
        loss = loss - args.entropy_coef * entropy
    if teacher is not None:
        kl = vocab_parallel_reverse_kl(logits, teacher(mb), vocab_size=args.vocab_size)
        sums["opd_reverse_kl"] = (kl * mask).sum().detach()
        loss = loss + args.opd_kl_coef * kl
    ntok = mask.sum()
    if alg.importance_ratio_exceeds(logp, old, mask, args.early_stop_imp_ratio):
        loss = loss * 0.0  # RLinf early_stop_imp_ratio: abandon this micro-batch's update, keep the graph
        pg_share = None if pg_share is None else pg_share * 0.0
        sums["early_stopped_frac"] = ntok.detach().float()
    else:
        sums["early_stopped_frac"] = torch.zeros((), dtype=torch.float32)
    for key, value in pg_metrics.items():
        value = torch.as_tensor(value, dtype=torch.float32).detach()
        sums[key] = value if key.endswith("_max") else value * ntok  # scalar means -> token-weighted sums
    if pg_share is not None:
        sums["_pg_share"] = pg_share  # added to the loss by make_loss_func (not a logged metric)
    return loss, sums


def _importance_weighted(args, pg: torch.Tensor, old: torch.Tensor, mb: MicroBatch, hooks, sums: dict):
    """pg times --use-tis's truncated importance weights, or through slime's --custom-tis-function-path (called
    with --use-tis or --get-mismatch-metrics, slime's condition; tokens it rejects add 0)."""
    custom_tis = (hooks or {}).get("custom_tis_function_path")
    if custom_tis and (args.use_tis or args.get_mismatch_metrics):
        pg, _, tis_sums = custom_tis_call(custom_tis, args, pg, old, mb.fields["rollout_log_probs"], mb)
        sums.update(tis_sums)
    elif args.use_tis:
        weights = alg.tis_weights(old, mb.fields["rollout_log_probs"], mb.loss_mask, args.tis_clip,
                                  args.tis_clip_low)
        sums["tis_weight"] = (weights * mb.loss_mask).sum().detach()
        pg = pg * weights
    return pg


def _kl_loss(args, logp: torch.Tensor, old: torch.Tensor, mb: MicroBatch, sums: dict) -> torch.Tensor:
    """--use-kl-loss: per-token KL to the reference (--kl-loss-type), logged as kl_loss."""
    kl = alg.kl_penalty(logp, mb.fields["ref_log_probs"], args.kl_loss_type)
    if args.use_unbiased_kl:
        # The tokens were sampled by the old policy, so a KL estimate under the current one needs the
        # importance ratio pi/pi_old; like slime it is not detached (its gradient is part of the estimator).
        kl = torch.exp(logp - old) * kl
    sums["kl_loss"] = (kl * mb.loss_mask).sum().detach()
    return kl


def custom_terms(args, output: torch.Tensor, mb: MicroBatch, hooks: dict, step, w: torch.Tensor):
    """--loss-type custom_loss: (slime-units loss, metric token-sums) of the user's loss on the response logits."""
    logits = response_logits(output, mb, args.rollout_temperature)
    loss, metrics = C.custom_loss(hooks.get("custom_loss_function_path"), args, logits, mb, w, step, total_lengths(mb))
    return loss, {k: C.to_metric_sum(v, step) for k, v in metrics.items()}


def value_terms(args, output: torch.Tensor, mb: MicroBatch):
    """Per-token critic loss: algorithms.value_loss (clipped by --value-clip around the rollout's values)."""
    values = response_values(output, mb)
    loss, metrics = alg.value_loss(values, mb.fields["values"], mb.fields["returns"], mb.loss_mask,
                                   args.value_clip, with_metrics=True)
    ntok = mb.loss_mask.sum()
    sums = {"value_loss": (loss * mb.loss_mask).sum().detach(),
            "values": (values * mb.loss_mask).sum().detach()}
    for key, value in metrics.items():
        value = torch.as_tensor(value, dtype=torch.float32).detach()
        sums[key] = value if key.endswith("_max") else value * ntok
    return loss, sums


def sft_terms(args, output: torch.Tensor, mb: MicroBatch):
    """Per-token negative log-likelihood of the response (--loss-type sft_loss) via algorithms.sft_loss."""
    logp, _ = vocab_parallel_logprobs_entropy(response_logits(output, mb, 1.0), mb.targets, with_entropy=False,
                                              vocab_size=args.vocab_size)
    loss = alg.sft_loss(logp, mb.loss_mask)
    if loss.dim() == 0:  # a reduced NLL cannot be re-aggregated over the step; fail loudly
        raise TypeError("algorithms.sft_loss must return per-token losses [n, R] for the trainers")
    return loss, {"sft_loss": (loss * mb.loss_mask).sum().detach()}


TERMS = {"policy": policy_terms, "value": value_terms, "sft": sft_terms}


POLICY_FIELDS = ("log_probs", "advantages", "ref_log_probs", "rollout_log_probs", "teacher_log_probs")
VALUE_FIELDS = ("values", "returns")


def loss_kind(args, role: str, batch: dict):
    """(loss kind, per-sample fields the loss reads, fields that must be present, batch to train on) of a train
    step of `role`."""
    if role == "critic":
        return "value", VALUE_FIELDS, VALUE_FIELDS, batch
    if args.loss_type == "sft_loss":
        return "sft", (), (), batch
    # the policy loss, or slime's --loss-type custom_loss on the same fields
    kind = "custom" if args.loss_type == "custom_loss" else "policy"
    rollout_lp = args.use_tis or args.use_rollout_logprobs or args.get_mismatch_metrics
    need = (("advantages",) if args.compute_advantages_and_returns else ()) \
        + (("ref_log_probs",) if args.use_kl_loss else ()) + (("rollout_log_probs",) if rollout_lp else ())
    if args.use_rollout_logprobs:  # the engine's log-probs are the old policy
        batch = dict(batch, log_probs=batch["rollout_log_probs"])
    return kind, POLICY_FIELDS, need, batch


def make_loss_func(kind: str, args, mb: MicroBatch, scale: float, per_token: bool, weights=None,
                   hooks: dict | None = None, step=None, teacher=None, *, estimator=None):
    """The `loss_func(output_tensor)` that mcore's forward_step calls on the last pipeline stage.

    `weights` ([n, R], from algorithms.step_token_weights, already times the schedule's factor) replace the
    token-mean `scale` for --loss-agg-mode seq-mean-* and --loss-micro-batch-mean. `hooks`: the trainer's
    loaded slime hooks (the policy terms call --custom-tis-function-path / --custom-pg-loss-reducer-function-path;
    kind "custom" calls --custom-loss-function-path). `step` (custom_loss.Step): needed by those two.
    `teacher`: the policy terms' --opd-kl-mode full teacher (RLTrainerBase._opd_teacher). `estimator`: the run's
    EstimatorSpec (RLTrainerBase.estimator), needed by kind "policy"."""

    def loss_func(output):
        ntok = mb.loss_mask.sum()
        if kind == "custom":
            share, sums = custom_terms(args, output, mb, hooks, step, C.share_weights(mb, scale, weights, step))
            sums["loss"] = C.to_metric_sum(share, step)
            sums["tokens"] = ntok.detach()
            return (share, ntok.to(torch.int), sums) if per_token else (C.to_mcore(share, step), sums)
        per_token_loss, sums = policy_terms(args, output, mb, hooks, step, teacher, estimator=estimator) \
            if kind == "policy" else TERMS[kind](args, output, mb)
        pg_share = sums.pop("_pg_share", None)
        total = alg.aggregate_loss(per_token_loss, mb.loss_mask, "sum")  # scaled to a step token-mean below
        sums["loss"] = total.detach() + (0.0 if pg_share is None else C.to_metric_sum(pg_share, step))
        sums["tokens"] = ntok.detach()
        extra = 0.0 if pg_share is None else C.to_mcore(pg_share, step)
        if per_token:
            return total + extra, ntok.to(torch.int), sums
        if weights is not None:
            return (per_token_loss * weights.to(per_token_loss.dtype)).sum() + extra, sums
        return total * scale + extra, sums

    return loss_func


def forward_only_func(kind: str, mb: MicroBatch, temperature: float, vocab_size: int | None = None, gather=None):
    """loss_func for compute_log_probs / compute_values: per-token outputs, no loss (forward only).
    `gather(values, mb)`: under context parallelism, this rank's response tokens -> whole responses
    (cp_layout.gather_response_rows over the CP group)."""

    def loss_func(output):
        with torch.no_grad():
            if kind == "values":
                out = response_values(output, mb)
            else:
                out, _ = vocab_parallel_logprobs_entropy(response_logits(output, mb, temperature), mb.targets,
                                                         with_entropy=False, vocab_size=vocab_size)
            if gather is not None:
                out = gather(out, mb)
        return torch.zeros((), device=output.device), {"ids": mb.sample_ids, "out": out.float().cpu(),
                                                       "lengths": mb.response_lengths}

    return loss_func


def aggregation_weights(args, mbs: list, dp: int, global_tokens: float, dp_all_reduce, cp_all_reduce=None) -> dict:
    """id(micro-batch) -> per-token weights for --loss-agg-mode seq-mean-* / --loss-micro-batch-mean; {} for the
    default step token-mean (the `scale` path of make_loss_func). mcore divides each micro-batch loss by their
    count and DDP averages over DP (mcore's schedule multiplies by CP what DDP divides by it), so step weights are
    multiplied by count x DP; with --loss-micro-batch-mean each micro-batch is aggregated alone and they weigh the
    same. `dp_all_reduce` sums a tensor over DP (x CP). `cp_all_reduce` (context parallelism: a rank holds part
    of each response) sums over the CP group, giving each response's whole token count; None without CP."""
    mode = args.loss_agg_mode
    horizon = args.rollout_max_response_len
    if mode == "token-mean" and not args.loss_micro_batch_mean:
        return {}
    counts = {id(mb): mb.loss_mask.sum(-1) for mb in mbs}  # each response's valid tokens
    if cp_all_reduce is not None:
        counts = {k: cp_all_reduce(v.double()).to(v.device, torch.float32) for k, v in counts.items()}
    cp = 1 if cp_all_reduce is None else int(cp_all_reduce(torch.ones((), dtype=torch.float64)).item())
    if args.loss_micro_batch_mean:
        return {id(mb): alg.step_token_weights(mb.loss_mask, mode, counts[id(mb)].sum().item(),
                                               (counts[id(mb)] > 0).sum().item(), horizon, counts[id(mb)])
                for mb in mbs}
    local = torch.tensor(float(sum((counts[id(mb)] > 0).sum().item() for mb in mbs)), dtype=torch.float64)
    seqs = max(dp_all_reduce(local).item() / cp, 1.0)  # every CP rank counted the same responses
    return {id(mb): alg.step_token_weights(mb.loss_mask, mode, global_tokens, seqs, horizon, counts[id(mb)])
            * (len(mbs) * dp) for mb in mbs}
