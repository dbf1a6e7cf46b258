"""The conversion tools, run as a user runs them: HF -> Megatron torch_dist (TP=2 / PP=2) -> HF gives
bit-identical tensors, and the result loads in transformers with the original's logits."""
import json
import os
import subprocess
import sys

import pytest
import torch
from _dist import tiny_ckpts  # noqa: F401  (fixture)
from safetensors.torch import load_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_tool(name, *argv):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", name), *map(str, argv)],
                          capture_output=True, text=True, timeout=600, env=env)


def hf_tensors(d):
    """All tensors of an HF dir (single file or index-sharded)."""
    index = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    out = {}
    for f in files:
        out.update(load_file(os.path.join(d, f)))
    return out


def round_trip(hf_dir, tmp_path, to_mc, to_hf):
    mc, back = tmp_path / "mcore", tmp_path / "hf_back"
    r = run_tool("convert_hf_to_megatron.py", "--hf-checkpoint", hf_dir, "--save", mc, *to_mc)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (mc / "latest_checkpointed_iteration.txt").read_text() == "0"
    r = run_tool("convert_megatron_to_hf.py", "--load", mc, "--hf-checkpoint", hf_dir, "--save-hf", back, *to_hf)
    assert r.returncode == 0, r.stderr[-3000:]
    return mc, back


def assert_identical_and_loads(hf_dir, back):
    orig, new = hf_tensors(hf_dir), hf_tensors(back)
    assert sorted(orig) == sorted(new)
    for k in orig:
        assert orig[k].dtype == new[k].dtype and torch.equal(orig[k], new[k]), k
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (back / f).exists(), f
    import transformers

    ids = torch.randint(2, 100, (1, 10), generator=torch.Generator().manual_seed(0))
    a = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    b = transformers.AutoModelForCausalLM.from_pretrained(str(back), dtype=torch.float32).eval()
    with torch.no_grad():
        assert torch.equal(a(ids).logits, b(ids).logits)


@pytest.mark.slow
def test_round_trip_tp2_qwen2_tied(tiny_ckpts, tmp_path):
    mc, back = round_trip(tiny_ckpts["qwen2"], tmp_path, ["--tensor-model-parallel-size", 2], [])
    assert len([f for f in os.listdir(mc / "iter_0000000") if f.endswith(".distcp")]) == 2 * 2  # 2 ranks
    assert_identical_and_loads(tiny_ckpts["qwen2"], back)


@pytest.mark.slow
def test_round_trip_pp2_qwen3_moe_sharded_export(tiny_ckpts, tmp_path):
    # saved at PP=2, exported at PP=2: one safetensors file per stage + model.safetensors.index.json
    _, back = round_trip(tiny_ckpts["qwen3_moe"], tmp_path, ["--pipeline-model-parallel-size", 2],
                         ["--pipeline-model-parallel-size", 2])
    assert (back / "model.safetensors.index.json").exists()
    assert_identical_and_loads(tiny_ckpts["qwen3_moe"], back)


@pytest.mark.slow
def test_round_trip_tp2_glm4_moe(tiny_ckpts, tmp_path):
    # GLM-4.5 style: shared experts split over TP, the routers' correction bias (a buffer) saved and exported
    _, back = round_trip(tiny_ckpts["glm4_moe"], tmp_path, ["--tensor-model-parallel-size", 2], [])
    assert "model.layers.1.mlp.gate.e_score_correction_bias" in hf_tensors(back)
    assert_identical_and_loads(tiny_ckpts["glm4_moe"], back)


@pytest.mark.slow
def test_round_trip_pp2_deepseek_v3(tiny_ckpts, tmp_path):
    # multi-latent attention: saved at PP=2 (layer 0 dense, layer 1 MoE), exported at TP=2
    _, back = round_trip(tiny_ckpts["deepseek_v3"], tmp_path, ["--pipeline-model-parallel-size", 2],
                         ["--tensor-model-parallel-size", 2])
    assert "model.layers.0.self_attn.kv_a_proj_with_mqa.weight" in hf_tensors(back)
    assert_identical_and_loads(tiny_ckpts["deepseek_v3"], back)


def test_bad_input_fails_before_spawning(tiny_ckpts, tmp_path):
    r = run_tool("convert_hf_to_megatron.py", "--hf-checkpoint", tiny_ckpts["qwen2"])
    assert r.returncode != 0 and "--save OUT are required" in r.stderr
    # 2 KV groups cannot split over TP=4
    r = run_tool("convert_hf_to_megatron.py", "--hf-checkpoint", tiny_ckpts["qwen2"], "--save", tmp_path / "x",
                 "--tensor-model-parallel-size", 4)
    assert r.returncode != 0 and "--num-query-groups 2 not divisible by TP 4" in r.stderr
    r = run_tool("convert_megatron_to_hf.py", "--load", tmp_path, "--hf-checkpoint", tiny_ckpts["qwen2"],
                 "--save-hf", tmp_path / "y")
    assert r.returncode != 0 and "not a Megatron checkpoint directory" in r.stderr
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


@pytest.mark.slow
def test_round_trip_glm4_dense_tp2_to_pp2(tiny_ckpts, tmp_path):
    # GLM-4 dense: the fused gate_up_proj split per TP rank as [gate_r; up_r], sandwich norms; saved at TP=2, read
    # back at PP=2 (each stage exports its own layers into one file of the index)
    _, back = round_trip(tiny_ckpts["glm4"], tmp_path, ["--tensor-model-parallel-size", 2],
                         ["--pipeline-model-parallel-size", 2])
    assert "model.layers.1.post_mlp_layernorm.weight" in hf_tensors(back)
    assert_identical_and_loads(tiny_ckpts["glm4"], back)


