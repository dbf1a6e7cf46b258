"""Every validation rule fires with a message naming the flags, the values and the fix; derived defaults."""
import pytest

from slime_like.config.errors import ConfigError

from cfg_helpers import TINY_QWEN2, parse, parse_report, refuse_at_launch, write_hf_dir


def drop(argv, flag, nvalues=1):
    i = argv.index(flag)
    return argv[:i] + argv[i + 1 + nvalues:]


RULES = [
    # (flags appended to the base run, regex the error must match)
    (["--global-batch-size", "3"], r"= 8 samples per rollout is not a multiple of --global-batch-size 3"),
    (["--num-steps-per-rollout", "3"], r"does not split into --num-steps-per-rollout 3"),
    (["--global-batch-size", "4", "--num-steps-per-rollout", "1"],
     r"--global-batch-size 4 x --num-steps-per-rollout 1 = 4; they must be equal"),
    (["--use-critic"], r"--use-critic with --advantage-estimator grpo"),
    (["--use-kl-loss"], r"--use-kl-loss needs a reference model: set --ref-load"),
    (["--use-kl-loss", "--ref-load", "/nonexistent/ref"], r"--ref-load /nonexistent/ref: no such file"),
    (["--advantage-estimator", "ppo", "--kl-coef", "0.1", "--ref-load", "/nonexistent/ref"],
     r"--ref-load /nonexistent/ref: no such file"),
    (["--kl-coef", "0.1", "--kl-loss-coef", "0.1"], r"--kl-coef 0.1 .* and --kl-loss-coef 0.1 .* use one of them"),
    (["--save-interval", "5"], r"--save-interval 5 needs --save DIR"),
    (["--eval-interval", "5"], r"--eval-interval 5 needs eval data: add --eval-prompt-data"),
    (["--eval-prompt-data", "a", "x.jsonl", "b"], r"expected NAME PATH pairs, got 3 values"),
    (["--rollout-temperature", "0"], r"--rollout-temperature 0.0: must be > 0"),
    (["--over-sampling-batch-size", "2"], r"--over-sampling-batch-size 2 must be >= --rollout-batch-size 4"),
    (["--rollout-num-gpus", "1"], r"--colocate .* --rollout-num-gpus 1 must equal .* = 2"),
    (["--tensor-model-parallel-size", "3"], r"actor GPUs = .* = 2, not divisible by --tensor-model-parallel-size 3"),
    (["--rollout-num-gpus-per-engine", "3"], r"--rollout-num-gpus-per-engine 3 exceeds --num-gpus-per-node 2 and is "
                                             "not a multiple of it"),
    (["--advantage-estimator", "reinforce_plus_plus"], r"reinforce_plus_plus needs --normalize-advantages"),
    (["--use-dynamic-batch-size"], r"--use-dynamic-batch-size needs --max-tokens-per-gpu"),
    (["--eps-clip-c", "0.5"], r"--eps-clip-c: 0.5: must be > 1"),
    (["--bf16", "--fp16"], r"--bf16 and --fp16 exclude each other"),
    (["--debug-rollout-only", "--debug-train-only"], r"--debug-rollout-only and --debug-train-only"),
    (["--rm-type", "remote_rm"], r"--rm-type remote_rm needs --rm-url"),
    (["--rollout-function-path", "slime.rollout.fully_async_rollout.generate_rollout_fully_async", "--max-staleness", "-1"], r"--max-staleness: -1: must be >= 0"),
    (["--rollout-function-path", "slime.rollout.fully_async_rollout.generate_rollout_fully_async", "--update-weights-interval", "3"], r"--max-staleness 1 with --update-weights-interval 3: .* >= 2"),
    (["--loss-type", "custom_loss"], r"--loss-type custom_loss needs --custom-loss-function-path"),
    (["--disable-compute-advantages-and-returns"], r"--disable-compute-advantages-and-returns with --loss-type "
                                                   r"policy_loss: .* for --loss-type sft_loss or custom_loss"),
    (["--use-tis", "--use-rollout-logprobs"], r"--use-rollout-logprobs and --use-tis exclude each other"),
    (["--rollout-engine", "sglang"], r"--rollout-engine sglang needs an NVIDIA GPU"),
    (["--hidden-size", "64", "--num-layers", "3", "--num-attention-heads", "4"],
     r"disagree with --hf-checkpoint .*--num-layers 3 but config.json has num_hidden_layers = 2"),
    (["--actor-num-gpus-per-node", "4"], r"--actor-num-gpus-per-node 4 exceeds --num-gpus-per-node 2"),
    (["--rollout-max-context-len", "10", "--rollout-max-prompt-len", "10"],
     r"--rollout-max-prompt-len 10 must be < --rollout-max-context-len 10"),
    (["--micro-batch-size", "3"], r"--global-batch-size 8 is not a multiple of --micro-batch-size 3"),
    (["--rollout-top-p", "1.5"], r"--rollout-top-p: 1.5: must be in \(0, 1\]"),
    # on-policy distillation (slime's rules)
    (["--use-opd"], r"--use-opd needs --opd-type: 'megatron' .* or 'sglang'"),
    (["--use-opd", "--opd-type", "megatron"], r"--opd-type megatron needs --opd-teacher-load DIR"),
    (["--use-opd", "--opd-type", "megatron", "--opd-teacher-load", "/nonexistent/t"],
     r"--opd-teacher-load /nonexistent/t: no such file or directory \(the OPD teacher\)"),
    (["--use-opd", "--opd-type", "sglang", "--opd-teacher-load", "/tmp"], r"--opd-teacher-load /tmp with --opd-type "
                                                                          "sglang: .* drop --opd-teacher-load"),
    (["--opd-teacher-load", "/tmp"], r"--opd-teacher-load /tmp is set but --use-opd is not"),
    (["--use-opd", "--opd-type", "sglang", "--opd-kl-coef", "-1"], r"--opd-kl-coef: -1: must be >= 0"),
]


