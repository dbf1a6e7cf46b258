"""Flag surface: groups, Megatron/slime names, dests, types and defaults; typos; no abbreviations."""
import pytest

from slime_like.config.errors import ConfigError
from slime_like.config.parser import GROUP_ORDER, build_parser, defaults_of

from cfg_helpers import parse, parse_report, refuse_at_launch


def test_help_lists_every_group_in_order(capsys):
    parser, _ = build_parser()
    text = parser.format_help()
    positions = [text.index(f"\n{title}:\n") for title in GROUP_ORDER]
    assert positions == sorted(positions)
    assert "--rollout-batch-size" in text and "--tensor-model-parallel-size" in text


def test_slime_and_megatron_defaults():
    d = defaults_of(build_parser()[0])
    expected = {"lr": 1e-6, "clip_grad": 1.0, "seed": 1234, "micro_batch_size": 1, "rollout_temperature": 1.0,
                "rollout_top_k": -1, "eps_clip": 0.2, "eps_clip_high": None, "kl_loss_type": "k1", "rollout_seed": 42,
                "advantage_estimator": "grpo", "sglang_server_concurrency": 512, "num_gpus_per_node": 8,
                "actor_num_gpus_per_node": 8, "update_weight_buffer_size": 512 * 1024 ** 2, "update_weights_interval": 1,
                "input_key": "input", "metadata_key": "metadata", "loss_type": "policy_loss", "tis_clip": 2.0,
                "num_query_groups": 1, "rotary_base": 10000, "norm_epsilon": 1e-5, "normalization": "LayerNorm",
                "adam_beta2": 0.999, "weight_decay": 0.01, "lr_decay_style": "linear", "log_interval": 100,
                "add_bias_linear": True, "grpo_std_normalization": True, "compute_advantages_and_returns": True,
                "rollout_engine": "auto", "apply_chat_template_kwargs": {}, "moe_router_topk": 2}
    assert {k: d[k] for k in expected} == expected


def test_issue_recipe_parses(base, tmp_path):
    (tmp_path / "dapo.jsonl").write_text("{}\n")
    argv = base + [
        "--ref-load", str(tmp_path), "--save", str(tmp_path / "run1"), "--save-interval", "20",
        "--prompt-data", str(tmp_path / "dapo.jsonl"), "--input-key", "prompt", "--label-key", "label", "--apply-chat-template",
        "--rollout-shuffle", "--rm-type", "deepscaler", "--rollout-max-response-len", "8192",
        "--rollout-temperature", "1", "--global-batch-size", "8",
        "--tensor-model-parallel-size", "2", "--sequence-parallel", "--pipeline-model-parallel-size", "1",
        "--context-parallel-size", "1", "--expert-model-parallel-size", "1", "--expert-tensor-parallel-size", "1",
        "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
        "--use-dynamic-batch-size", "--max-tokens-per-gpu", "9216",
        "--advantage-estimator", "grpo", "--use-kl-loss", "--kl-loss-coef", "0.00", "--kl-loss-type", "low_var_kl",
        "--entropy-coef", "0.00", "--eps-clip", "0.2", "--eps-clip-high", "0.28",
        "--optimizer", "adam", "--lr", "1e-6", "--lr-decay-style", "constant", "--weight-decay", "0.1",
        "--adam-beta1", "0.9", "--adam-beta2", "0.98", "--rollout-num-gpus-per-engine", "2",
        "--sglang-mem-fraction-static", "0.7"]
    args = parse(argv)
    assert args.tensor_model_parallel_size == 2 and args.sequence_parallel
    assert args.kl_loss_type == "low_var_kl" and args.eps_clip_high == 0.28 and args.adam_beta2 == 0.98
    assert args.sglang_mem_fraction_static == 0.7 and args.sglang_server_args == {"mem_fraction_static": 0.7}
    assert args.log_probs_max_tokens_per_gpu == 9216  # derived from --max-tokens-per-gpu


def test_store_false_dests_and_types(base, tmp_path):
    (tmp_path / "x.jsonl").write_text("{}\n")
    args = parse(base + ["--disable-bias-linear", "--disable-grpo-std-normalization", "--rollout-stop", "a", "b",
                         "--rollout-stop-token-ids", "7", "8", "--eval-prompt-data", "aime", str(tmp_path / "x.jsonl"),
                         "--moe-layer-freq", "([0]*1+[1]*3)", "--apply-chat-template-kwargs", '{"enable_thinking": false}',
                         "--no-offload-train"])
    assert args.add_bias_linear is False
    assert args.grpo_std_normalization is False and not hasattr(args, "disable_grpo_std_normalization")
    assert args.rollout_stop == ["a", "b"] and args.rollout_stop_token_ids == [7, 8]
    assert args.moe_layer_freq == [0, 1, 1, 1]
    assert args.apply_chat_template_kwargs == {"enable_thinking": False}
    assert args.offload_train is False and args.offload_rollout is True  # explicit --no-offload-train wins