@pytest.mark.slow
def test_round_trip_tp2_minimax_m2(tiny_ckpts, tmp_path):
    # MiniMax-M2: full-width q / k norms replicated over TP, Mixtral-style expert names, the routers' correction bias
    _, back = round_trip(tiny_ckpts["minimax_m2"], tmp_path, ["--tensor-model-parallel-size", 2], [])
    assert "model.layers.1.block_sparse_moe.experts.3.w3.weight" in hf_tensors(back)
    assert_identical_and_loads(tiny_ckpts["minimax_m2"], back)


@pytest.mark.slow
def test_round_trip_tp2_to_pp2_qwen2_moe(tiny_ckpts, tmp_path):
    # Qwen2-MoE: the shared expert (singular HF names) split over TP and its [1, hidden] sigmoid gate replicated;
    # saved at TP=2, exported at PP=2
    _, back = round_trip(tiny_ckpts["qwen2_moe"], tmp_path, ["--tensor-model-parallel-size", 2],
                         ["--pipeline-model-parallel-size", 2])
    assert "model.layers.1.mlp.shared_expert_gate.weight" in hf_tensors(back)
    assert_identical_and_loads(tiny_ckpts["qwen2_moe"], back)


@pytest.mark.slow
def test_round_trip_pp2_glm4_moe_lite(tiny_ckpts, tmp_path):
    # GLM-4.7-Flash: MLA + biased router, layer 0 dense and layer 1 MoE from mlp_layer_types; PP=2 -> TP=2
    _, back = round_trip(tiny_ckpts["glm4_moe_lite"], tmp_path, ["--pipeline-model-parallel-size", 2],
                         ["--tensor-model-parallel-size", 2])
    assert "model.layers.1.mlp.gate.e_score_correction_bias" in hf_tensors(back)
    assert_identical_and_loads(tiny_ckpts["glm4_moe_lite"], back)


@pytest.mark.slow
def test_round_trip_tp2_mimo_drops_mtp(tiny_ckpts, tmp_path):
    # MiMo: the Qwen2 main model round-trips bit-identical; the MTP layer is neither loaded nor exported, with a
    # warning (transformers has no mimo model type, so no transformers load here: test_model_parity checks the logits
    # against transformers' qwen2)
    hf_dir = tiny_ckpts["mimo"]
    mc, back = tmp_path / "mcore", tmp_path / "hf_back"
    r = run_tool("convert_hf_to_megatron.py", "--hf-checkpoint", hf_dir, "--save", mc, "--tensor-model-parallel-size", 2)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "multi-token-prediction layer(s)" in r.stderr + r.stdout
    r = run_tool("convert_megatron_to_hf.py", "--load", mc, "--hf-checkpoint", hf_dir, "--save-hf", back)
    assert r.returncode == 0, r.stderr[-3000:]
    orig, new = hf_tensors(hf_dir), hf_tensors(back)
    main = {k: v for k, v in orig.items() if ".mtp_layers." not in k}
    assert len(main) < len(orig) and sorted(main) == sorted(new)
    assert all(torch.equal(main[k], new[k]) for k in main)
    assert json.load(open(back / "config.json"))["model_type"] == "mimo"


@pytest.mark.slow
@pytest.mark.parametrize("arch, to_mc, to_hf", [
    ("qwen3_next", ["--tensor-model-parallel-size", 2], ["--pipeline-model-parallel-size", 2]),
    ("qwen3_5", ["--pipeline-model-parallel-size", 2], ["--tensor-model-parallel-size", 2]),
    ("qwen3_5_moe", ["--tensor-model-parallel-size", 2], [])])
def test_round_trip_linear_attention(tiny_ckpts, tmp_path, arch, to_mc, to_hf):
    # Qwen3-Next / Qwen3.5: gated delta net tensors (in_proj and conv1d saved per section, so TP2 -> PP2 / TP1
    # reshard), gated attention, zero-centred norms; Qwen3.5's vision-language layout (model.language_model.*) with
    # its vision tower copied from the template
    _, back = round_trip(tiny_ckpts[arch], tmp_path, to_mc, to_hf)
    names = hf_tensors(back)
    assert any(".linear_attn.conv1d.weight" in n for n in names)
    if arch != "qwen3_next":
        assert any(n.startswith("model.visual.") for n in names)
    assert_identical_and_loads(tiny_ckpts[arch], back)


@pytest.mark.slow
def test_round_trip_pp2_glm_moe_dsa_keeps_the_indexer(tiny_ckpts, tmp_path):
    # GLM-5: the lightning indexer's tensors are built (frozen, replicated over TP), saved in the torch_dist
    # checkpoint at PP 2 and exported at TP 2: the round trip is bit-identical
    _, back = round_trip(tiny_ckpts["glm_moe_dsa"], tmp_path, ["--pipeline-model-parallel-size", 2],
                         ["--tensor-model-parallel-size", 2])
    assert any(".self_attn.indexer." in n for n in hf_tensors(back))
    assert_identical_and_loads(tiny_ckpts["glm_moe_dsa"], back)
