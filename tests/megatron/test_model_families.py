"""Model families beyond Qwen / Llama through the real trainer: one GRPO step on CPU from the tiny HF checkpoint.

Logits parity at TP/PP/EP and the HF export live in test_model_parity.py, the conversion round trip in
test_convert.py; here the parsed CLI path (MODEL_ARGS taken from config.json) trains.
"""
import pytest
from _dist import run_ranks, tiny_ckpts  # noqa: F401  (tiny_ckpts is a fixture)
from test_trainer_common import make_batch, response_logprob_sums
from test_trainer_single import _trainer


def _expert_biases(trainer):
    from slime_like.backends.megatron.hf_weights import unwrap

    return {n: b.clone() for c in trainer.model for n, b in unwrap(c).named_buffers() if n.endswith("expert_bias")}


def grpo_step_case(rank, world_size, port, ckpt, bias_rate):
    # one optimizer step per train_step; the bias change is measured per step (over two steps it can cancel out)
    t = _trainer(ckpt, rank, world_size, port, "--lr", "3e-3", "--global-batch-size", "8", "--micro-batch-size", "2",
                 "--num-steps-per-rollout", "1", "--moe-router-bias-update-rate", bias_rate)
    batch = make_batch(8, seed=1)
    batch.update(t.compute_log_probs(batch))
    before = response_logprob_sums(batch["log_probs"], batch)
    batch.update(t.compute_advantages(batch))
    metrics, moved = [], []
    for i in range(3):
        bias = _expert_biases(t)
        metrics.append(t.train_step(i, batch))
        moved.append({n: (b - bias[n]).abs().max().item() for n, b in _expert_biases(t).items()})
    after = response_logprob_sums(t.compute_log_probs(batch)["log_probs"], batch)
    return {"losses": [m["loss"] for m in metrics], "before": before, "after": after, "bias_moved": moved,
            "router": (t.args.moe_router_score_function, t.args.moe_router_num_groups, t.args.moe_router_group_topk)}


@pytest.mark.slow
@pytest.mark.parametrize("arch, bias_rate, groups, moe_layers", [
    ("glm4_moe", "0", 2, 1), ("glm4_moe", "0.01", 2, 1), ("deepseek_v3", "0", 2, 1), ("minimax_m2", "0", 1, 2),
    ("glm4_moe_lite", "0", 1, 1)])
def test_moe_family_grpo_step(tiny_ckpts, arch, bias_rate, groups, moe_layers):
    """MODEL_ARGS from config.json (sigmoid router; MLA for deepseek_v3, the norm over all q / k heads for
    minimax_m2); the loss falls and log-probs follow the advantage; the expert-bias correction stays fixed at update
    rate 0 (slime's recipes) and moves when asked."""
    out = run_ranks(grpo_step_case, 1, tiny_ckpts[arch], bias_rate)[0]
    assert out["router"] == ("sigmoid", groups, 1)
    assert out["losses"][-1] < out["losses"][0], out["losses"]
    (pos0, neg0), (pos1, neg1) = out["before"], out["after"]
    assert pos1 > pos0 and neg1 < neg0, (out["before"], out["after"])
    assert all(len(step) == moe_layers for step in out["bias_moved"])
    steps = [max(step.values()) for step in out["bias_moved"]]
    if bias_rate == "0":
        assert steps == [0.0, 0.0, 0.0]
    else:  # megatron-core's rule: +-rate per expert by the sign of (mean load - its load); 0 if perfectly balanced
        assert all(s == 0.0 or s == pytest.approx(0.01) for s in steps) and max(steps) == pytest.approx(0.01), steps


