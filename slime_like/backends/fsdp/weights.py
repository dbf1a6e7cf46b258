"""HF-named full weights out of the sharded FSDP model: for weight sync and --save-hf.

Every rank must iterate (each parameter is all-gathered with DTensor.full_tensor()); rank 0 yields.
Names are the HF checkpoint's: peft's `base_model.model.` prefix and `.base_layer` are dropped. With LoRA
the synced weights are merged, W + scaling * B @ A, computed on the gathered tensors (the sharded model
itself is never merged, so the adapters stay trainable and the reference stays the clean base).
Tied embeddings appear once (named_parameters de-duplicates), as the Megatron backend sends them.
"""
from __future__ import annotations

import json
import os
import shutil

import torch
import torch.distributed as dist

PEFT_PREFIX = "base_model.model."


def _full(p: torch.Tensor) -> torch.Tensor:
    p = p.detach()
    return p.full_tensor() if hasattr(p, "full_tensor") else p


def hf_name(name: str) -> str:
    if name.startswith(PEFT_PREFIX):
        name = name[len(PEFT_PREFIX):]
    return name.replace(".base_layer.", ".")


def _lora_delta(model, prefix: str, params: dict) -> torch.Tensor:
    layer = model.get_submodule(prefix)
    adapter = layer.active_adapters[0]
    a = _full(params[f"{prefix}.lora_A.{adapter}.weight"]).float()
    b = _full(params[f"{prefix}.lora_B.{adapter}.weight"]).float()
    delta = (b @ a) * layer.scaling[adapter]
    return delta.T if getattr(layer, "fan_in_fan_out", False) else delta


@torch.no_grad()
def iter_hf_weights(model, merged: bool = True, skip_prefixes: tuple[str, ...] = ()):
    """Yield (hf_name, full tensor) on rank 0; `merged`: base weights with the LoRA update folded in. Parameters
    whose model name starts with one of `skip_prefixes` (a frozen vision tower) are not gathered."""
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    params = dict(model.named_parameters())
    for name, p in params.items():
        if ".lora_A." in name or ".lora_B." in name or ".original_module." in name or name.startswith(skip_prefixes):
            continue
        full = _full(p)
        if merged and name.endswith(".base_layer.weight"):
            full = (full.float() + _lora_delta(model, name[:-len(".base_layer.weight")], params)).to(full.dtype)
        if rank0:
            yield hf_name(name).replace(".modules_to_save.default.", "."), full


def _copy_hf_side_files(template_dir: str, out_dir: str):
    for f in os.listdir(template_dir):  # config, generation config, tokenizer files
        if f.endswith((".json", ".jinja", ".txt", ".model", ".tiktoken")) and not f.startswith("model.safetensors"):
            shutil.copy(os.path.join(template_dir, f), os.path.join(out_dir, f))


def _write_model(tensors: dict, out_dir: str, template_dir: str):
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    _copy_hf_side_files(template_dir, out_dir)


def save_hf(trainer, out_dir: str):
    """Collective. Full fine-tune: a plain HF directory. LoRA: the peft adapter (adapter_model.safetensors +
    adapter_config.json, loadable with PeftModel.from_pretrained) and, with --lora-save-merged, the merged
    model in out_dir/merged. Written to out_dir.tmp and renamed when complete."""
    model, args = trainer.model, trainer.args
    cfg = json.load(open(os.path.join(args.hf_checkpoint, "config.json")))
    dtype = getattr(torch, cfg.get("dtype") or cfg.get("torch_dtype") or "float32")
    tmp = out_dir.rstrip("/") + ".tmp"
    rank0 = dist.get_rank() == 0
    if rank0 and os.path.exists(tmp):
        shutil.rmtree(tmp)
    if trainer.lora:
        from peft import get_peft_model_state_dict

        full = {n: _full(p) for n, p in model.named_parameters() if p.requires_grad}  # collective
        if rank0:
            from safetensors.torch import save_file

            os.makedirs(tmp)
            adapter = {k: v.contiguous() for k, v in get_peft_model_state_dict(model, state_dict=full).items()}
            save_file(adapter, os.path.join(tmp, "adapter_model.safetensors"), metadata={"format": "pt"})
            model.peft_config["default"].save_pretrained(tmp)
    if not trainer.lora or args.lora_save_merged:
        tensors = {n: t.to(dtype=dtype, copy=True).contiguous() for n, t in iter_hf_weights(model, merged=True)}
        if rank0:
            _write_model(tensors, os.path.join(tmp, "merged") if trainer.lora else tmp, args.hf_checkpoint)
    if rank0:
        if os.path.exists(out_dir):
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    dist.barrier()
    return out_dir
