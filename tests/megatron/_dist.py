"""Multi-rank CPU test helper: run a module-level function in N spawned gloo processes.

    results = run_ranks(fn, 2, arg1, ...)   # fn(rank, world_size, port, arg1, ...) -> picklable result

Each child uses OMP_NUM_THREADS=1 and a fresh free port; a failing rank's traceback is raised here.
"""
import os
import sys

from slime_like.backends.megatron.parallel import free_port, run_local_ranks  # noqa: F401

os.environ.setdefault("OMP_NUM_THREADS", "1")
# spawned children import the test module by name: make this directory importable for them too
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def run_ranks(fn, world_size, *args, timeout=240.0):
    return run_local_ranks(fn, world_size, *args, timeout=timeout)


import pytest  # noqa: E402

# name -> build_tiny_checkpoint kwargs; init_std 0.1 so logits are far from zero and parity is meaningful
TINY = {
    "qwen2": dict(arch="qwen2", tie_embeddings=True),
    "qwen2_untied": dict(arch="qwen2", tie_embeddings=False),
    "qwen3": dict(arch="qwen3", tie_embeddings=True),
    "llama": dict(arch="llama", tie_embeddings=False),
    "qwen3_moe": dict(arch="qwen3_moe", tie_embeddings=True, num_experts=4, moe_topk=2),
    # GLM-4 dense: sandwich norms (random scales), interleaved partial RoPE, QKV bias, fused gate_up_proj
    "glm4": dict(arch="glm4", tie_embeddings=False),
    # GLM-4.5 style: dense layer 0, MoE layer 1 (sigmoid router + correction bias, 2 groups, shared expert), partial
    # RoPE, qk-norm, QKV bias
    "glm4_moe": dict(arch="glm4_moe", tie_embeddings=False, num_experts=4, moe_topk=2),
    # DeepSeek-V3 style: multi-latent attention (q and kv low rank, interleaved RoPE part) + the same MoE router
    "deepseek_v3": dict(arch="deepseek_v3", tie_embeddings=False, num_experts=4, moe_topk=2),
    "moonlight": dict(arch="moonlight", tie_embeddings=False, num_experts=4, moe_topk=2),  # MLA without q low rank
    # Kimi-K2: model_type kimi_k2 over DeepSeek-V3's architecture, YaRN RoPE (factor 4, beta_fast = beta_slow = 1,
    # mscale 1 vs mscale_all_dim 0.5)
    "kimi_k2": dict(arch="kimi_k2", tie_embeddings=False, num_experts=4, moe_topk=2),
    # MiniMax-M2: MoE in every layer (sigmoid router + correction bias, no groups / shared expert), one RMSNorm over
    # all query heads and one over all key heads (random scales), RoPE on half of each head
    "minimax_m2": dict(arch="minimax_m2", tie_embeddings=False, num_experts=4, moe_topk=2),
    # Qwen2-MoE: dense layer 0, MoE layer 1 (softmax router, top-k not renormalised, shared expert scaled by its
    # sigmoid gate), QKV bias, random norm scales
    "qwen2_moe": dict(arch="qwen2_moe", tie_embeddings=False, num_experts=4, moe_topk=2),
    # GLM-4.7-Flash: DeepSeek-V3's MLA + GLM-4.5's biased sigmoid router, dense / MoE layers from mlp_layer_types
    "glm4_moe_lite": dict(arch="glm4_moe_lite", tie_embeddings=False, num_experts=4, moe_topk=2),
    # MiMo: Qwen2 + one MTP layer (model.mtp_layers.0.* tensors), left out unless --enable-mtp-training (test_mtp.py)
    "mimo": dict(arch="mimo", tie_embeddings=False),
    # Qwen3-Next: gated delta net layer 0, gated full attention layer 1 (zero-centred norms, RoPE on a quarter of
    # each head), MoE with a gated shared expert; Qwen3.5 dense (tied) / MoE: the same layers in the
    # vision-language layout (text_config, model.language_model.*, a one-block vision tower)
    "qwen3_next": dict(arch="qwen3_next", tie_embeddings=False, num_experts=4, moe_topk=2),
    "qwen3_5": dict(arch="qwen3_5", tie_embeddings=True),
    "qwen3_5_moe": dict(arch="qwen3_5_moe", tie_embeddings=False, num_experts=4, moe_topk=2),
    # DeepSeek-V3.2 / GLM-5: DeepSeek-V3's layout plus a lightning indexer (index_topk 6 < most tests' lengths)
    "deepseek_v32": dict(arch="deepseek_v32", tie_embeddings=False, num_experts=4, moe_topk=2),
    "glm_moe_dsa": dict(arch="glm_moe_dsa", tie_embeddings=False, num_experts=4, moe_topk=2),
}


@pytest.fixture(scope="session")
def tiny_ckpts(tmp_path_factory):
    """{name: HF dir} of tiny random checkpoints (see TINY), built once per session."""
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("megatron_tiny")
    return {name: build_tiny_checkpoint(str(root / name), init_std=0.1, **kw) for name, kw in TINY.items()}
