"""MegatronTrainer on one CPU rank (each case in a fresh spawned process: mcore's parallel state is global).

GRPO steps lower the loss and move log-probs the right way; log-probs equal transformers' own
log-softmax (with temperature); packed micro-batches, padded ones and --calculate-per-token-loss give
the same update; SFT lowers the NLL.
"""
import pytest
import torch
from _dist import run_ranks
from test_trainer_common import flat, make_args, make_batch, response_logprob_sums


def _trainer(ckpt, rank, world_size, port, *flags, role="actor"):
    from slime_like.args import role_args
    from slime_like.backends.megatron.trainer import MegatronTrainer

    return MegatronTrainer(role_args(make_args(ckpt, *flags), role), role=role, rank=rank, world_size=world_size,
                           master_port=port)


def grpo_case(rank, world_size, port, ckpt):
    t = _trainer(ckpt, rank, world_size, port, "--lr", "3e-3", "--global-batch-size", "4",
                 "--num-steps-per-rollout", "2", "--micro-batch-size", "2", "--use-kl-loss", "--kl-loss-coef", "0.01",
                 "--ref-load", ckpt,
                 "--entropy-coef", "0.001")
    batch = make_batch(8, seed=1)
    batch.update(t.compute_log_probs(batch))
    assert set(batch) >= {"log_probs", "ref_log_probs"}
    before = response_logprob_sums(batch["log_probs"], batch)
    batch.update(t.compute_advantages(batch))
    metrics = [t.train_step(i, batch) for i in range(3)]  # old log-probs stay those of rollout 0
    after = response_logprob_sums(t.compute_log_probs(batch)["log_probs"], batch)
    return {"metrics": metrics, "before": before, "after": after, "adv": [a.tolist() for a in batch["advantages"]],
            "fused": [(g.get("fused"), g.get("foreach")) for g in t.optimizer.param_groups]}


def test_grpo_steps_lower_the_loss_and_follow_the_advantage_sign(tiny_ckpt):
    out = run_ranks(grpo_case, 1, tiny_ckpt)[0]
    losses = [m["loss"] for m in out["metrics"]]
    assert losses[-1] < losses[0] - 0.05, losses
    m0 = out["metrics"][0]
    assert m0["num_steps"] == 2 and m0["tokens"] > 0 and m0["grad_norm"] > 0
    assert {"pg_loss", "kl_loss", "entropy", "clipfrac", "approx_kl", "lr"} <= set(m0)
    assert out["metrics"][-1]["kl_loss"] > 0   # the policy moved away from the reference
    (pos0, neg0), (pos1, neg1) = out["before"], out["after"]
    assert pos1 > pos0 + 0.5 and neg1 < neg0 - 0.5, (out["before"], out["after"])
    # GRPO advantages are the (group-normalised) reward on every response token
    assert all(set(a) == {1.0} or set(a) == {-1.0} for a in out["adv"])
    # without TE / Apex, Adam takes torch's fused kernel (transformers' default; ~4x the foreach loop on CPU)
    assert out["fused"] and all(g == (True, False) for g in out["fused"]), out["fused"]


def parity_case(rank, world_size, port, ckpt):
    import transformers

    batch = make_batch(6, seed=2)
    hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    out = {}
    for temperature in (1.0, 0.7):
        t = _trainer(ckpt, rank, world_size, port, "--rollout-temperature", temperature, "--micro-batch-size", "4",
                     "--global-batch-size", "8")
        ref = []
        with torch.no_grad():
            for toks, r in zip(batch["tokens"], batch["response_lengths"]):
                logits = hf(torch.tensor([toks])).logits[0].float() / temperature
                logp = torch.log_softmax(logits, dim=-1)[:-1].gather(-1, torch.tensor(toks[1:])[:, None])[:, 0]
                ref.append(logp[-r:])
        out[temperature] = {"ours": t.compute_log_probs(batch)["log_probs"], "hf": ref}
    return out


def test_log_probs_equal_transformers_log_softmax_with_temperature(tiny_ckpt):
    out = run_ranks(parity_case, 1, tiny_ckpt)[0]
    for temperature, got in out.items():
        assert all(o.dtype == torch.float32 and o.dim() == 1 for o in got["ours"])
        assert [o.numel() for o in got["ours"]] == [h.numel() for h in got["hf"]]
        torch.testing.assert_close(flat(got["ours"]), flat(got["hf"]), atol=2e-5, rtol=1e-5)
    # the temperature really changes the result (logits / T, not ignored)
    assert (flat(out[1.0]["ours"]) - flat(out[0.7]["ours"])).abs().max() > 1e-2


