"""mcore GPTModel loaded from an HF checkpoint gives transformers' logits (fp32, max abs diff < 1e-5),
and iter_hf_weights gives back every HF tensor bit-identical.

Each topology runs in spawned gloo ranks (real megatron-core, CPU patches): TP=1, TP=2, PP=2, and EP=2 for
MoE. Every run covers qwen2 (tied and untied), qwen3 (tied), llama (untied), qwen3_moe (tied, local MoE layer), glm4
(GLM-4 dense, untied: sandwich norms with random scales, half of each head rotated as interleaved pairs, QKV bias, fused
gate_up_proj), glm4_moe (GLM-4.5 style, untied: dense then MoE layer, sigmoid router with correction bias and 2 expert groups,
shared expert, partial RoPE, qk-norm, QKV bias) and deepseek_v3 (multi-latent attention with low-rank q and kv,
interleaved RoPE part, then the same MoE as glm4_moe) and kimi_k2 (model_type kimi_k2: DeepSeek-V3's architecture
with YaRN RoPE, beta_fast / beta_slow from config.json, cos/sin and softmax scales != 1; its reference is transformers'
deepseek_v3 on the same weights, since transformers has no kimi_k2) and minimax_m2 (MoE in every layer with the
biased sigmoid router, one RMSNorm over all query heads and one over all key heads -- gathered over TP --, RoPE on half
of each head, Mixtral-style block_sparse_moe / w1 w2 w3 names) and qwen2_moe (dense then MoE layer, softmax router
without top-k renormalisation, one shared expert scaled by its sigmoid gate) and glm4_moe_lite (GLM-4.7-Flash:
deepseek_v3's layout, dense / MoE layers from mlp_layer_types) and mimo (Qwen2 + an MTP layer the trainer neither loads
nor exports; its reference is transformers' qwen2 on the same weights, since transformers has no mimo) and
qwen3_next (a gated delta net layer and a gated full-attention layer with zero-centred norms, MoE with a gated shared
expert) and qwen3_5 / qwen3_5_moe (the same layers, dense tied / MoE, in Qwen3.5's vision-language layout: its
reference is transformers' text model loaded from the same directory) and deepseek_v32 / glm_moe_dsa (DeepSeek-V3.2 /
GLM-5: DeepSeek-V3's layout whose lightning indexer keeps index_topk 16 >= 12 keys, so transformers' sparse attention is
the dense one the trainer builds; the indexer tensors are neither loaded nor exported by the trainer).
"""
import json
import shutil
import os
import subprocess
import warnings

import pytest
import torch
from _dist import run_ranks, tiny_ckpts  # noqa: F401  (tiny_ckpts is a fixture)

ARCHS = ["qwen2", "qwen2_untied", "qwen3", "llama", "qwen3_moe", "glm4", "glm4_moe", "deepseek_v3", "kimi_k2",
         "minimax_m2", "qwen2_moe", "glm4_moe_lite", "mimo", "qwen3_next", "qwen3_5", "qwen3_5_moe", "deepseek_v32",
         "glm_moe_dsa"]
# model_type -> the transformers model_type of the same architecture, for types transformers does not have
# (their modeling code is remote code upstream): Kimi-K2 is DeepSeek-V3's, MiMo's main model is Qwen2's
REFERENCE_TYPE = {"kimi_k2": "deepseek_v3", "mimo": "qwen2"}


def forward_logits(chunks, ids):
    """Full-vocab logits on the last PP stage (None elsewhere), via mcore's pipeline schedule."""
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    def step(data_iter, model):
        batch = next(data_iter)
        out = model(batch, torch.arange(batch.shape[1]).expand_as(batch), attention_mask=None)
        return out, lambda o: (o.sum() * 0, {"logits": o.detach()})

    with torch.no_grad():
        res = get_forward_backward_func()(forward_step_func=step, data_iterator=iter([ids]), model=chunks,
                                          num_microbatches=1, seq_length=ids.shape[1],
                                          micro_batch_size=ids.shape[0], forward_only=True)
    if not ps.is_pipeline_last_stage():
        return None
    local = res[0]["logits"]
    tp = ps.get_tensor_model_parallel_world_size()
    parts = [torch.empty_like(local) for _ in range(tp)]
    torch.distributed.all_gather(parts, local, group=ps.get_tensor_model_parallel_group())
    return torch.cat(parts, dim=-1)


