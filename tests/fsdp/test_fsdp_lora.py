"""LoRA on the FSDP trainer: adapters only in the optimizer, the reference is the base with adapters disabled,
weight sync exports merged weights, --save-hf writes a peft adapter (+ merged model), checkpoints hold adapters."""
import os

import pytest
import torch
from _fsdp_common import flat, hf_log_probs, make_args, make_batch, run_ranks

pytestmark = pytest.mark.slow
FLAGS = ["--lr", "1e-3", "--micro-batch-size", "2", "--global-batch-size", "8"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    return build_tiny_checkpoint(str(tmp_path_factory.mktemp("fsdp_ckpt_tiny")), init_std=0.1)


def _trainer(ckpt, rank, world_size, port, *flags):
    from slime_like.backends.fsdp.trainer import FSDPTrainer

    return FSDPTrainer(make_args(ckpt, *FLAGS, *flags), "actor", rank, world_size, master_port=port)


def lora_rank(rank, world_size, port, ckpt, out):
    import peft
    from transformers import AutoModelForCausalLM

    t = _trainer(ckpt, rank, world_size, port, "--lora-rank", "4", "--lora-alpha", "8", "--lr", "1e-2",
                 "--use-kl-loss", "--kl-loss-coef", "0.01", "--save-hf", out + "/hf_{rollout_id}", "--lora-save-merged",
                 "--save", out + "/ckpt")
    optimized = [p for g in t.optimizer.param_groups for p in g["params"]]
    trainable = [n for n, p in t.model.named_parameters() if p.requires_grad]
    total = sum(p.numel() for p in t.model.parameters())
    batch = make_batch(8)
    start = t.compute_log_probs(batch)
    batch.update(start)
    batch.update(t.compute_advantages(batch))
    t.train_step(0, batch)
    after = t.compute_log_probs(make_batch(8))
    merged = {n: w.clone() for n, w in t.iter_hf_weights()}
    t.save(0)
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    model.load_state_dict(merged, strict=False)  # tied lm_head follows embed_tokens
    adapter = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32),
                                             out + "/hf_0").eval()
    exported = AutoModelForCausalLM.from_pretrained(out + "/hf_0/merged", dtype=torch.float32)
    return dict(optimized=sum(p.numel() for p in optimized), trainable=trainable, total=total, start=start,
                after=after, merged_model=_lp(model), peft_adapter=_lp(adapter), merged_dir=_lp(exported))


def _lp(model):
    """Response log-probs of make_batch(8) under an unsharded HF / peft model."""
    model.eval()
    out = []
    with torch.no_grad():
        for toks, r in zip(make_batch(8)["tokens"], make_batch(8)["response_lengths"]):
            logits = model(input_ids=torch.tensor([toks])).logits[0].float()
            lp = torch.log_softmax(logits[len(toks) - r - 1:len(toks) - 1], -1)
            out.append(lp.gather(-1, torch.tensor(toks[len(toks) - r:])[:, None])[:, 0])
    return out


def test_lora_trains_adapters_only_and_exports_merged_weights(ckpt, tmp_path):
    r = run_ranks(lora_rank, 1, ckpt, str(tmp_path))[0]
    assert r["trainable"] and all(".lora_A." in n or ".lora_B." in n for n in r["trainable"])
    assert r["optimized"] < 0.2 * r["total"]
    base = flat(hf_log_probs(ckpt, make_batch(8)))
    # B starts at 0: the adapted model is the base; the reference (adapters disabled) stays the base after a step
    assert (flat(r["start"]["log_probs"]) - base).abs().max().item() < 1e-5
    assert (flat(r["after"]["ref_log_probs"]) - base).abs().max().item() < 1e-5
    assert (flat(r["after"]["log_probs"]) - base).abs().max().item() > 1e-3  # the adapters learned something
    for key in ("merged_model", "peft_adapter", "merged_dir"):  # sync weights, --save-hf adapter, merged export
        assert (flat(r[key]) - flat(r["after"]["log_probs"])).abs().max().item() < 1e-5, key
    assert os.path.isfile(tmp_path / "hf_0" / "adapter_config.json")
    from torch.distributed.checkpoint import FileSystemReader

    keys = FileSystemReader(str(tmp_path / "ckpt" / "iter_0000000")).read_metadata().state_dict_metadata
    model_keys = [k for k in keys if k.startswith("model.")]
    assert model_keys and all(".lora_A." in k or ".lora_B." in k for k in model_keys)  # adapters, not the base