@pytest.mark.parametrize("extra, message", RULES, ids=[" ".join(r[0])[:40] for r in RULES])
def test_rule_fires_with_its_message(base, extra, message):
    with pytest.raises(ConfigError, match=message):
        parse(base + extra)


def test_sequence_parallel_at_tp1_is_turned_off_as_megatron_does(base):
    args, report = parse_report(base + ["--sequence-parallel"])
    assert args.sequence_parallel is False
    assert any(w.startswith("--sequence-parallel with --tensor-model-parallel-size 1: turned off")
               for w in report.warnings)
    assert parse(base + ["--sequence-parallel", "--tensor-model-parallel-size", "2"]).sequence_parallel is True


def test_multi_node_engine_is_planned_then_refused_at_launch_on_cpu(base):
    from slime_like.plan import build_plan

    argv = base + ["--num-gpus-per-node", "1", "--actor-num-nodes", "2", "--actor-num-gpus-per-node", "1",
                   "--rollout-num-gpus-per-engine", "2"]
    args = parse(argv)
    assert [[(s.node, s.local_gpu) for s in e] for e in build_plan(args).engines] == [[(0, 0), (1, 0)]]
    # colocated pushes reach it (tests/multinode/test_colocated_push_nodes.py), but the CPU engine runs on one node
    with pytest.raises(ConfigError, match=r"\(one engine over 2 nodes\): the CPU engine runs each engine on one node"):
        refuse_at_launch(argv)


def test_data_files_must_exist(base):
    with pytest.raises(ConfigError, match="--prompt-data /no/train.jsonl: no such file"):
        parse(base + ["--prompt-data", "/no/train.jsonl"])
    with pytest.raises(ConfigError, match="--eval-prompt-data aime /no/aime.jsonl: no such file"):
        parse(base + ["--eval-prompt-data", "aime", "/no/aime.jsonl"])


def test_required_flags(base, hf_dir):
    with pytest.raises(ConfigError, match="--rollout-batch-size is required"):
        parse(drop(base, "--rollout-batch-size"))
    with pytest.raises(ConfigError, match="set --num-rollout N"):
        parse(drop(base, "--num-rollout"))
    with pytest.raises(ConfigError, match="--hf-checkpoint DIR is required"):
        parse(drop(base, "--hf-checkpoint"))
    with pytest.raises(ConfigError, match="--hf-checkpoint /no/such: no such directory"):
        parse(drop(base, "--hf-checkpoint") + ["--hf-checkpoint", "/no/such"])
    with pytest.raises(ConfigError, match="--rollout-num-gpus N is required without --colocate"):
        parse(drop(base, "--colocate", 0))


def test_disaggregated_gpu_arithmetic(base):
    argv = drop(base, "--colocate", 0) + ["--num-gpus-per-node", "8"]
    with pytest.raises(ConfigError, match="--rollout-num-gpus 3 is not a multiple of --rollout-num-gpus-per-engine 2"):
        parse(argv + ["--rollout-num-gpus", "3", "--rollout-num-gpus-per-engine", "2"])
    with pytest.raises(ConfigError, match="a multi-node actor must fill whole nodes"):
        parse(argv + ["--rollout-num-gpus", "2", "--actor-num-nodes", "2"])
    with pytest.raises(ConfigError, match="--global-batch-size 8 is not divisible by the actor's data-parallel size 3"):
        parse(argv + ["--rollout-num-gpus", "2", "--actor-num-gpus-per-node", "3"])


