"""--enable-mtp-training (backends/megatron/mtp.py): MiMo's MTP layer in the Megatron trainer, on a tiny random MiMo
checkpoint (Qwen2 + one MTP layer), real megatron-core on CPU ranks.

- HF -> Megatron -> HF at TP 2 gives back every tensor of the checkpoint bit-identical, the MTP layer's included;
- a GRPO step reports an MTP loss equal to an independent computation (transformers' Qwen2 decoder layer run as
  MiMo's MTP layer on the HF weights, cross entropy of token t+2 on the trained response tokens) and moves the MTP
  weights;
- TP 2 reports the same MTP loss and makes the same update as TP 1 (sequence parallelism, which slime's MiMo
  recipe adds, needs TransformerEngine on CUDA);
- with --mtp-loss-scaling-factor 0 the policy's update equals a run without MTP layers.
"""
import json
import os

import pytest
import torch
from _dist import run_ranks
from test_trainer_common import make_args, make_batch

MTP_FLAGS = ("--enable-mtp-training", "--mtp-num-layers", "1")
STEP_FLAGS = ("--lr", "3e-3", "--global-batch-size", "8", "--micro-batch-size", "8", "--num-steps-per-rollout", "1")


@pytest.fixture(scope="module")
def mimo(tmp_path_factory):
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    return build_tiny_checkpoint(str(tmp_path_factory.mktemp("mtp") / "mimo"), arch="mimo", init_std=0.1,
                                 tie_embeddings=False)


def round_trip_rank(rank, world, port, ckpt):
    from slime_like.args import make_args as bare_args
    from slime_like.backends.megatron import hf_weights, model, parallel
    from slime_like.config.hf_config import fill_args_from_hf

    parallel.init_distributed(rank, world, master_port=port, tp=world)
    args = fill_args_from_hf(bare_args("--hf-checkpoint", ckpt, *MTP_FLAGS), ckpt)
    args.tensor_model_parallel_size = world
    chunks = model.build_model(args, "actor")
    hf_weights.load_hf_weights(chunks, ckpt, args)
    exported = {n: t.clone() for n, t in hf_weights.iter_hf_weights(chunks, args)}
    mtp_params = sorted(n for n, _ in chunks[0].named_parameters() if n.startswith("mtp."))
    return exported, mtp_params


def test_mtp_layer_round_trips_bit_identical_at_tp2(mimo):
    from safetensors.torch import load_file

    (exported, mtp_params), _ = run_ranks(round_trip_rank, 2, mimo)
    original = load_file(os.path.join(mimo, "model.safetensors"))
    assert sorted(exported) == sorted(original)  # the MTP layer's tensors are loaded and exported too
    assert any(".mtp_layers." in n for n in exported) and any(n.startswith("mtp.layers.0.eh_proj") for n in mtp_params)
    for name, tensor in original.items():
        assert torch.equal(exported[name], tensor), name


def _trainer(ckpt, rank, world, port, *flags):
    from slime_like.args import role_args
    from slime_like.backends.megatron.trainer import MegatronTrainer

    return MegatronTrainer(role_args(make_args(ckpt, *STEP_FLAGS, *flags), "actor"), role="actor", rank=rank,
                           world_size=world, master_port=port)


def grpo_step_rank(rank, world, port, ckpt, flags):
    t = _trainer(ckpt, rank, world, port, "--actor-num-gpus-per-node", str(world), *flags)
    batch = make_batch(8, seed=3, with_holes=True)
    batch.update(t.compute_log_probs(batch))
    batch.update(t.compute_advantages(batch))
    before = {n: w.clone() for n, w in t.iter_hf_weights()}
    metrics = t.train_step(0, batch)
    after = {n: w.clone() for n, w in t.iter_hf_weights()}
    return {"metrics": metrics, "before": before, "after": after, "batch": batch}


