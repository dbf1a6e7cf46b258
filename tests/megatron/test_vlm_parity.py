"""Vision-language models in megatron-core (backends/megatron/vision.py): a tiny random Qwen2.5-VL and Qwen3-VL loaded
from their HF checkpoints give transformers' logits (fp32, < 1e-5) for samples with images (two images of different
grids, one image, none), in padded rows and in one packed row, at TP=1 and TP=2 (the vision tower replicated);
iter_hf_weights gives back every HF tensor bit-identical (the push names are transformers 5's in-memory names); the
conversion tools round-trip HF -> Megatron torch_dist -> HF bit-identically, in the checkpoint's own layout."""
import os
import subprocess
import sys
import warnings

import pytest
import torch
from _dist import run_ranks
from _vlm import build_tiny_vlm, hf_logits, sample, token_ids

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAMILIES = ["qwen2_5_vl", "qwen3_vl"]


@pytest.fixture(scope="module")
def vlm_ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_vlm")
    return {f: build_tiny_vlm(root / f, f, tie=f == "qwen3_vl") for f in FAMILIES}  # untied and tied


def samples(ckpt):
    return [sample(ckpt, [(1, 8, 8), (1, 4, 6)], 5, 7, seed=0),   # two images: 16 and 6 tokens
            sample(ckpt, [(1, 4, 4)], 3, 9, seed=1),                # one image
            (list(range(3, 20)), None)]                             # text only


def parity_rank(rank, world, port, ckpts, tp):
    warnings.filterwarnings("ignore")
    from safetensors.torch import load_file

    from slime_like.args import make_args
    from slime_like.backends.megatron import hf_names, hf_weights, model, parallel
    from slime_like.backends.training.data import multimodal_inputs
    from slime_like.backends.training.micro_batch import block_causal_mask
    from slime_like.config.hf_config import fill_args_from_hf

    parallel.init_distributed(rank, world, master_port=port, tp=tp)
    out = {}
    for family, hf_dir in ckpts.items():
        args = fill_args_from_hf(make_args("--hf-checkpoint", hf_dir), hf_dir)
        args.tensor_model_parallel_size = tp
        (chunk,) = model.build_model(args)
        hf_weights.load_hf_weights([chunk], hf_dir, args)
        chunk.eval()
        data = samples(hf_dir)
        batch = {"multimodal_train_inputs": [mm for _, mm in data]}
        mm = multimodal_inputs(batch, list(range(len(data))))
        lens = [len(ids) for ids, _ in data]
        width = max(lens)
        padded = torch.tensor([ids + [0] * (width - len(ids)) for ids, _ in data])
        packed = torch.tensor([sum((ids for ids, _ in data), [])])
        packed_pos = torch.cat([torch.arange(n) for n in lens])[None]
        with torch.no_grad():
            rows = chunk(padded, torch.arange(width).expand(len(data), -1), None, multimodal=mm)
            one = chunk(packed, packed_pos, block_causal_mask(lens), multimodal=mm)
        rows, one = (_gather_vocab(x) for x in (rows, one))
        starts = torch.tensor([0] + lens[:-1]).cumsum(0).tolist()
        diffs = []
        for k, (ids, sample_mm) in enumerate(data):
            ref = hf_logits(hf_dir, ids, sample_mm)
            vocab = ref.shape[-1]
            diffs.append(((rows[k, :lens[k], :vocab] - ref).abs().max().item(),
                          (one[0, starts[k]:starts[k] + lens[k], :vocab] - ref).abs().max().item(),
                          ref.std().item()))
        # a different image changes the image tokens' and the later tokens' logits
        other = dict(mm, pixel_values=mm["pixel_values"] + 1.0)
        with torch.no_grad():
            changed = _gather_vocab(chunk(padded, torch.arange(width).expand(len(data), -1), None, multimodal=other))
        file = load_file(os.path.join(hf_dir, "model.safetensors"))
        exported = {n: t for n, t in hf_weights.iter_hf_weights([chunk], args)}
        legacy = {hf_names.vlm_legacy_name(n): n for n in exported}
        export_ok = rank != 0 or (sorted(legacy) == sorted(file) or sorted(exported) == sorted(file))
        same = all(torch.equal(exported[legacy.get(n, n)], t) for n, t in file.items()) if rank == 0 else True
        out[family] = dict(diffs=diffs, changed=(changed[0] - rows[0]).abs().max().item(),
                           text_same=(changed[2] - rows[2]).abs().max().item(), export_ok=export_ok, same=same,
                           visual=sum(n.startswith("model.visual.") for n in exported) if rank == 0 else None,
                           file_visual=sum(k.startswith(("model.visual.", "visual.")) for k in file))
    return out


def _gather_vocab(local):
    from megatron.core import parallel_state as ps

    tp = ps.get_tensor_model_parallel_world_size()
    parts = [torch.empty_like(local) for _ in range(tp)]
    torch.distributed.all_gather(parts, local.contiguous(), group=ps.get_tensor_model_parallel_group())
    return torch.cat(parts, dim=-1)


def _check(results):
    for res in results:
        for family, r in res.items():
            for padded, packed, std in r["diffs"]:
                assert std > 0.05, (family, r)
                assert padded < 1e-5 and packed < 1e-5, (family, r["diffs"])
            assert r["changed"] > 1e-3 and r["text_same"] == 0.0, (family, r)
            assert r["export_ok"] and r["same"] and r["visual"] in (None, r["file_visual"]), (family, r)
            assert r["file_visual"] > 20, r  # every tower tensor


@pytest.mark.slow
def test_vlm_parity_tp1(vlm_ckpts):
    _check(run_ranks(parity_rank, 1, vlm_ckpts, 1, timeout=600))


@pytest.mark.slow
def test_vlm_parity_tp2(vlm_ckpts):
    _check(run_ranks(parity_rank, 2, vlm_ckpts, 2, timeout=600))


def run_tool(name, *argv):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", name), *map(str, argv)],
                          capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_vlm_convert_round_trip(vlm_ckpts, tmp_path, family):
    from safetensors.torch import load_file

    hf_dir = vlm_ckpts[family]
    mc, back = tmp_path / "mcore", tmp_path / "hf_back"
    r = run_tool("convert_hf_to_megatron.py", "--hf-checkpoint", hf_dir, "--save", mc,
                 "--tensor-model-parallel-size", 2)
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_tool("convert_megatron_to_hf.py", "--load", mc, "--hf-checkpoint", hf_dir, "--save-hf", back)
    assert r.returncode == 0, r.stderr[-3000:]
    orig, new = load_file(os.path.join(hf_dir, "model.safetensors")), load_file(os.path.join(back, "model.safetensors"))
    assert sorted(orig) == sorted(new)  # the checkpoint's own layout (Qwen2.5-VL: model.layers.* / visual.*)
    assert all(torch.equal(orig[k], new[k]) for k in orig)
    ids, mm = sample(hf_dir, [(1, 4, 4)], 3, 4, seed=2)
    assert token_ids(hf_dir)["image"] in ids
    assert torch.equal(hf_logits(hf_dir, ids, mm), hf_logits(str(back), ids, mm))