def test_batch_identity_derives_the_missing_side(base):
    a = parse(base)
    assert (a.global_batch_size, a.num_steps_per_rollout) == (8, 1)
    a = parse(base + ["--num-steps-per-rollout", "2"])
    assert (a.global_batch_size, a.num_steps_per_rollout) == (4, 2)
    a = parse(base + ["--global-batch-size", "2"])
    assert (a.global_batch_size, a.num_steps_per_rollout) == (2, 4)
    a = parse(base + ["--global-batch-size", "4", "--num-steps-per-rollout", "2"])
    assert a.rollout_batch_size * a.n_samples_per_prompt == a.global_batch_size * a.num_steps_per_rollout


def test_derived_defaults(base):
    a = parse(base + ["--eps-clip", "0.3", "--reward-key", "score"])
    assert a.eps_clip_high == 0.3 and a.over_sampling_batch_size == 4
    assert a.offload_train and a.offload_rollout and a.rollout_num_gpus == 2  # --colocate
    assert a.critic_num_nodes == 1 and a.critic_num_gpus_per_node == 2
    assert a.eval_reward_key == "score" and a.eval_function_path == a.rollout_function_path
    assert a.rollout_engine == "cpu" and a.rollout_engine_requested == "auto"  # no GPU on this machine
    assert a.run_dir.startswith("runs")
    a = parse(base + ["--advantage-estimator", "ppo"])
    assert a.use_critic  # slime: ppo always trains a critic


def test_model_flags_filled_from_config_json_when_absent(base):
    a = parse(base)
    assert (a.num_layers, a.hidden_size, a.num_query_groups, a.vocab_size) == (2, 64, 2, 128)
    assert a.add_qkv_bias and a.swiglu and a.normalization == "RMSNorm" and not a.untie_embeddings_and_output_weights


def test_a_named_model_flag_equal_to_its_default_beats_config_json(tmp_path, base):
    """config.json's router_aux_loss_coef 0.001 fills --moe-aux-loss-coeff only when the user did not name it: an
    explicit --moe-aux-loss-coeff 0 (the parser's default) is kept, as is an explicit --attention-dropout 0.1."""
    cfg = dict(TINY_QWEN2, model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], num_experts=4,
               num_experts_per_tok=2, moe_intermediate_size=32, router_aux_loss_coef=0.001, head_dim=16,
               attention_dropout=0.0)
    argv = drop(base, "--hf-checkpoint") + ["--hf-checkpoint", write_hf_dir(tmp_path / "moe", cfg)]
    assert parse(argv).moe_aux_loss_coeff == 0.001
    named = parse(argv + ["--moe-aux-loss-coeff", "0", "--attention-dropout", "0.1"])
    assert (named.moe_aux_loss_coeff, named.attention_dropout) == (0.0, 0.1)


def test_model_flags_checked_against_config_json(tmp_path, base):
    cfg = dict(TINY_QWEN2, tie_word_embeddings=False, rms_norm_eps=1e-5)
    hf = write_hf_dir(tmp_path / "other", cfg)
    argv = drop(base, "--hf-checkpoint") + ["--hf-checkpoint", hf, "--num-layers", "2", "--hidden-size", "64",
                                            "--num-attention-heads", "4", "--group-query-attention",
                                            "--num-query-groups", "2", "--ffn-hidden-size", "128",
                                            "--vocab-size", "128", "--norm-epsilon", "1e-6"]
    with pytest.raises(ConfigError) as e:
        parse(argv)
    msg = str(e.value)
    assert "--norm-epsilon 1e-06 but config.json has rms_norm_eps = 1e-05" in msg
    assert "--untie-embeddings-and-output-weights False" in msg
    assert "python -m slime_like.tools.model_args" in msg


def test_kl_coef_without_reward_kl_is_one_warning_and_needs_no_reference(base):
    """grpo ignores the reward-side KL: --kl-coef needs no --ref-load there and says so once at start-up."""
    a, report = parse_report(base + ["--kl-coef", "0.1"])
    said = [w for w in report.warnings if "--kl-coef 0.1 has no effect with --advantage-estimator grpo" in w]
    assert len(said) == 1 and "no reference model" in said[0]
    a, report = parse_report(base + ["--advantage-estimator", "reinforce_plus_plus_baseline", "--normalize-advantages",
                                     "--kl-coef", "0.1", "--ref-load", a.hf_checkpoint])
    assert not any("--kl-coef" in w for w in report.warnings)


