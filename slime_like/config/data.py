"""Prompt data, batch sizes and evaluation data: their flags, checks and derived defaults.

The batch identity (seed 004): rollout_batch_size x n_samples_per_prompt == global_batch_size x
num_steps_per_rollout, one of the two right-hand terms derived from the other. --num-epoch derives --num-rollout
from the prompt count; --prompt-template sets the chat-template flags the data source reads. slime's
--eval-config file: eval_config.py. Names, dests and defaults follow slime (slime/utils/arguments.py).
"""
from __future__ import annotations

import os

from slime_like.config.errors import ConfigError
from slime_like.config.eval_config import read_eval_config
from slime_like.config.types import Float, Int, json_value

# ChatML, the layout of ROLL's qwen2_5 template (and Qwen2.5's own): one user turn, then the assistant's.
CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TEMPLATES = ("plain", "native", "chatml", "qwen2_5")


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
    a("--multimodal-keys", type=json_value, default=None,
      help="JSON mapping of media type to the record key of its list, e.g. '{\"image\": \"images\"}': images as "
           "paths (relative to the data file), file:// URLs or base64, placed by '<image>' in the prompt; needs a "
           "vision-language --hf-checkpoint (docs/guide.md, Vision-language models).")
    a("--apply-chat-template", action="store_true", help="Prompts are OpenAI message lists; apply the chat template.")
    a("--apply-chat-template-kwargs", type=json_value, default="{}", help="JSON kwargs for apply_chat_template.")
    a("--data-source-path", default=None, help="'module.Class' of a custom data source.")
    a("--num-rollout", type=Int(0), default=None, help="Number of rollouts (training iterations of the RL loop).")
    a("--num-epoch", type=Int(1), default=None,
      help="Epochs over --prompt-data; sets --num-rollout = epochs * prompts // rollout_batch_size if that is unset.")
    a("--start-rollout-id", type=Int(0), default=None,
      help="First rollout id; default = from the loaded checkpoint or 0.")
    a("--rollout-batch-size", type=Int(1), default=None, help="Prompts per rollout (required).")
    a("--n-samples-per-prompt", type=Int(1), default=1, help="Responses per prompt (the GRPO group size).")
    a("--global-batch-size", type=Int(1), default=None,
      help="Samples per optimizer step; default = rollout_batch_size * n_samples_per_prompt / num_steps_per_rollout.")
    a("--num-steps-per-rollout", type=Int(1), default=None, help="Optimizer steps per rollout; default 1.")
    a("--micro-batch-size", type=Int(1), default=1,
      help="Samples per micro-batch (ignored with --use-dynamic-batch-size).")
    return parser


def add_eval_group(parser):
    g = parser.add_argument_group("eval", "Evaluation (unset overrides inherit the rollout settings)")
    a = g.add_argument
    a("--eval-function-path", default=None, help="'module.function' for eval generation; default = rollout's.")
    a("--eval-interval", type=Int(1), default=None, help="Evaluate every N rollouts (needs --eval-prompt-data).")
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
    a("--n-samples-per-eval-prompt", type=Int(1), default=1, help="Responses per eval prompt (pass@k up to this).")
    a("--eval-temperature", type=Float(0), default=None, help="Eval temperature; default = rollout's.")
    a("--eval-top-p", type=Float(0, 1, lo_open=True), default=None, help="Eval top-p; default = rollout's.")
    a("--eval-top-k", type=Int(-1), default=None, help="Eval top-k; default = rollout's.")
    a("--eval-max-response-len", type=Int(1), default=None, help="Eval max new tokens; default = rollout's.")
    a("--eval-max-prompt-len", type=Int(1), default=None, help="Eval prompt length limit.")
    a("--eval-min-new-tokens", type=Int(0), default=None, help="Eval minimum new tokens.")
    a("--eval-max-context-len", type=Int(1), default=None, help="Eval context limit; default = rollout's.")
    return parser


def add_loss_mask_flag(g):
    """(slime extras group)"""
    a = g.add_argument
    a("--loss-mask-type", default="qwen", choices=["qwen", "qwen3", "qwen3_5", "distill_qwen"],
      help="Chat-template loss mask of SFT / multi-turn samples.")