@pytest.mark.parametrize("typo, suggestion", [("--lr-warmup-iter", "--lr-warmup-iters"),
                                              ("--rollout-batchsize", "--rollout-batch-size"),
                                              ("--tensor-model-paralel-size", "--tensor-model-parallel-size")])
def test_typo_names_the_closest_flag(base, typo, suggestion):
    with pytest.raises(ConfigError, match=f"unknown flag {typo} \\(did you mean {suggestion}"):
        parse(base + [typo, "5"])


def test_no_abbreviations(base):
    with pytest.raises(ConfigError, match="unknown flag --rollout-batch"):
        parse(base + ["--rollout-batch", "8"])


def test_bad_choice_and_bad_type(base):
    with pytest.raises(ConfigError, match="invalid choice: 'grp'"):
        parse(base + ["--advantage-estimator", "grp"])
    with pytest.raises(ConfigError, match="--lr: fast: not a number"):
        parse(base + ["--lr", "fast"])


def test_stray_value_is_an_error(base):
    with pytest.raises(ConfigError, match="unexpected argument"):
        parse(base + ["stray"])


def test_unimplemented_slime_flags_say_so(base):
    """They parse (a dry run plans the recipe) and the launch refuses them, naming the feature."""
    parse(base + ["--use-slime-router"])
    with pytest.raises(ConfigError, match="--use-slime-router is a slime flag for slime's own router, which slime_like "
                                          "does not"):
        refuse_at_launch(base + ["--use-slime-router"])
    refuse_at_launch(base)  # nothing refused: no error
    assert "--use-slime-router" not in build_parser()[0].format_help()
    with pytest.raises(ConfigError, match="--use-routing-replay needs an MoE model"):   # implemented: checked
        parse(base + ["--use-routing-replay"])


def test_slime_defaults_of_weight_mode_and_data_transport_run(base):
    """slime's defaults (full, object-store) are what runs here, whether written or not; delta runs with slime's
    rules (disk transport, a local checkpoint dir, not colocated); nixl is refused at launch."""
    args = parse(base)
    assert (args.update_weight_mode, args.rollout_data_transport) == ("full", "object-store")
    refuse_at_launch(base + ["--update-weight-mode", "full", "--rollout-data-transport", "object-store"])
    with pytest.raises(ConfigError, match="--update-weight-mode delta: needs --update-weight-transport disk .*; "
                                          "needs --update-weight-local-checkpoint-dir: .*; does not run with "
                                          "--colocate .* \\(or use --update-weight-mode full\\)"):
        parse(base + ["--update-weight-mode", "delta"])
    apart = [a for a in base if a != "--colocate"] + ["--rollout-num-gpus", "1", "--num-gpus-per-node", "3"]
    delta = apart + ["--update-weight-mode", "delta", "--update-weight-transport", "disk", "--update-weight-disk-dir",
                    "/tmp/deltas", "--update-weight-local-checkpoint-dir", "/tmp/local"]
    refuse_at_launch(delta)   # built: the CPU engine serves /pull_weights
    hf_dir = base[base.index("--hf-checkpoint") + 1]
    with pytest.raises(ConfigError, match="--update-weight-local-checkpoint-dir .* must be a directory of its own"):
        parse(delta + ["--update-weight-local-checkpoint-dir", hf_dir])
    with pytest.raises(ConfigError, match="--update-weight-mode delta with --rollout-engine vllm: the vLLM adapter "
                                          "has no /pull_weights route"):
        refuse_at_launch(delta + ["--rollout-engine", "vllm"])
    with pytest.raises(ConfigError, match="--rollout-data-transport nixl: NIXL transfers of rollout data are not "
                                          "built in slime_like; use --rollout-data-transport object-store"):
        refuse_at_launch(base + ["--rollout-data-transport", "nixl"])
    with pytest.raises(ConfigError, match="invalid choice: 'straw'"):
        parse(base + ["--rollout-data-transport", "straw"])


def test_rope_and_rotary_scaling_factors_are_megatrons_two_flags(base):
    """--rope-scaling-factor: Llama 3.x scaling (default 8); --rotary-scaling-factor: MLA's YaRN (default 1). slime's
    llama files pass --use-rope-scaling --rotary-scaling-factor F: fine where F is what Megatron builds anyway
    (Llama 3.1's 8), refused at launch otherwise (Llama 3.2's 32 would silently be built as 8)."""
    a = parse(base + ["--rotary-scaling-factor", "4.0"])
    assert (a.rope_scaling_factor, a.rotary_scaling_factor) == (8.0, 4.0)
    refuse_at_launch(base + ["--use-rope-scaling", "--rotary-scaling-factor", "8.0"])
    with pytest.raises(ConfigError, match=r"--rotary-scaling-factor 32.0 .*--rope-scaling-factor VALUE"):
        refuse_at_launch(base + ["--use-rope-scaling", "--rotary-scaling-factor", "32.0"])
    refuse_at_launch(base + ["--use-rope-scaling", "--rope-scaling-factor", "32.0"])