def dense_grpo_case(rank, world_size, port, ckpt):
    t = _trainer(ckpt, rank, world_size, port, "--lr", "3e-3", "--global-batch-size", "8", "--micro-batch-size", "2",
                 "--num-steps-per-rollout", "1")
    batch = make_batch(8, seed=1)
    batch.update(t.compute_log_probs(batch))
    before = response_logprob_sums(batch["log_probs"], batch)
    batch.update(t.compute_advantages(batch))
    losses = [t.train_step(i, batch)["loss"] for i in range(2)]
    after = response_logprob_sums(t.compute_log_probs(batch)["log_probs"], batch)
    layer = t.chunks[0].decoder.layers[0]
    return {"losses": losses, "before": before, "after": after, "layer": type(layer).__name__,
            "sandwich": [hasattr(layer, n) for n in ("post_self_attn_layernorm", "post_mlp_layernorm")],
            "flags": (t.args.rotary_interleaved, t.args.rotary_percent)}


@pytest.mark.slow
def test_glm4_dense_grpo_step(tiny_ckpts):
    """GLM-4 dense from config.json alone: sandwich-norm layers, interleaved half RoPE; GRPO steps move log-probs
    the way the advantages say."""
    out = run_ranks(dense_grpo_case, 1, tiny_ckpts["glm4"])[0]
    assert out["layer"] == "SandwichTransformerLayer" and out["sandwich"] == [True, True]
    assert out["flags"] == (True, 0.5)
    assert out["losses"][-1] < out["losses"][0], out["losses"]
    (pos0, neg0), (pos1, neg1) = out["before"], out["after"]
    assert pos1 > pos0 and neg1 < neg0, (out["before"], out["after"])


@pytest.mark.slow
@pytest.mark.parametrize("arch, router", [("qwen2_moe", "softmax"), ("mimo", None)])
def test_qwen2_moe_and_mimo_grpo_step(tiny_ckpts, arch, router):
    """Qwen2-MoE (softmax router, gated shared expert) and MiMo (Qwen2 with its MTP layer dropped) from config.json
    alone: finite losses that fall, log-probs moving the way the advantages say."""
    import math

    out = run_ranks(grpo_step_case, 1, tiny_ckpts[arch], "0")[0]
    assert all(math.isfinite(x) for x in out["losses"]), out["losses"]
    assert out["losses"][-1] < out["losses"][0], out["losses"]
    (pos0, neg0), (pos1, neg1) = out["before"], out["after"]
    assert pos1 > pos0 and neg1 < neg0, (out["before"], out["after"])
    if router:
        assert out["router"][0] == router


def linear_attention_case(rank, world_size, port, ckpt):
    out = grpo_step_case(rank, world_size, port, ckpt, "0")
    from slime_like.args import make_args
    from slime_like.config.hf_config import fill_args_from_hf

    args = fill_args_from_hf(make_args("--hf-checkpoint", ckpt), ckpt)
    out["flags"] = (tuple(args.spec), args.attention_output_gate, args.apply_layernorm_1p, args.hf_text_of_vlm)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("arch, spec_module, vlm", [("qwen3_next", "qwen3_next", False), ("qwen3_5", "qwen3_5", True),
                                                    ("qwen3_5_moe", "qwen3_5", True)])
def test_linear_attention_grpo_step(tiny_ckpts, arch, spec_module, vlm):
    """Qwen3-Next / Qwen3.5 dense and MoE from config.json alone (slime's spec name, gated attention, zero-centred
    norms; Qwen3.5 from its vision-language layout): GRPO steps through gated delta net layers give finite losses
    that fall and log-probs that move the way the advantages say."""
    import math

    out = run_ranks(linear_attention_case, 1, tiny_ckpts[arch])[0]
    assert out["flags"] == ((f"slime_plugins.models.{spec_module}", f"get_{spec_module}_spec"), True, True, vlm)
    assert all(math.isfinite(x) for x in out["losses"]), out["losses"]
    assert out["losses"][-1] < out["losses"][0], out["losses"]
    (pos0, neg0), (pos1, neg1) = out["before"], out["after"]
    assert pos1 > pos0 and neg1 < neg0, (out["before"], out["after"])