def test_cuda_only_flags_warn_on_cpu(base, capsys):
    a, report = parse_report(base + ["--use-flash-attn"])
    assert any("--use-flash-attn is accepted but not honoured" in w for w in report.warnings)
    assert "--use-flash-attn is accepted but not honoured" in capsys.readouterr().err


def test_dropout_off_when_model_comes_from_config_json_and_warned_otherwise(base):
    a = parse(base)
    assert (a.attention_dropout, a.hidden_dropout) == (0.0, 0.0) and not a.add_bias_linear
    a, report = parse_report(base + ["--hidden-dropout", "0.05"])  # a value the user set is kept (and warned about)
    assert (a.attention_dropout, a.hidden_dropout) == (0.0, 0.05)
    assert any("log-probs will not match" in w for w in report.warnings)
    a, report = parse_report(base + ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                      "--group-query-attention", "--num-query-groups", "2", "--ffn-hidden-size", "128",
                      "--vocab-size", "128", "--norm-epsilon", "1e-6", "--swiglu"])
    assert a.attention_dropout == 0.1 and any("log-probs will not match" in w for w in report.warnings)


def test_num_epoch_derives_num_rollout(base, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join('{"input": "%d"}\n' % i for i in range(10)))
    argv = drop(base, "--num-rollout") + ["--prompt-data", str(data), "--num-epoch", "2"]
    assert parse(argv).num_rollout == 2 * 10 // 4
    with pytest.raises(ConfigError, match="--num-epoch needs JSONL or Parquet --prompt-data"):
        parse(drop(base, "--num-rollout") + ["--num-epoch", "2"])