def layouts_case(rank, world_size, port, ckpt):
    """One update from the same weights under three micro-batch layouts; report metrics + new log-probs."""
    common = ("--lr", "1e-2", "--global-batch-size", "8", "--optimizer", "sgd", "--sgd-momentum", "0")
    layouts = {"padded": ("--micro-batch-size", "4"),
               "packed": ("--use-dynamic-batch-size", "--max-tokens-per-gpu", "24"),
               "per_token": ("--micro-batch-size", "1", "--calculate-per-token-loss")}
    batch = make_batch(8, seed=3, with_holes=True)
    out = {}
    for name, flags in layouts.items():
        t = _trainer(ckpt, rank, world_size, port, *common, *flags)
        b = dict(batch)
        b.update(t.compute_log_probs(b))
        b.update(t.compute_advantages(b))
        metrics = t.train_step(0, b)
        out[name] = {"metrics": metrics, "log_probs": t.compute_log_probs(batch)["log_probs"],
                     "old": b["log_probs"]}
    return out


def test_packing_and_per_token_loss_give_the_same_update_as_padding(tiny_ckpt):
    out = run_ranks(layouts_case, 1, tiny_ckpt)[0]
    base = out["padded"]
    torch.testing.assert_close(flat(out["packed"]["old"]), flat(base["old"]), atol=1e-5, rtol=1e-5)
    for name in ("packed", "per_token"):
        for key in ("loss", "pg_loss", "entropy", "grad_norm", "tokens"):
            assert out[name]["metrics"][key] == pytest.approx(base["metrics"][key], rel=1e-4, abs=1e-6), (name, key)
        torch.testing.assert_close(flat(out[name]["log_probs"]), flat(base["log_probs"]), atol=2e-5, rtol=1e-5)
    # the update did something measurable (so equality above is not trivially "nothing changed")
    assert (flat(base["log_probs"]) - flat(base["old"])).abs().max() > 1e-3


def sft_case(rank, world_size, port, ckpt):
    t = _trainer(ckpt, rank, world_size, port, "--loss-type", "sft_loss", "--lr", "3e-3",
                 "--global-batch-size", "8", "--micro-batch-size", "4")
    batch = make_batch(8, seed=4)
    return [t.train_step(i, batch)["loss"] for i in range(4)]


def test_sft_loss_decreases(tiny_ckpt):
    losses = run_ranks(sft_case, 1, tiny_ckpt)[0]
    assert losses[0] > 3.0 and losses[-1] < losses[0] - 0.3, losses


def _hf_log_probs(hf, batch):
    out = []
    with torch.no_grad():
        for toks, r in zip(batch["tokens"], batch["response_lengths"]):
            logp = torch.log_softmax(hf(torch.tensor([toks])).logits[0].float(), -1)
            out.append(logp[:-1].gather(-1, torch.tensor(toks[1:])[:, None])[-r:, 0])
    return out


def extras_case(rank, world_size, port, ckpt):
    """TIS + mismatch metrics, offload/onload between rollouts, --ref-update-interval, weight sync export."""
    import transformers

    t = _trainer(ckpt, rank, world_size, port, "--lr", "3e-3", "--global-batch-size", "8", "--micro-batch-size", "4",
                 "--use-kl-loss", "--kl-loss-coef", "0.01", "--kl-loss-type", "k3", "--ref-load", ckpt,
                 "--ref-update-interval", "2", "--use-tis", "--tis-clip", "2.0", "--get-mismatch-metrics")
    metrics, kl_after = [], []
    for rollout in range(2):
        t.offload()  # colocated turn-taking: the engines would generate here; a no-op on CPU
        t.onload()
        b = make_batch(8, seed=20 + rollout)
        b.update(t.compute_log_probs(b))
        b.update(t.compute_advantages(b))
        metrics.append(t.train_step(rollout, b))
        after = t.compute_log_probs(b)
        kl_after.append(float((flat(after["log_probs"]) - flat(after["ref_log_probs"])).abs().max()))
    batch = make_batch(6, seed=30)
    ours = t.compute_log_probs(batch)["log_probs"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    synced = dict(t.iter_hf_weights())
    missing, unexpected = hf.load_state_dict(synced, strict=False)
    return {"metrics": metrics, "kl_after": kl_after, "ours": ours, "hf": _hf_log_probs(hf, batch),
            "missing": [k for k in missing if not (k == "lm_head.weight" and hf.config.tie_word_embeddings)],
            "unexpected": unexpected}


def test_tis_ref_update_offload_and_weight_sync(tiny_ckpt):
    out = run_ranks(extras_case, 1, tiny_ckpt)[0]
    m0 = out["metrics"][0]
    assert {"tis_weight", "train_rollout_logprob_abs_diff", "kl_loss"} <= set(m0)
    # make_batch's rollout log-probs are ~-4; the trainer's differ, so TIS weights are clipped, not 1
    assert m0["train_rollout_logprob_abs_diff"] > 0.1 and 0 < m0["tis_weight"] <= 2.0
    assert out["kl_after"][0] > 1e-4           # rollout 0: the reference is still the initial model
    assert out["kl_after"][1] == 0.0           # rollout 1 ends a --ref-update-interval 2 period: ref = actor
    assert not out["missing"] and not out["unexpected"]
    torch.testing.assert_close(flat(out["ours"]), flat(out["hf"]), atol=2e-5, rtol=1e-5)
