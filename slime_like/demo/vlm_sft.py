"""SFT warm-up and held-out evaluation for the visual demo (shapes.py), with plain transformers and PyTorch.

Why warm up: from random weights every sampled answer is wrong and GRPO has nothing to learn from; the warm-up
stops at the first held-out eval at or above a low target (default 25 %), so RL starts from a weak but
nonzero policy and does the rest. The loss covers only the answer and the end of turn.

The prompt ids are the chat template's, with the image placeholder expanded to one `<|image_pad|>` per image
token, as the HF processor writes them; the rollout encodes prompts the same way (Sample.tokens).
"""
from __future__ import annotations

import os
import random
import time

from slime_like.demo.shapes import END_OF_TURN, MAX_NEW_TOKENS, MULTIMODAL_KEYS, read_jsonl


class VlmCodec:
    """A checkpoint's VisionProcessor (slime_like.multimodal: the rollout's own prompt encoding) and the ids the
    demo needs: every record goes through the same record_images -> chat template -> encode_prompt path as the
    data source and the rollout, so the warm-up trains on exactly the ids and pixels RL will see."""

    def __init__(self, ckpt: str):
        from slime_like.multimodal.processor import load_processor

        self.processor = load_processor(ckpt)
        self.tokenizer = self.processor.tokenizer
        self.pad_id = self.tokenizer.pad_token_id
        self.eos_id = self.tokenizer.convert_tokens_to_ids(END_OF_TURN)

    def encode(self, record: dict, base_dir: str):
        """(prompt ids with the image tokens expanded, {"pixel_values", "image_grid_thw"}) of one record."""
        from slime_like.multimodal.processor import encode_prompt
        from slime_like.multimodal.records import record_images

        messages, images = record_images(record, MULTIMODAL_KEYS, "prompt", where="demo record", base_dir=base_dir)
        encoded = encode_prompt(self.processor, self.processor.apply_chat_template(messages), images)
        return encoded.token_ids, encoded.multimodal_train_inputs

    def answer_ids(self, label: str) -> list[int]:
        return self.tokenizer.encode(str(label), add_special_tokens=False) + [self.eos_id]


def make_batch(codec: VlmCodec, records: list[dict], base_dir: str, with_answers: bool = True) -> dict:
    """HF VLM inputs for records (the task's prompts all have one length, so no padding is needed)."""
    import torch

    from slime_like.multimodal.processor import mm_token_type_ids

    ids, labels, pixels, grids = [], [], [], []
    for rec in records:
        prompt, vis = codec.encode(rec, base_dir)
        answer = codec.answer_ids(rec["label"]) if with_answers else []
        ids.append(prompt + answer)
        labels.append([-100] * len(prompt) + answer)
        pixels.append(vis["pixel_values"])
        grids.append(vis["image_grid_thw"])
    if len({len(x) for x in ids}) != 1:
        raise ValueError("the demo's prompts must all have one length (one picture size, one question)")
    ids = torch.tensor(ids)
    # mm_token_type_ids: without them transformers' Qwen2.5-VL silently uses text positions instead of M-RoPE's
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
             "mm_token_type_ids": mm_token_type_ids(codec.processor.image_token_id, ids),
             "pixel_values": torch.cat(pixels), "image_grid_thw": torch.cat(grids)}
    if with_answers:
        batch["labels"] = torch.tensor(labels)
    return batch


def evaluate_greedy(model, codec: VlmCodec, heldout: str, batch_size: int = 100) -> float:
    """Greedy exact-match accuracy of an HF VLM on a held-out jsonl, with transformers' generate."""
    import torch

    records, base_dir = read_jsonl(heldout), os.path.dirname(os.path.abspath(heldout))
    was_training = model.training
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(records), batch_size):
            chunk = records[i:i + batch_size]
            batch = make_batch(codec, chunk, base_dir, with_answers=False)
            width = batch["input_ids"].shape[1]
            out = model.generate(**batch, max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                                 eos_token_id=codec.eos_id, pad_token_id=codec.pad_id)
            for row, rec in zip(out[:, width:].tolist(), chunk):
                want = codec.answer_ids(rec["label"])
                correct += int(row[:len(want)] == want)
    if was_training:
        model.train()
    return correct / max(len(records), 1)


def sft_warmup(base_model: str, train: str, heldout: str, out_dir: str, *, target: float = 0.25, lr: float = 1e-3,
               batch_size: int = 32, eval_every: int = 10, max_steps: int = 2000, seed: int = 0,
               threads: int = 1, log=print) -> dict:
    """Train base_model's VLM until held-out greedy accuracy >= target; save that checkpoint to out_dir.

    train / heldout are the task's jsonl files (shapes.write_data).

    Returns {"steps", "seconds", "heldout_accuracy", "history": [(step, loss, acc), ...], ...}; raises when the
    target is not reached in max_steps. Deterministic for a given seed and thread count.
    """
    import torch
    from transformers import AutoModelForImageTextToText

    if not 0.0 < target < 1.0:
        raise ValueError(f"SFT target accuracy must be in (0, 1), got {target}")
    base_dir = os.path.dirname(os.path.abspath(train))
    train = read_jsonl(train)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(seed)
        codec = VlmCodec(base_model)
        model = AutoModelForImageTextToText.from_pretrained(base_model).float()
        rng = random.Random(seed)
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
        model.train()
        t0, history, acc = time.perf_counter(), [], 0.0
        for step in range(1, max_steps + 1):
            loss = model(**make_batch(codec, rng.sample(train, batch_size), base_dir)).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if step % eval_every == 0:
                acc = evaluate_greedy(model, codec, heldout)
                history.append((step, round(loss.item(), 4), acc))
                log(f"sft: step {step} loss {loss.item():.3f} held-out {acc:.3f}")
                if acc >= target:
                    break
        else:
            raise RuntimeError(f"SFT warm-up did not reach held-out accuracy {target} in {max_steps} steps "
                               f"(last {acc:.3f}); raise --sft-max-steps or --sft-lr, or lower --sft-target")
        seconds = time.perf_counter() - t0
        log(f"sft: {step} steps in {seconds:.1f}s, loss {history[-1][1]:.3f}, held-out greedy accuracy {acc:.3f}")
        model.save_pretrained(out_dir, safe_serialization=True)
        _copy_processor_files(base_model, out_dir)
        return {"steps": step, "seconds": round(seconds, 2), "heldout_accuracy": acc, "history": history,
                "target": target, "lr": lr, "batch_size": batch_size, "eval_every": eval_every, "seed": seed,
                "threads": threads}
    finally:
        torch.set_num_threads(previous_threads)


def _copy_processor_files(base_model: str, out_dir: str) -> None:
    """The tokenizer, image processor and chat template files of base_model, beside the trained weights."""
    import shutil

    for name in os.listdir(base_model):
        src = os.path.join(base_model, name)
        if os.path.isfile(src) and not os.path.exists(os.path.join(out_dir, name)):
            shutil.copy2(src, out_dir)