def _mimo_as_qwen2(ckpt, layer_source: str, tmp_path):
    """transformers' Qwen2 built from the MiMo checkpoint: the main model (layer_source "main"), or MiMo's MTP
    layer as a one-layer Qwen2 whose final norm is the MTP layer's final_layernorm ("mtp")."""
    import transformers
    from safetensors.torch import load_file

    with open(os.path.join(ckpt, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(model_type="qwen2", architectures=None)
    tensors = load_file(os.path.join(ckpt, "model.safetensors"))
    if layer_source == "mtp":
        cfg.update(num_hidden_layers=1, layer_types=["full_attention"])
        mtp = {n[len("model.mtp_layers.0."):]: t for n, t in tensors.items() if n.startswith("model.mtp_layers.0.")}
        tensors = {n: t for n, t in tensors.items() if not n.startswith("model.layers.") and ".mtp_layers." not in n}
        tensors.update({"model.layers.0." + n: t for n, t in mtp.items()
                        if n.split(".")[0] in ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")})
        tensors["model.norm.weight"] = mtp["final_layernorm.weight"]
    out = tmp_path / f"as_qwen2_{layer_source}"
    out.mkdir()
    with open(out / "config.json", "w") as f:
        json.dump(cfg, f)
    from safetensors.torch import save_file

    save_file({n: t.contiguous() for n, t in tensors.items()}, str(out / "model.safetensors"))
    return transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()


def independent_mtp_loss(ckpt, batch, tmp_path):
    """MiMo's MTP loss from the HF weights with transformers' modules: the main model's final (normed) hidden state
    at position t and the embedding of token t+1 -> hidden_layernorm / token_layernorm -> input_proj([h; e]) -> a Qwen2
    decoder layer -> final_layernorm -> lm_head; cross entropy of token t+2, averaged over the trained response
    tokens of the batch (one micro-batch)."""
    from safetensors.torch import load_file
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    main, layer = _mimo_as_qwen2(ckpt, "main", tmp_path), _mimo_as_qwen2(ckpt, "mtp", tmp_path)
    w = load_file(os.path.join(ckpt, "model.safetensors"))
    eps = main.config.rms_norm_eps
    norms = {}
    for name in ("hidden_layernorm", "token_layernorm"):
        norms[name] = Qwen2RMSNorm(main.config.hidden_size, eps=eps)
        norms[name].weight.data.copy_(w[f"model.mtp_layers.0.{name}.weight"])
    total, count = 0.0, 0
    with torch.no_grad():
        for toks, r, mask in zip(batch["tokens"], batch["response_lengths"], batch["loss_masks"]):
            ids = torch.tensor([toks])
            hidden = main.model(ids).last_hidden_state[:, :-1]          # positions 0..T-2
            embed = main.model.embed_tokens(ids[:, 1:])                  # tokens 1..T-1
            x = torch.cat([norms["hidden_layernorm"](hidden), norms["token_layernorm"](embed)], dim=-1)
            x = x @ w["model.mtp_layers.0.input_proj.weight"].T
            logits = layer(inputs_embeds=x).logits[0]                    # position t predicts token t+2
            logp = torch.log_softmax(logits[:-1], dim=-1).gather(-1, ids[0, 2:, None])[:, 0]
            trained = torch.tensor([0.0] * (len(toks) - r) + [float(m) for m in mask])[2:]
            total += float(-(logp * trained).sum())
            count += int(trained.sum())
    return total / count


def test_grpo_step_trains_the_mtp_layer_with_the_independent_loss(mimo, tmp_path):
    out = run_ranks(grpo_step_rank, 1, mimo, MTP_FLAGS + ("--mtp-loss-scaling-factor", "0.2"))[0]
    reported = out["metrics"]["mtp_loss"]
    expected = independent_mtp_loss(mimo, out["batch"], tmp_path)
    assert reported == pytest.approx(expected, rel=1e-5, abs=1e-6), (reported, expected)
    mtp_names = [n for n in out["before"] if ".mtp_layers." in n]
    from safetensors.torch import load_file

    on_disk = [n for n in load_file(os.path.join(mimo, "model.safetensors")) if ".mtp_layers." in n]
    assert sorted(mtp_names) == sorted(on_disk)  # the push carries the MTP layer (SGLang's MiMo draft reads them)
    moved = [n for n in mtp_names if not torch.equal(out["before"][n], out["after"][n])]
    assert set(moved) == set(mtp_names), sorted(set(mtp_names) - set(moved))


def test_zero_mtp_scale_leaves_the_policy_update_unchanged(mimo):
    with_mtp = run_ranks(grpo_step_rank, 1, mimo, MTP_FLAGS + ("--mtp-loss-scaling-factor", "0"))[0]
    without = run_ranks(grpo_step_rank, 1, mimo, ())[0]
    assert with_mtp["metrics"]["mtp_loss"] > 0 and "mtp_loss" not in without["metrics"]
    assert with_mtp["metrics"]["loss"] == without["metrics"]["loss"]
    assert with_mtp["metrics"]["grad_norm"] == without["metrics"]["grad_norm"]
    main = [n for n in without["after"]]
    assert main and all(".mtp_layers." not in n for n in main)
    for name in main:  # the same update, bit for bit: the MTP loss at scale 0 adds nothing to any gradient
        assert torch.equal(with_mtp["after"][name], without["after"][name]), name
    assert any(not torch.equal(with_mtp["before"][n], with_mtp["after"][n]) for n in main)
    for name in (n for n in with_mtp["after"] if ".mtp_layers." in n):  # no gradient, no weight decay: unmoved
        assert torch.equal(with_mtp["before"][name], with_mtp["after"][name]), name


def test_tp2_step_equals_tp1(mimo):
    # SGD: the update is the gradient itself (Adam's first step, lr x sign, would magnify rounding of tiny gradients)
    flags = MTP_FLAGS + ("--mtp-loss-scaling-factor", "0.2", "--optimizer", "sgd", "--lr", "0.5")
    tp1 = run_ranks(grpo_step_rank, 1, mimo, flags)[0]
    tp2 = run_ranks(grpo_step_rank, 2, mimo, flags + ("--tensor-model-parallel-size", "2"))[0]
    assert tp2["metrics"]["mtp_loss"] == pytest.approx(tp1["metrics"]["mtp_loss"], rel=1e-5)
    assert tp2["metrics"]["grad_norm"] == pytest.approx(tp1["metrics"]["grad_norm"], rel=1e-4)
    assert sorted(tp2["after"]) == sorted(tp1["after"])
    for name, weight in tp1["after"].items():
        torch.testing.assert_close(tp2["after"][name], weight, rtol=1e-4, atol=1e-5, msg=name)


def reference_from_torch_dist_rank(rank, world, port, ckpt, mcore_dir):
    """The reference model (no MTP layers) loads a torch_dist checkpoint that holds them (slime's --ref-load)."""
    from slime_like.args import make_args as bare_args
    from slime_like.backends.megatron import hf_weights, model, parallel, weight_sources
    from slime_like.config.hf_config import fill_args_from_hf

    parallel.init_distributed(rank, world, master_port=port)
    args = fill_args_from_hf(bare_args("--hf-checkpoint", ckpt, "--ref-load", mcore_dir, *MTP_FLAGS), ckpt)
    chunks = model.build_model(args, "ref")
    weight_sources.load_ref_weights(args, chunks)
    return {n: t.clone() for n, t in hf_weights.iter_hf_weights(chunks, args)}


def test_conversion_tools_carry_the_mtp_layer(mimo, tmp_path):
    """slime's MiMo recipe starts from a torch_dist --ref-load: convert_hf_to_megatron / convert_megatron_to_hf with
    --enable-mtp-training keep the MTP layer (TP 2 -> TP 1), bit-identical, and the reference model (built without
    MTP layers) loads its main model from that checkpoint."""
    from test_convert import hf_tensors, run_tool

    mc, back = tmp_path / "mcore", tmp_path / "hf_back"
    r = run_tool("convert_hf_to_megatron.py", "--hf-checkpoint", mimo, "--save", mc,
                 "--tensor-model-parallel-size", 2, *MTP_FLAGS)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "multi-token-prediction layer(s)" not in r.stderr + r.stdout  # nothing dropped
    r = run_tool("convert_megatron_to_hf.py", "--load", mc, "--hf-checkpoint", mimo, "--save-hf", back, *MTP_FLAGS)
    assert r.returncode == 0, r.stderr[-3000:]
    orig, new = hf_tensors(mimo), hf_tensors(back)
    assert sorted(new) == sorted(orig) and any(".mtp_layers." in n for n in new)
    assert all(torch.equal(orig[k], new[k]) for k in orig)
    ref = run_ranks(reference_from_torch_dist_rank, 1, mimo, str(mc))[0]
    assert sorted(ref) == sorted(n for n in orig if ".mtp_layers." not in n)
    assert all(torch.equal(orig[k], ref[k]) for k in ref)