# Every flag issue 2 and the seeds name (plus those other parts of the product need) is registered.
NAMED = """--num-layers --hidden-size --ffn-hidden-size --num-attention-heads --group-query-attention --num-query-groups
--kv-channels --swiglu --normalization --norm-epsilon --use-rotary-position-embeddings --rotary-base --vocab-size
--disable-bias-linear --add-qkv-bias --qk-layernorm --untie-embeddings-and-output-weights --max-position-embeddings
--seq-length --num-experts --moe-router-topk --moe-ffn-hidden-size --moe-shared-expert-intermediate-size
--moe-layer-freq --bf16 --fp16 --attention-dropout --hidden-dropout --attention-backend --lr-warmup-iters
--lr-warmup-fraction --min-lr --lr-decay-iters --hf-checkpoint --ref-load --load --save --save-interval
--no-save-optim --no-load-optim --save-hf --rollout-function-path --custom-generate-function-path --custom-rm-path
--dynamic-sampling-filter-path --over-sampling-batch-size --partial-rollout --num-epoch --micro-batch-size
--num-steps-per-rollout --balance-data --use-tis --tis-clip --eps-clip-c --gamma --lambd --normalize-advantages
--disable-grpo-std-normalization --kl-coef --loss-type --calculate-per-token-loss --offload --offload-train
--offload-rollout --rollout-num-gpus --rollout-num-gpus-per-engine --eval-interval --eval-prompt-data
--n-samples-per-eval-prompt --eval-max-response-len --eval-top-p --use-wandb --wandb-project --use-tensorboard
--rollout-engine --num-gpus-per-node --run-dir --dry-run --update-weights-interval --update-weight-buffer-size
--sglang-server-concurrency --rollout-max-prompt-len --rollout-seed --seed --rm-url --reward-key --eval-reward-key
--group-rm --rollout-stop --rollout-stop-token-ids --rollout-skip-special-tokens --eval-temperature --eval-top-k
--eval-input-key --eval-label-key --debug-rollout-only --debug-train-only --save-debug-rollout-data
--load-debug-rollout-data --keep-old-actor --critic-load --critic-save --critic-lr --critic-lr-warmup-iters
--wandb-group --wandb-mode --wandb-dir --tensorboard-dir --log-interval --eval-function-path --buffer-filter-path
--actor-num-nodes --actor-num-gpus-per-node --critic-num-nodes --critic-num-gpus-per-node --colocate --use-critic
--advantage-estimator --megatron-config-path --prompt-data --input-key --label-key --metadata-key
--apply-chat-template --rollout-shuffle --rm-type --num-rollout --rollout-batch-size --n-samples-per-prompt
--rollout-max-response-len --rollout-temperature --rollout-top-p --rollout-top-k --global-batch-size
--tensor-model-parallel-size --sequence-parallel --pipeline-model-parallel-size --context-parallel-size
--expert-model-parallel-size --expert-tensor-parallel-size --recompute-granularity --recompute-method
--recompute-num-layers --use-dynamic-batch-size --max-tokens-per-gpu --use-kl-loss --kl-loss-coef --kl-loss-type
--entropy-coef --eps-clip --eps-clip-high --optimizer --lr --lr-decay-style --weight-decay --adam-beta1
--adam-beta2 --clip-grad --sglang-config""".split()


def test_every_named_flag_is_registered():
    options = build_parser()[0]._option_string_actions
    assert [f for f in NAMED if f not in options] == []


def test_stateless_adam_needs_adam_and_no_saved_optimizer(base):
    with pytest.raises(ConfigError, match="--use-stateless-adam .*without --no-save-optim.*--optimizer adam --no-save-optim"):
        parse(base + ["--use-stateless-adam"])
    with pytest.raises(ConfigError, match="--use-stateless-adam \\(with --optimizer sgd"):
        parse(base + ["--use-stateless-adam", "--optimizer", "sgd", "--no-save-optim"])
    assert parse(base + ["--use-stateless-adam", "--no-save-optim"]).use_stateless_adam


def test_disk_weight_transport_needs_its_directory(base, tmp_path):
    with pytest.raises(ConfigError, match="--update-weight-transport disk needs --update-weight-disk-dir"):
        parse(base + ["--update-weight-transport", "disk"])
    args, report = parse_report(base + ["--update-weight-transport", "disk", "--update-weight-disk-dir", str(tmp_path)])
    assert args.update_weight_transport == "disk" and not report.launch_refusals
    _, report = parse_report(base + ["--update-weight-disk-dir", str(tmp_path)])
    assert any("nothing is written there" in w for w in report.warnings)