def tiny_qwen2_argv(hf_dir, tp, pp):
    """MODEL_ARGS of scripts/models/tiny-qwen2.sh (sourced by bash) + the few flags parse_args requires."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run(["bash", "-c", 'source scripts/models/tiny-qwen2.sh && printf "%s\\n" "${MODEL_ARGS[@]}"'],
                         cwd=root, capture_output=True, text=True, check=True).stdout.split()
    return out + ["--hf-checkpoint", hf_dir, "--rollout-batch-size", "2", "--num-rollout", "1", "--colocate",
                  "--actor-num-gpus-per-node", str(tp * pp), "--tensor-model-parallel-size", str(tp),
                  "--pipeline-model-parallel-size", str(pp), "--attention-dropout", "0.0", "--hidden-dropout", "0.0"]


def hf_reference_dir(path):
    """The checkpoint transformers loads as the reference: a model_type transformers lacks (REFERENCE_TYPE) as the
    transformers model_type of its architecture."""
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    if cfg["model_type"] not in REFERENCE_TYPE:
        return path
    as_type = REFERENCE_TYPE[cfg["model_type"]]
    ref = path.rstrip("/") + "_as_" + as_type
    if not os.path.isdir(ref):
        tmp = f"{ref}.{os.getpid()}"
        shutil.copytree(path, tmp)
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(dict(cfg, model_type=as_type, architectures=None), f)
        try:
            os.rename(tmp, ref)
        except OSError:  # another rank renamed its copy first
            shutil.rmtree(tmp)
    return ref


def parity_rank(rank, world, port, ckpts, tp, pp, ep, archs):
    warnings.filterwarnings("ignore")
    import transformers

    from slime_like.args import make_args
    from slime_like.backends.megatron import hf_weights, model, parallel
    from slime_like.config.hf_config import fill_args_from_hf

    parallel.init_distributed(rank, world, master_port=port, tp=tp, pp=pp, ep=ep)
    ids = torch.randint(2, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    from safetensors.torch import load_file

    diffs, exports = {}, {}
    for name in archs:
        arch = "qwen2" if name == "qwen2_parsed" else name
        if name == "qwen2_parsed":  # the real CLI path: scripts/models/tiny-qwen2.sh MODEL_ARGS via parse_args
            from slime_like.args import parse_args

            args = parse_args(tiny_qwen2_argv(ckpts["qwen2"], tp, pp), exit_on_error=False)
        else:
            args = fill_args_from_hf(make_args("--hf-checkpoint", ckpts[arch]), ckpts[arch])
            args.tensor_model_parallel_size, args.pipeline_model_parallel_size = tp, pp
            args.expert_model_parallel_size = ep
        chunks = model.build_model(args)
        hf_weights.load_hf_weights(chunks, ckpts[arch], args)
        for c in chunks:
            c.eval()
        # export side: this rank's HF tensors (TP-gathered; PP stages emit their own layers) vs the file
        ref_sd = load_file(os.path.join(ckpts[arch], "model.safetensors"))
        exported = {n: (t - ref_sd[n]).abs().max().item() for n, t in hf_weights.iter_hf_weights(chunks, args)}
        # MTP layers (MiMo's model.mtp_layers.*) and Qwen3.5's vision tower (model.visual.*) are not built, so not
        # exported by the trainer (export_hf copies the vision tower from the template: test_convert.py)
        exports[name] = dict(exported=exported, expected=sorted(n for n in ref_sd if ".mtp_layers." not in n
                                                                and not n.startswith("model.visual.")))
        logits = forward_logits(chunks, ids)
        if logits is None:
            continue
        hf = transformers.AutoModelForCausalLM.from_pretrained(hf_reference_dir(ckpts[arch]), dtype=torch.float32).eval()
        with torch.no_grad():
            ref = hf(ids).logits
        vocab = ref.shape[-1]
        # padded vocab columns (Megatron's make_vocab_size_divisible_by * TP) are masked to PADDED_LOGIT,
        # so the softmax over the padded vocab equals HF's: compare log-probs over the whole width too
        padded = logits[..., vocab:]
        logp_diff = (torch.log_softmax(logits, -1)[..., :vocab] - torch.log_softmax(ref, -1)).abs().max().item()
        diffs[name] = dict(diff=(logits[..., :vocab] - ref).abs().max().item(), ref_std=ref.std().item(),
                           logp_diff=logp_diff, padded_cols=padded.shape[-1],
                           padded_ok=bool((padded == model.PADDED_LOGIT).all()))
    return diffs, exports


def _check(results, n_archs):
    merged = {}
    for r, _ in results:
        merged.update(r)
    for name in {n for _, e in results for n in e}:  # exported tensors: all of them, bit-identical
        exported = {}
        for _, e in results:
            exported.update(e[name]["exported"])
        assert sorted(exported) == results[0][1][name]["expected"], name
        assert max(exported.values()) == 0.0, (name, exported)
    assert len(merged) == n_archs, merged
    for arch, d in merged.items():
        assert d["ref_std"] > 0.05, (arch, d)  # logits are not trivially small
        assert d["diff"] < 1e-5, (arch, d)
        assert d["logp_diff"] < 1e-5 and d["padded_ok"], (arch, d)
    return merged


@pytest.mark.slow
def test_parity_tp1(tiny_ckpts):
    _check(run_ranks(parity_rank, 1, tiny_ckpts, 1, 1, 1, ARCHS), len(ARCHS))


@pytest.mark.slow
def test_parity_tp2(tiny_ckpts):
    # + "qwen2_parsed": scripts/models/tiny-qwen2.sh MODEL_ARGS through parse_args (the CLI path); + "moonlight":
    # MLA without the q low rank (linear_q_proj split over TP), one expert group, two shared experts
    archs = ARCHS + ["qwen2_parsed", "moonlight"]
    merged = _check(run_ranks(parity_rank, 2, tiny_ckpts, 2, 1, 1, archs), len(archs))
    # vocab 128 is padded to a multiple of 128 * TP = 256: the padding path is exercised
    assert all(d["padded_cols"] == 128 for d in merged.values())


@pytest.mark.slow
def test_parity_pp2(tiny_ckpts):
    _check(run_ranks(parity_rank, 2, tiny_ckpts, 1, 2, 1, ARCHS), len(ARCHS))


@pytest.mark.slow
def test_parity_moe_ep2(tiny_ckpts):
    # EP=2 over 2 data-parallel ranks: each rank holds 2 of the 4 experts; both ranks check their logits
    moe = ["qwen3_moe", "glm4_moe", "deepseek_v3", "kimi_k2", "minimax_m2", "qwen2_moe", "glm4_moe_lite", "qwen3_next",
           "qwen3_5_moe", "glm_moe_dsa"]
    results = run_ranks(parity_rank, 2, tiny_ckpts, 1, 1, 2, moe)
    _check(results, len(moe))
    for diffs, _ in results:
        assert all(diffs[a]["diff"] < 1e-5 for a in moe), diffs