def check_required(args):
    if args.rollout_batch_size is None:
        raise ConfigError("--rollout-batch-size is required (prompts per rollout), e.g. --rollout-batch-size 32")
    for flag in ("rollout_batch_size", "n_samples_per_prompt", "micro_batch_size", "update_weights_interval"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.start_rollout_id is not None and args.start_rollout_id < 0:
        raise ConfigError(f"--start-rollout-id must be >= 0, got {args.start_rollout_id} (leave it unset to resume "
                          "from the --load checkpoint)")
    if args.num_rollout is None and args.num_epoch is None:
        raise ConfigError("set --num-rollout N (rollouts to run) or --num-epoch N (passes over --prompt-data)")


def check_batch_identity(args):
    """Seed 004: rollout_batch_size * n_samples_per_prompt == global_batch_size * num_steps_per_rollout."""
    samples = args.rollout_batch_size * args.n_samples_per_prompt
    gbs, steps = args.global_batch_size, args.num_steps_per_rollout
    rule = (f"--rollout-batch-size {args.rollout_batch_size} x --n-samples-per-prompt {args.n_samples_per_prompt} "
            f"= {samples} samples per rollout")
    if steps is not None and steps < 1 or gbs is not None and gbs < 1:
        raise ConfigError(f"--global-batch-size ({gbs}) and --num-steps-per-rollout ({steps}) must be >= 1")
    if steps is None and gbs is None:
        steps, gbs = 1, samples
    elif steps is None:
        if samples % gbs:
            raise ConfigError(f"{rule} is not a multiple of --global-batch-size {gbs}; choose a divisor of {samples} "
                              "or set --num-steps-per-rollout instead")
        steps = samples // gbs
    elif gbs is None:
        if samples % steps:
            raise ConfigError(f"{rule} does not split into --num-steps-per-rollout {steps} equal steps; "
                              f"choose a divisor of {samples}")
        gbs = samples // steps
    elif gbs * steps != samples:
        raise ConfigError(f"{rule}, but --global-batch-size {gbs} x --num-steps-per-rollout {steps} = {gbs * steps}; "
                          "they must be equal (drop one of the two flags to derive it)")
    args.global_batch_size, args.num_steps_per_rollout = gbs, steps
    if not args.use_dynamic_batch_size and gbs % args.micro_batch_size:
        raise ConfigError(f"--global-batch-size {gbs} is not a multiple of --micro-batch-size {args.micro_batch_size}")
    if args.use_dynamic_batch_size and args.max_tokens_per_gpu is None:
        raise ConfigError("--use-dynamic-batch-size needs --max-tokens-per-gpu (the token budget per micro-batch)")
    if args.use_dynamic_batch_size and args.log_probs_max_tokens_per_gpu is None:
        args.log_probs_max_tokens_per_gpu = args.max_tokens_per_gpu
    if args.over_sampling_batch_size is None:
        args.over_sampling_batch_size = args.rollout_batch_size
    if args.over_sampling_batch_size < args.rollout_batch_size:
        raise ConfigError(f"--over-sampling-batch-size {args.over_sampling_batch_size} must be >= "
                          f"--rollout-batch-size {args.rollout_batch_size}")


def apply_prompt_template(args):
    """--prompt-template -> the chat-template flags the data source reads."""
    t = args.prompt_template
    if t is None or t == "plain":
        return
    if t not in TEMPLATES:
        raise ConfigError(f"--prompt-template {t!r}: use one of {', '.join(TEMPLATES)} (ROLL's other template names "
                          "are model-specific layouts; write the prompt as text or use native)")
    args.apply_chat_template = True
    if t in ("chatml", "qwen2_5"):
        kwargs = dict(args.apply_chat_template_kwargs or {})
        if "chat_template" in kwargs:
            raise ConfigError(f"--prompt-template {t} sets the chat template; drop chat_template from "
                              "--apply-chat-template-kwargs")
        kwargs["chat_template"] = CHATML
        args.apply_chat_template_kwargs = kwargs


def eval_data(args, report):
    """--eval-config / --eval-prompt-data as NAME PATH pairs (args.eval_prompt_data; None without eval data)."""
    args.eval_datasets = None
    if args.eval_config:  # slime: the file replaces --eval-prompt-data
        if args.eval_prompt_data:
            report.warn(f"--eval-config {args.eval_config} replaces --eval-prompt-data "
                        f"{' '.join(args.eval_prompt_data)}")
        args.eval_datasets = read_eval_config(args.eval_config)
        args.eval_prompt_data = [v for d in args.eval_datasets for v in (d["name"], d["path"])]
    data = args.eval_prompt_data
    if data is not None:
        if len(data) == 1:
            report.warn(f"--eval-prompt-data {data[0]}: one value given, read as dataset 'aime' (slime's legacy form); "
                        "write NAME PATH pairs")
            data = args.eval_prompt_data = ["aime", data[0]]
        if len(data) % 2:
            raise ConfigError(f"--eval-prompt-data {' '.join(data)}: expected NAME PATH pairs, got {len(data)} values")
        names = data[0::2]
        if len(set(names)) != len(names):
            raise ConfigError(f"--eval-prompt-data: dataset names must be unique, got {names}")
    return data


def check_data_paths(args, report, eval_data):
    """The prompt and eval files exist (collected as path problems, reported together)."""
    if args.prompt_data and not os.path.exists(args.prompt_data):
        report.path_problem(f"--prompt-data {args.prompt_data}: no such file")
    if args.prompt_data_extra and not args.prompt_data:
        raise ConfigError("--prompt-data-extra adds files after --prompt-data; give --prompt-data first")
    for path in args.prompt_data_extra or []:
        if not os.path.exists(path):
            report.path_problem(f"--prompt-data-extra {path}: no such file")
    for name, path in zip((eval_data or [])[0::2], (eval_data or [])[1::2]):
        if not os.path.exists(path):
            report.path_problem(f"--eval-prompt-data {name} {path}: no such file")


def check_multimodal(args):
    """--multimodal-keys (and each --eval-config dataset's multimodal_keys): supported media types, a
    vision-language checkpoint (config.json with a vision_config), not the SFT rollout."""
    from slime_like.multimodal.records import multimodal_keys_problems

    own = [(f"--eval-config {args.eval_config} dataset {d['name']}", d["overrides"]["multimodal_keys"])
           for d in args.eval_datasets or () if d["overrides"].get("multimodal_keys") is not None]
    settings = ([("", args.multimodal_keys)] if args.multimodal_keys is not None else []) + own
    if not settings:
        return
    problems = [(f"{where}: " if where else "") + p
                for where, value in settings for p in multimodal_keys_problems(value)]
    if args.multimodal_keys is not None and "sft_rollout" in str(args.rollout_function_path):
        problems.append("--multimodal-keys with the SFT rollout (--rollout-function-path "
                        f"{args.rollout_function_path}): SFT on images is not supported; train on RL rollouts")
    cfg_path = os.path.join(args.hf_checkpoint or "", "config.json")
    if args.hf_checkpoint and os.path.isfile(cfg_path):
        import json

        with open(cfg_path) as f:
            cfg = json.load(f)
        if isinstance(cfg, dict) and "vision_config" not in cfg:
            problems.append(f"--multimodal-keys needs a vision-language --hf-checkpoint; {args.hf_checkpoint} is "
                            f"model_type {cfg.get('model_type')!r} without a vision_config (e.g. use a Qwen2.5-VL "
                            "or Qwen3-VL checkpoint)")
    if problems:
        raise ConfigError(problems[0] if len(problems) == 1 else
                          f"{len(problems)} problems with --multimodal-keys:\n" + "\n".join(f"  - {p}" for p in problems))


def check_multimodal_engine(args):
    """--multimodal-keys needs a rollout engine that takes images with token-id prompts (needs the resolved
    --rollout-engine) and a trainer that trains on the images (never silently on the tokens alone)."""
    from slime_like.registry import ROLLOUT_ENGINES, TRAINER_BACKENDS

    backend = args.train_backend
    if args.multimodal_keys and backend in TRAINER_BACKENDS and not TRAINER_BACKENDS.has(backend, "trains_images"):
        having = " or ".join(map(TRAINER_BACKENDS.display, TRAINER_BACKENDS.with_capability("trains_images")))
        raise ConfigError(f"--multimodal-keys with --train-backend {backend}: {TRAINER_BACKENDS.display(backend)} "
                          f"does not train on images (registry capability trains_images); use {having}")
    engine = args.rollout_engine
    media = args.multimodal_keys or any((d["overrides"].get("multimodal_keys") for d in args.eval_datasets or ()))
    if media and engine in ROLLOUT_ENGINES and not ROLLOUT_ENGINES.has(engine, "serves_images"):
        having = " and ".join(map(ROLLOUT_ENGINES.display, ROLLOUT_ENGINES.with_capability("serves_images")))
        raise ConfigError(f"--multimodal-keys with --rollout-engine {engine}: {ROLLOUT_ENGINES.display(engine)} "
                          f"takes no images with token-id prompts (vLLM's /v1/completions has no image field, and its "
                          f"token-in /inference/v1/generate takes pre-rendered features only); use {having}")


def check_eval_schedule(args, data):
    """--eval-interval needs eval data; eval generation and its reward key default to the rollout's."""
    if args.eval_interval is not None:
        if args.eval_interval < 1:
            raise ConfigError(f"--eval-interval {args.eval_interval}: must be >= 1")
        if not data:
            raise ConfigError(f"--eval-interval {args.eval_interval} needs eval data: add --eval-prompt-data NAME PATH")
    if args.eval_function_path is None:
        args.eval_function_path = args.rollout_function_path
    if args.eval_reward_key is None:
        args.eval_reward_key = args.reward_key


def _count_records(path: str) -> int:
    """Prompts in one data file: non-blank JSONL lines, or the rows a Parquet footer declares."""
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ConfigError(f"--num-epoch: counting the rows of {path} needs pyarrow (pip install pyarrow); or set "
                              "--num-rollout instead") from None
        try:
            return pq.ParquetFile(path).metadata.num_rows
        except Exception as e:  # noqa: BLE001 - a corrupt file: pyarrow's own reason
            raise ConfigError(f"--num-epoch: {path} is not a readable Parquet file ({e})") from None
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def num_rollout_from_epochs(args, report):
    if args.num_epoch is not None and args.num_rollout is not None:
        report.warn(f"both --num-rollout {args.num_rollout} and --num-epoch {args.num_epoch} set; --num-epoch is "
                    "ignored (slime)")
    elif args.num_epoch is not None:
        _num_rollout_from_epochs(args, report)


def _num_rollout_from_epochs(args, report):
    """slime: num_rollout = num_epoch * dataset_size // rollout_batch_size (JSONL lines or Parquet rows counted
    here; a Parquet file's row count is in its footer)."""
    if args.num_epoch < 1:
        raise ConfigError(f"--num-epoch {args.num_epoch}: must be >= 1")
    files = [args.prompt_data, *(args.prompt_data_extra or [])]
    if not args.prompt_data or not all(f.endswith((".jsonl", ".parquet")) for f in files):
        raise ConfigError(f"--num-epoch needs JSONL or Parquet --prompt-data (and --prompt-data-extra files) to count "
                          f"prompts (got {' '.join(map(str, files))}); set --num-rollout instead")
    if not all(os.path.isfile(f) for f in files):
        return  # reported as a missing path
    n = sum(_count_records(path) for path in files)
    args.num_rollout = max(1, args.num_epoch * n // args.rollout_batch_size)
    args.num_rollout_per_epoch = max(1, n // args.rollout_batch_size)  # slime saves / evaluates at epoch ends
    if args.rollout_max_prompt_len is not None:
        report.warn(f"--num-rollout {args.num_rollout} derived from --num-epoch {args.num_epoch} x {n} prompts counted "
                    "before --rollout-max-prompt-len filtering")