def test_num_epoch_counts_parquet_rows(base, tmp_path):
    """slime's SFT recipes read Parquet with --num-epoch: the rows of its footer are the prompts counted."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "sft.parquet"
    pq.write_table(pa.table({"input": [f"q{i}" for i in range(13)], "label": ["a"] * 13}), data, row_group_size=5)
    argv = drop(base, "--num-rollout") + ["--prompt-data", str(data), "--num-epoch", "3"]
    args = parse(argv)
    assert args.num_rollout == 3 * 13 // 4 and args.num_rollout_per_epoch == 13 // 4
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(ConfigError, match="bad.parquet.*not a readable Parquet file"):
        parse(drop(argv, "--prompt-data") + ["--prompt-data", str(tmp_path / "bad.parquet")])


def test_save_and_eval_follow_slimes_periodic_rule(base, tmp_path):
    """Every interval, at each epoch end (--num-epoch), and a forced save after the last rollout (slime); weights
    pushed every --update-weights-interval rollouts."""
    from slime_like.ray.cadence import Cadence

    data = tmp_path / "train.jsonl"
    data.write_text("".join('{"input": "%d"}\n' % i for i in range(12)))  # 3 rollouts of 4 prompts per epoch
    args = parse(drop(base, "--num-rollout") + ["--prompt-data", str(data), "--num-epoch", "2", "--save-interval",
                                                "4", "--save", str(tmp_path / "ck"), "--eval-interval", "5",
                                                "--eval-prompt-data", "e", str(data), "--update-weights-interval", "2"])
    assert args.num_rollout == 6 and args.num_rollout_per_epoch == 3
    cadence = Cadence(args)
    assert [r for r in range(6) if cadence.save_due(r)] == [2, 3, 5]   # epoch end 3, interval 4, the last rollout
    assert [r for r in range(6) if cadence.eval_due(r)] == [2, 4, 5]   # epoch ends 3 and 6, interval 5
    assert [r for r in range(6) if cadence.push_due(r)] == [1, 3, 5]
    assert not cadence.background
    cadence = Cadence(parse(drop(base, "--num-rollout") + ["--num-rollout", "10", "--save-interval", "4", "--save",
                                                           str(tmp_path / "ck")]))  # no epochs: interval and the last
    assert [r for r in range(10) if cadence.save_due(r)] == [3, 7, 9]
    assert [r for r in range(10) if cadence.push_due(r)] == list(range(10))


def test_opd_sglang_needs_its_teacher_and_both_trainers_hold_a_megatron_type_teacher(base):
    _, report = parse_report(base + ["--use-opd", "--opd-type", "sglang"])
    assert any("--opd-type sglang: the samples need the teacher's log-probs" in w for w in report.warnings)
    with pytest.raises(ConfigError, match=r"--opd-type sglang with --custom-rm-path .* needs --rm-url"):
        parse(base + ["--use-opd", "--opd-type", "sglang", "--custom-rm-path",
                      "slime.rollout.on_policy_distillation.reward_func"])
    _, report = parse_report(base + ["--use-opd", "--opd-type", "sglang", "--custom-rm-path",
                                     "slime.rollout.on_policy_distillation.reward_func", "--rm-url",
                                     "http://127.0.0.1:1/generate"])
    report.refuse_at_launch()
    assert not any("teacher's log-probs" in w for w in report.warnings)
    teacher = ["--use-opd", "--opd-type", "megatron", "--opd-teacher-load", base[base.index("--hf-checkpoint") + 1]]
    for backend in ("megatron", "fsdp"):  # each trainer builds the frozen teacher (backends/*/trainer.py)
        for mode in ("sampled", "full"):
            refuse_at_launch(base + teacher + ["--train-backend", backend, "--opd-kl-mode", mode])


@pytest.mark.parametrize("extra, error", [
    (["--opd-type", "sglang"], r"--opd-kl-mode full with --opd-type sglang: .* use --opd-kl-mode sampled with it"),
    (["--opd-type", "megatron", "TEACHER", "--loss-type", "custom_loss", "--custom-loss-function-path", "m.f"],
     r"--opd-kl-mode full with --loss-type custom_loss: the KL term is added to the policy loss"),
    (["--opd-type", "megatron", "TEACHER", "--pipeline-model-parallel-size", "2"],
     r"--opd-kl-mode full with --pipeline-model-parallel-size 2: .* use --pipeline-model-parallel-size 1"),
])
def test_full_vocabulary_opd_is_refused_where_the_teacher_cannot_score_the_loss(base, extra, error):
    hf = base[base.index("--hf-checkpoint") + 1]
    extra = [x if x != "TEACHER" else f"--opd-teacher-load={hf}" for x in extra]
    with pytest.raises(ConfigError, match=error):
        parse(base + ["--use-opd", "--opd-kl-mode", "full"] + extra)


def test_opd_kl_mode_without_opd_is_an_error(base):
    with pytest.raises(ConfigError, match=r"--opd-kl-mode full is set but --use-opd is not: add --use-opd"):
        parse(base + ["--opd-kl-mode", "full"])


def test_max_staleness_defaults_to_one_in_fully_async_mode_and_warns_elsewhere(base):
    fn = ["--rollout-function-path", "slime.rollout.fully_async_rollout.generate_rollout_fully_async"]
    a, report = parse_report(base + fn)
    assert a.max_staleness == 1 and not any("--max-staleness" in w for w in report.warnings)
    report.refuse_at_launch()   # slime's own path names our function: not refused as a foreign slime module
    _, report = parse_report(base + ["--max-staleness", "2"])
    assert any("--max-staleness 2 has no effect" in w for w in report.warnings)
    _, report = parse_report(base + fn + ["--over-sampling-batch-size", "8"])
    assert any("--over-sampling-batch-size 8 has no effect with the fully async" in w for w in report.warnings)


def test_fault_tolerance_is_refused_only_where_it_cannot_restart_an_engine(base):
    refuse_at_launch(base + ["--use-fault-tolerance"])  # engines this run starts: honoured
    # behind a router (one named here, or the one started for two or more SGLang engines): honoured too, the
    # rollout health-checks each engine and tells the router (tests/loop/test_fault_tolerance_router.py)
    refuse_at_launch(base + ["--use-fault-tolerance", "--sglang-router-ip", "127.0.0.1",
                             "--sglang-router-port", "30000"])
    with pytest.raises(ConfigError, match="--use-fault-tolerance restarts the engines this run starts"):
        refuse_at_launch(base + ["--use-fault-tolerance", "--rollout-external-engine-addrs", "127.0.0.1:1"])
    with pytest.raises(ConfigError, match="--use-fault-tolerance restarts the engines this run starts"):
        refuse_at_launch(base + ["--use-fault-tolerance", "--rollout-external-engine-addrs", "127.0.0.1:1",
                                 "--sglang-router-ip", "127.0.0.1", "--sglang-router-port", "30000"])


def test_check_weight_update_equal_is_refused_where_no_engine_of_ours_answers(base):
    refuse_at_launch(base + ["--check-weight-update-equal"])  # the CPU engine / SGLang: allowed
    argv = base + ["--check-weight-update-equal", "--rollout-external-engine-addrs", "127.0.0.1:1"]
    with pytest.raises(ConfigError, match=r"--check-weight-update-equal with --rollout-external-engine-addrs: the "
                                          r"check overwrites the engines' weights"):
        refuse_at_launch(argv)
