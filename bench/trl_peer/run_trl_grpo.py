"""The TRL peer of the end-to-end benchmark: TRL's GRPOTrainer on exactly the CPU demo's task.

Same model directory and tokenizer (the demo's SFT warm-up checkpoint), same prompts (train.jsonl), same reward
code (slime_like.demo.arith.score, imported from this checkout), same batch shape (prompts x samples x max new
tokens), learning rate and temperature. Runs in bench/.venv-trl (bench/trl_peer/setup_env.sh), never in the main
environment. Writes per-step wall and process CPU seconds and the mean train reward to a JSON file; optionally
the held-out greedy accuracy every --eval-every steps (timed separately, not inside the step times).

    bench/.venv-trl/bin/python bench/trl_peer/run_trl_grpo.py --model-dir runs/demo_prep/sft_model \
        --data-dir runs/demo_prep/data --steps 20 --out bench/results/trl_grpo.json
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))  # this checkout's slime_like

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from slime_like.demo.arith import EOS_ID, MAX_NEW_TOKENS, evaluate_greedy, read_jsonl, score  # noqa: E402


def exact_match(completions, completion_ids, label, **kw):
    """The demo's reward on TRL's inputs; completion_ids end at the first eos (TRL masks what follows)."""
    return [score(text, ans, truncated=EOS_ID not in ids, response_ids=ids)
            for text, ids, ans in zip(completions, completion_ids, label)]


class StepLog(TrainerCallback):
    """Wall and process-CPU seconds of each optimizer step (generation + reward + loss + update)."""

    def __init__(self, heldout, eval_every):
        self.heldout, self.eval_every = heldout, eval_every
        self.steps, self.evals = [], []

    def _eval(self, model, step):
        t0 = time.perf_counter()
        acc = evaluate_greedy(model, self.heldout)
        self.evals.append({"step": step, "accuracy": acc, "seconds": round(time.perf_counter() - t0, 3)})
        print(f"[eval] step {step} held-out greedy accuracy {acc:.3f}", flush=True)

    def on_train_begin(self, args, state, control, model=None, **kw):
        if self.eval_every:
            self._eval(model, 0)  # before the first update, like the demo

    def on_step_begin(self, args, state, control, **kw):
        self.t0, self.c0 = time.perf_counter(), time.process_time()

    def on_step_end(self, args, state, control, model=None, **kw):
        self.steps.append({"step": state.global_step, "wall_s": time.perf_counter() - self.t0,
                           "cpu_s": time.process_time() - self.c0})
        if self.eval_every and state.global_step % self.eval_every == 0:
            self._eval(model, state.global_step)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", required=True, help="HF checkpoint (the demo's sft_model)")
    p.add_argument("--data-dir", required=True, help="the demo's data dir (train.jsonl, heldout.jsonl)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--prompts", type=int, default=64, help="prompts per step (--rollout-batch-size)")
    p.add_argument("--samples", type=int, default=8, help="samples per prompt (--n-samples-per-prompt)")
    p.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS, help="--rollout-max-response-len")
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--eval-every", type=int, default=0, help="held-out greedy accuracy every N steps (0: never)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="JSON result file")
    a = p.parse_args()
    for name in ("train.jsonl", "heldout.jsonl"):
        if not os.path.exists(os.path.join(a.data_dir, name)):
            sys.exit(f"--data-dir {a.data_dir} has no {name}: run python -m slime_like.demo.prepare OUT_DIR first")
    torch.set_num_threads(a.threads)

    tok = AutoTokenizer.from_pretrained(a.model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(a.model_dir).float()
    train = read_jsonl(os.path.join(a.data_dir, "train.jsonl"))
    heldout = read_jsonl(os.path.join(a.data_dir, "heldout.jsonl"))
    ds = Dataset.from_dict({"prompt": [r["prompt"] for r in train], "label": [r["label"] for r in train]})
    cfg = GRPOConfig(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(a.out)), "trl_tmp"), use_cpu=True, bf16=False,
        fp16=False, per_device_train_batch_size=a.prompts * a.samples, gradient_accumulation_steps=1,
        num_generations=a.samples, max_completion_length=a.max_new_tokens, temperature=a.temperature,
        top_p=1.0, top_k=0, learning_rate=a.lr, lr_scheduler_type="constant", warmup_steps=0,
        beta=0.0, num_iterations=1, max_grad_norm=1.0, max_steps=a.steps, logging_steps=1,
        report_to="none", save_strategy="no", use_vllm=False, dataloader_num_workers=0, seed=a.seed,
        shuffle_dataset=False, disable_tqdm=True)
    log = StepLog(heldout, a.eval_every)
    trainer = GRPOTrainer(model=model, reward_funcs=exact_match, args=cfg, train_dataset=ds,
                          processing_class=tok, callbacks=[log])
    t0 = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - t0
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    for row, r in zip(log.steps, rewards):
        row["reward_mean"] = r
    steady = sorted(s["wall_s"] for s in log.steps[1:]) or [log.steps[0]["wall_s"]]
    csteady = sorted(s["cpu_s"] for s in log.steps[1:]) or [log.steps[0]["cpu_s"]]
    result = {"peer": "trl", "trl_version": __import__("trl").__version__, "torch_version": torch.__version__,
              "config": vars(a), "total_wall_s": round(total, 2),
              "step_wall_median_s": steady[len(steady) // 2], "step_cpu_median_s": csteady[len(csteady) // 2],
              "steps": log.steps, "evals": log.evals}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"TRL GRPO: {len(log.steps)} steps of {a.prompts}x{a.samples}x{a.max_new_tokens} tokens, "
          f"step wall median {result['step_wall_median_s']:.3f}s, cpu median {result['step_cpu_median_s']:.3f}s "
          f"(first step excluded), reward {rewards[0] if rewards else float('nan'):.3f} -> "
          f"{rewards[-1] if rewards else float('nan'):.3f}; wrote {a.out}")


if __name__ == "__main__":
    main()
