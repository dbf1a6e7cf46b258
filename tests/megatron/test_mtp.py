"""--enable-mtp-training (backends/megatron/mtp.py): the MTP layer of MiMo (Qwen2 + model.mtp_layers.0.*), DeepSeek-V3
and GLM-4.5 (MoE, model.layers.<num_hidden_layers>.*) in the Megatron trainer, on tiny random checkpoints, real
megatron-core on CPU ranks.

- HF -> Megatron -> HF at TP 2 gives back every tensor of the checkpoint bit-identical, the MTP layer's included;
- a GRPO step reports an MTP loss equal to an independent computation (the family's transformers decoder layer run
  as the MTP layer on the HF weights, cross entropy of token t+2 on the trained response tokens) and moves the MTP
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


# name -> build_tiny_checkpoint kwargs: MiMo (model.mtp_layers.0.*), DeepSeek-V3 and GLM-4.5 (MoE; the MTP layer is
# model.layers.2.*, a MoE layer with multi-latent attention / GLM-4.5's attention)
TINY = {"mimo": dict(arch="mimo"),
        "deepseek_v3": dict(arch="deepseek_v3", num_experts=4, moe_topk=2, mtp_layers=1),
        "glm4_moe": dict(arch="glm4_moe", num_experts=4, moe_topk=2, mtp_layers=1)}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("mtp")
    return {name: build_tiny_checkpoint(str(root / name), init_std=0.1, tie_embeddings=False, **kw)
            for name, kw in TINY.items()}


@pytest.fixture(scope="module")
def mimo(ckpts):
    return ckpts["mimo"]


def _is_mtp(name: str, ckpt: str) -> bool:
    """Whether HF tensor `name` belongs to an MTP layer of checkpoint `ckpt`."""
    with open(os.path.join(ckpt, "config.json")) as f:
        layers = json.load(f)["num_hidden_layers"]
    return ".mtp_layers." in name or name.startswith(f"model.layers.{layers}.")


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


@pytest.mark.parametrize("arch", list(TINY))
def test_mtp_layer_round_trips_bit_identical_at_tp2(ckpts, arch):
    from safetensors.torch import load_file

    (exported, mtp_params), _ = run_ranks(round_trip_rank, 2, ckpts[arch])
    original = load_file(os.path.join(ckpts[arch], "model.safetensors"))
    assert sorted(exported) == sorted(original)  # the MTP layer's tensors are loaded and exported too
    assert any(_is_mtp(n, ckpts[arch]) for n in exported)
    assert any(n.startswith("mtp.layers.0.eh_proj") for n in mtp_params)
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


def _transformers_model(ckpt, layer_source: str, tmp_path):
    """transformers' model of the checkpoint's main model (layer_source "main"; MiMo as transformers' qwen2, which it
    subclasses), or its MTP layer as a one-layer model of the same family whose final norm is the MTP layer's
    (final_layernorm / shared_head.norm) and whose head is the LM head ("mtp")."""
    import transformers
    from safetensors.torch import load_file, save_file

    with open(os.path.join(ckpt, "config.json")) as f:
        cfg = json.load(f)
    mimo_layout = cfg["model_type"] == "mimo"
    if mimo_layout:
        cfg.update(model_type="qwen2", architectures=None)
    tensors = load_file(os.path.join(ckpt, "model.safetensors"))
    if layer_source == "mtp":
        prefix = "model.mtp_layers.0." if mimo_layout else f"model.layers.{cfg['num_hidden_layers']}."
        mtp = {n[len(prefix):]: t for n, t in tensors.items() if n.startswith(prefix)}
        tensors = {n: t for n, t in tensors.items() if not n.startswith("model.layers.") and ".mtp_layers." not in n}
        tensors.update({"model.layers.0." + n: t for n, t in mtp.items()
                        if n.split(".")[0] in ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")})
        tensors["model.norm.weight"] = mtp["final_layernorm.weight" if mimo_layout else "shared_head.norm.weight"]
        cfg.update(num_hidden_layers=1, num_nextn_predict_layers=0, first_k_dense_replace=0)
        for key in ("layer_types", "mlp_layer_types"):
            cfg.pop(key, None)
        if mimo_layout:
            cfg["layer_types"] = ["full_attention"]
    out = tmp_path / f"as_transformers_{layer_source}"
    out.mkdir()
    with open(out / "config.json", "w") as f:
        json.dump(cfg, f)
    save_file({n: t.contiguous() for n, t in tensors.items()}, str(out / "model.safetensors"))
    return transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()


def _mtp_input(ckpt, w, eps, hidden, embed):
    """The MTP layer's input from the main model's final hidden state and the next token's embedding: MiMo's
    input_proj([hidden_layernorm(h); token_layernorm(e)]), DeepSeek-V3 / GLM-4.5's eh_proj([enorm(e); hnorm(h)])."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm  # the same RMSNorm as the three families'

    def norm(x, weight):
        layer = Qwen2RMSNorm(x.shape[-1], eps=eps)
        layer.weight.data.copy_(weight)
        return layer(x)

    mtp = [n for n in w if n.endswith(("input_proj.weight", "eh_proj.weight"))][0]
    pre = mtp.rsplit(".", 2)[0] + "."
    if ".mtp_layers." in mtp:
        x = torch.cat([norm(hidden, w[pre + "hidden_layernorm.weight"]), norm(embed, w[pre + "token_layernorm.weight"])],
                      dim=-1)
    else:
        x = torch.cat([norm(embed, w[pre + "enorm.weight"]), norm(hidden, w[pre + "hnorm.weight"])], dim=-1)
    return x @ w[mtp].T


def independent_mtp_loss(ckpt, batch, tmp_path):
    """The MTP loss from the HF weights with transformers' modules: the main model's final (normed) hidden state at
    position t and the embedding of token t+1 -> the layout's norms and projection (_mtp_input) -> the family's
    decoder layer -> the MTP layer's final norm -> lm_head; cross entropy of token t+2, averaged over the trained
    response tokens of the batch (one micro-batch)."""
    from safetensors.torch import load_file

    main, layer = _transformers_model(ckpt, "main", tmp_path), _transformers_model(ckpt, "mtp", tmp_path)
    w = load_file(os.path.join(ckpt, "model.safetensors"))
    total, count = 0.0, 0
    with torch.no_grad():
        for toks, r, mask in zip(batch["tokens"], batch["response_lengths"], batch["loss_masks"]):
            ids = torch.tensor([toks])
            hidden = main.model(ids).last_hidden_state[:, :-1]          # positions 0..T-2
            embed = main.model.embed_tokens(ids[:, 1:])                  # tokens 1..T-1
            x = _mtp_input(ckpt, w, main.config.rms_norm_eps, hidden, embed)
            logits = layer(inputs_embeds=x).logits[0]                    # position t predicts token t+2
            logp = torch.log_softmax(logits[:-1], dim=-1).gather(-1, ids[0, 2:, None])[:, 0]
            trained = torch.tensor([0.0] * (len(toks) - r) + [float(m) for m in mask])[2:]
            total += float(-(logp * trained).sum())
            count += int(trained.sum())
    return total / count


@pytest.mark.parametrize("arch", list(TINY))
def test_grpo_step_trains_the_mtp_layer_with_the_independent_loss(ckpts, arch, tmp_path):
    from safetensors.torch import load_file

    ckpt = ckpts[arch]
    out = run_ranks(grpo_step_rank, 1, ckpt, MTP_FLAGS + ("--mtp-loss-scaling-factor", "0.2"))[0]
    reported = out["metrics"]["mtp_loss"]
    expected = independent_mtp_loss(ckpt, out["batch"], tmp_path)
    assert reported == pytest.approx(expected, rel=1e-5, abs=1e-6), (reported, expected)
    on_disk = load_file(os.path.join(ckpt, "model.safetensors"))
    assert sorted(out["before"]) == sorted(on_disk)  # the push carries the MTP layer (SGLang's drafts read it)
    # every MTP tensor moves, except the copies of the embedding / LM head (trained as the model's own), the experts
    # the step may route no token to, and the router's correction bias (a buffer: --moe-router-bias-update-rate 0)
    trained = [n for n in on_disk if _is_mtp(n, ckpt) and not n.endswith(("embed_tokens.weight", "head.weight"))
               and ".experts." not in n and not n.endswith("e_score_correction_bias")]
    moved = [n for n in trained if not torch.equal(out["before"][n], out["after"][n])]
    assert set(moved) == set(trained), sorted(set(trained) - set(moved))


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
