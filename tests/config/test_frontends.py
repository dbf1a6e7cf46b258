"""--config FILE.yaml: RLinf (seeds 001 / 002) and ROLL (seed 003) files translate into our flags, dry-run with
the plan of their placement, and bad files fail with one line naming the dotted key, before Ray starts."""
import os
import subprocess
import sys

import pytest

from cfg_helpers import parse, parse_report
from slime_like.config.dry_run import dry_run_text
from slime_like.config.errors import ConfigError
from slime_like.plan import build_plan

HERE = os.path.dirname(os.path.abspath(__file__))
FILES = os.path.join(HERE, "frontend_files")
ROOT = os.path.dirname(os.path.dirname(HERE))
RLINF1, RLINF2, ROLL3 = (os.path.join(FILES, f) for f in ("rlinf_seed001.yaml", "rlinf_seed002.yaml",
                                                           "roll_seed003.yaml"))


@pytest.fixture
def paths(tmp_path, hf_dir):
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    return {"hf": hf_dir, "data": str(data)}


def rlinf_placeholders(p, key="rollout.model_dir"):
    return [f"{key}={p['hf']}", f"actor.tokenizer.tokenizer_model={p['hf']}",
            f"data.train_data_paths=[{p['data']}]", f"data.val_data_paths=[{p['data']}]", "data.answer_key=answer"]


def roll_placeholders(p):
    return [f"pretrain={p['hf']}", f"actor_train.data_args.file_name={p['data']}", "max_steps=10",
            f"rewards={{math: {{worker_cls: {ROLL_MATH}}}}}", "adv_estimator=grpo"]


ROLL_MATH = "roll.pipeline.rlvr.rewards.math_rule_reward_worker.MathRuleRewardWorker"


def dry(argv):
    args, report = parse_report(argv)
    return args, report, dry_run_text(args, build_plan(args), report)


def test_rlinf_seed001_dry_run(paths):
    args, report, out = dry(["--config", RLINF1, *rlinf_placeholders(paths)])
    assert "-- equivalent command line (rlinf file" in out
    for line in ("--n-samples-per-prompt 2", "--num-steps-per-rollout 4", "--early-stop-imp-ratio 5.0",
                 "--loss-micro-batch-mean", "--reward-scale 5.0", "--rollout-max-response-len 1024",
                 "--rollout-min-new-tokens 1", "--kl-loss-type low_var_kl", f"--save {os.path.dirname(ROOT)}/results/grpo-1.5b/checkpoints",
                 "--placement actor,rollout:all", "--lr 2e-05", "--eval-shuffle"):
        assert f"    {line}" in out, line
    # ${subtract:${runner.seq_length}, ${data.max_prompt_length}} = 2048 - 1024
    assert args.rollout_max_response_len == 1024 and args.n_samples_per_prompt == 2 and args.fp16
    assert "gpu 0 (bundle   0): actor0 + engine0" in out and "colocated" in out
    assert any("actor.megatron.ckpt.process_num=16" in w and "no effect" in w for w in report.warnings)


def test_rlinf_seed002_dry_run(paths):
    args, report, out = dry(["--config", RLINF2, *rlinf_placeholders(paths, "rollout.model.model_path")])
    assert args.rollout_min_new_tokens == 1 and args.rollout_max_response_len == 1024
    assert any("actor.fsdp_config" in w and "training_backend: fsdp" in w for w in report.warnings)
    assert "actor0 + engine0" in out


def test_roll_seed003_dry_run(paths):
    base = ["--config", ROLL3, *roll_placeholders(paths)]
    # actor_infer strategy vllm -> our vLLM engine, its strategy_config -> --vllm-* flags
    args, _, out = dry(base)
    assert args.rollout_engine == "vllm" and args.vllm_gpu_memory_utilization == 0.6 and args.vllm_block_size == 16
    assert "    --rollout-engine vllm \\" in out and "    --vllm-gpu-memory-utilization 0.6 \\" in out
    assert "engine: vllm" in out
    # the user's flag after the file picks another engine: the vLLM settings are said to be unused
    args, report, out = dry(base + ["--rollout-engine", "cpu"])
    assert any("--vllm-gpu-memory-utilization" in w and "no effect, the rollout engine is cpu" in w
               for w in report.warnings)  # the vLLM settings are said to be unused, not dropped silently
    assert args.global_batch_size == 512 and args.n_samples_per_prompt == 8 and args.lr == 1e-6 and args.bf16
    assert args.rollout_max_response_len == 4096 and args.apply_chat_template  # template: native
    assert "--placement actor:0-15 rollout:0-15 reference:0-15" in out
    assert "2 node(s) x 8 GPU slots, colocated" in out and "gpu 7 (bundle  15): actor15 + engine15" in out
    assert "reference: on the actor's GPUs" in out


def test_offload_and_logger_keys(paths):
    base = ["--config", RLINF1, *rlinf_placeholders(paths)]
    assert parse(base).offload_train is True
    off = parse(base + ["actor.offload_optimizer=false", "actor.offload_weight=false", "actor.offload_grad=false"])
    assert off.offload_train is False and off.colocate
    args = parse(base + ["runner.logger.logger_backends=[wandb]", "runner.logger.wandb.enable=false",
                         "runner.logger.tensorboard.enable=false"])
    assert args.use_wandb and not args.use_tensorboard


def test_overrides_and_precedence(paths):
    base = ["--config", RLINF1, *rlinf_placeholders(paths)]
    assert parse(base + ["algorithm.group_size=8"]).n_samples_per_prompt == 8
    assert parse(base + ["--n-samples-per-prompt", "4"]).n_samples_per_prompt == 4      # after the file: wins
    assert parse(["--n-samples-per-prompt", "4"] + base).n_samples_per_prompt == 2      # before: the file wins
    args = parse(base + ["actor.optim.lr=1e-6", "actor.lr_sched.max_lr=1e-6", "--config-format", "rlinf"])
    assert args.lr == 1e-6


def test_several_train_files(paths, tmp_path):
    second = tmp_path / "more.jsonl"
    second.write_text('{"prompt": "2+2=", "answer": "4"}\n{"prompt": "3+3=", "answer": "6"}\n')
    args = parse(["--config", RLINF1, *rlinf_placeholders(paths), f"data.train_data_paths=[{paths['data']}, {second}]"])
    assert args.prompt_data == paths["data"] and args.prompt_data_extra == [str(second)]
    assert args.num_rollout == 1  # --num-epoch 5 x 3 prompts // 64
    with pytest.raises(ConfigError, match=r"data.train_data_paths \[--prompt-data-extra\] .*/nope.jsonl: no such file"):
        parse(["--config", RLINF1, *rlinf_placeholders(paths), f"data.train_data_paths=[{paths['data']}, nope.jsonl]"])


def test_disaggregated_placements(paths):
    rl = ["--config", RLINF1, *rlinf_placeholders(paths), "cluster.num_gpus_per_node=4",
          "cluster.component_placement={actor: 0-1, rollout: 2-3}"]
    args, _, out = dry(rl)
    assert not args.colocate and args.actor_num_gpus_per_node == 2 and args.rollout_num_gpus == 2
    assert "gpu 1 (bundle   1): actor1" in out and "gpu 3 (bundle   3): engine1" in out
    ro = ["--config", ROLL3, *roll_placeholders(paths), "--rollout-engine", "cpu", "num_gpus_per_node=4",
          "actor_train.device_mapping=list(range(0,4))", "actor_infer.device_mapping=[4,5,6,7]",
          "reference.device_mapping=list(range(0,4))", "actor_train.training_args.gradient_accumulation_steps=8"]
    args, _, out = dry(ro)
    assert not args.colocate and args.actor_num_gpus_per_node == 4 and args.rollout_num_gpus == 4
    assert "node 1:" in out and "gpu 3 (bundle   7): engine3" in out


def test_placement_flag_for_slime_users(base):
    flags = [f for f in base if f != "--colocate"]
    args = parse(flags + ["--num-gpus-per-node", "4", "--placement", "actor:0-1", "rollout:2-3"])
    plan = build_plan(args)
    assert plan.actor_slots == [0, 1] and plan.engine_slots == [[2], [3]] and not plan.colocate
    args = parse(flags + ["--num-gpus-per-node", "4", "--advantage-estimator", "ppo",
                          "--placement", "actor,rollout:0-1", "critic:2-3"])
    plan = build_plan(args)
    assert plan.colocate and plan.critic_slots == [2, 3] and plan.engine_slots == [[0], [1]]
    with pytest.raises(ConfigError, match="the critic on the actor's GPUs without the engines there"):
        parse(flags + ["--num-gpus-per-node", "4", "--advantage-estimator", "ppo",
                       "--placement", "actor,critic:0-1", "rollout:2-3"])
    with pytest.raises(ConfigError, match="--placement sets the GPUs of every component; drop --colocate"):
        parse(base + ["--placement", "actor,rollout:0-1"])


def test_rlinf_fsdp_backend_selects_the_fsdp_trainer(paths):
    args = parse(["--config", RLINF1, *rlinf_placeholders(paths), "actor.training_backend=fsdp",
                  "actor.model.tensor_model_parallel_size=1", "actor.model.pipeline_model_parallel_size=1",
                  "actor.model.precision=bf16", "actor.optim.fp16=False", "actor.optim.bf16=True"])
    assert args.train_backend == "fsdp"


@pytest.mark.parametrize("extra, message", [
    (["actor.model.tensor_model_paralel_size=2"],
     r"actor.model.tensor_model_paralel_size: unknown key \(did you mean tensor_model_parallel_size\?\)"),
    (["algorithm.sampling_params.temprature=0.5"],
     r"algorithm.sampling_params.temprature: unknown key \(did you mean temperature\?\)"),
    (["runnr.max_steps=3"], r"runnr: unknown key \(did you mean runner\?\)"),
    (["algorithm.group_size=eight"], r"algorithm.group_size \[--n-samples-per-prompt\]: expected an integer, got 'eight'"),
    (["runner.seq_length=${runner.seq_len}"], r"key 'runner.seq_length': cannot resolve its interpolation"),
    (["cluster.component_placement={actor: 0-1, rollout: 1-2}", "cluster.num_gpus_per_node=4"],
     r"rollout on GPUs 1-2 overlaps the actor on 0-1 only in part"),
    (["cluster.component_placement={actor: 0-1, rollout: 2-3}"],
     r"--placement: actor on GPU 1, outside the cluster of 1 node\(s\) x 1 GPUs"),
    (["actor.training_backend=fsdp", "actor.model.tensor_model_parallel_size=2",
      "inference.model.tensor_model_parallel_size=2"],
     r"actor.model.tensor_model_parallel_size \[--tensor-model-parallel-size\] 2 is Megatron parallelism; "
     r"--train-backend fsdp"),
    # errors the parser / validation find later still name the key the flag came from
    (["actor.lr_sched.lr_decay_style=fancy"],
     r"argument actor.lr_sched.lr_decay_style \[--lr-decay-style\]: invalid choice"),
    (["algorithm.sampling_params.min_new_tokens=2000"],
     r"algorithm.sampling_params.min_new_tokens \[--rollout-min-new-tokens\] 2000 exceeds"),
])
def test_bad_rlinf_files_fail_in_one_line(paths, extra, message):
    with pytest.raises(ConfigError, match=message) as err:
        parse(["--config", RLINF1, *rlinf_placeholders(paths), *extra])
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("extra, message", [
    (["actor_infer.device_mapping=[16,17]"], r"rollout on GPU 16, outside the cluster of 2 node\(s\)"),
    (["critic.device_mapping=list(range(0,2))", "adv_estimator=gae"], r"critic on GPUs 0-1 overlaps actor"),
    (["reference.device_mapping=[0,1,x]"], r"reference.device_mapping: device ids must be integers, got 'x'"),
    (["reference.device_mapping=list(range(0,n))"], r"reference.device_mapping: cannot read 'list\(range\(0,n\)\)'"),
    (["actor_train.strategy_args.strategy_config.tensor_model_paralel_size=2"],
     r"strategy_config.tensor_model_paralel_size: unknown key \(did you mean tensor_model_parallel_size\?\)"),
    (["actor_train.model_args.dtype=bf17"], r"actor_train.model_args.dtype: 'bf17': use fp32, bf16 or fp16"),
])
def test_bad_roll_files_fail_in_one_line(paths, extra, message):
    with pytest.raises(ConfigError, match=message):
        parse(["--config", ROLL3, *roll_placeholders(paths), "--rollout-engine", "cpu", "--num-nodes", "2", *extra])


def test_format_detection_and_stray_overrides(tmp_path, base):
    odd = tmp_path / "odd.yaml"
    odd.write_text("foo: 1\n")
    with pytest.raises(ConfigError, match="cannot tell RLinf from ROLL"):
        parse(["--config", str(odd)])
    with pytest.raises(ConfigError, match="dotted overrides need --config"):
        parse(base + ["algorithm.group_size=8"])


def test_device_grammar_needs_no_eval():
    from slime_like.config.frontends.common import parse_devices

    assert parse_devices("list(range(0,16))", "k") == list(range(16))
    assert parse_devices("list(range(4, 12, 2))", "k") == [4, 6, 8, 10]
    assert parse_devices("0-3,6", "k") == [0, 1, 2, 3, 6] and parse_devices([1, 2], "k") == [1, 2]
    assert parse_devices("all", "k", total=4) == [0, 1, 2, 3]
    for bad in ("__import__('os')", "list(range(0,4)) + [9]", "3-1", "[0, 0]"):
        with pytest.raises(ConfigError):
            parse_devices(bad, "k")


def test_sglang_config_refuses_a_framework_file(base):
    with pytest.raises(ConfigError, match=r"this is an RLinf training config .* pass it as --config"):
        parse(base + ["--rollout-engine", "cpu", "--sglang-config", RLINF1])


def test_config_to_flags_recipe_runs_to_the_same_config(paths, tmp_path):
    """The bash recipe the tool writes parses to the same Namespace as --config itself (a real subprocess)."""
    script = tmp_path / "run.sh"
    tool = [sys.executable, "-m", "slime_like.tools.config_to_flags", RLINF1, *rlinf_placeholders(paths), "-o",
            str(script)]
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run(tool, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    text = script.read_text()
    tokens = text.split("CONFIG_ARGS=(")[1].split(")\n")[0].split()
    via_file = vars(parse(["--config", RLINF1, *rlinf_placeholders(paths)]))
    via_recipe = vars(parse(tokens))
    skip = {"config", "run_dir", "cli_dests"}  # cli_dests: provenance
    assert {k: v for k, v in via_file.items() if k not in skip} == {k: v for k, v in via_recipe.items() if k not in skip}
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_roll_critic_becomes_the_critic_role_overlay(paths):
    args, _, out = dry(["--config", ROLL3, *roll_placeholders(paths), "--rollout-engine", "cpu", "adv_estimator=gae",
                     "critic.training_args.learning_rate=5e-6", "critic.strategy_args.strategy_name=megatron_train",
                     "critic.device_mapping=list(range(0,16))"])
    assert args.use_critic and args.advantage_estimator == "ppo"
    assert args.megatron_role_overrides["critic"] == {"lr": 5e-6}
    assert "  --megatron-config-path ROLES.yaml, where ROLES.yaml is:" in out and "overrides: {lr: 5e-06}" in out
    from slime_like.args import role_args

    assert role_args(args, "critic").lr == 5e-6 and role_args(args, "actor").lr == 1e-6
    assert "actor0 + critic0 + engine0" in out


def test_train_async_takes_a_config_file(paths):
    """train_async.py shares the parser: a disaggregated RLinf file dry-runs there too (colocation is refused)."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    cmd = [sys.executable, "train_async.py", "--config", RLINF1, *rlinf_placeholders(paths),
           "cluster.num_gpus_per_node=2", "cluster.component_placement={actor: 0, rollout: 1}", "--dry-run"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "gpu 1 (bundle   1): engine0" in r.stdout and "Traceback" not in r.stderr


def test_every_schema_rule_gives_its_reason():
    """The three-way contract of the flags, for file keys: each accepted-but-unused or refused key says why."""
    from slime_like.config.frontends import rlinf, roll
    from slime_like.config.frontends.common import Free, Map, NoEffect, Read, Refuse

    def leaves(node, path=""):
        if isinstance(node, Free):
            yield from leaves(node.rule, path + ".*")
        elif isinstance(node, dict):
            for key, child in node.items():
                yield from leaves(child, f"{path}.{key}" if path else key)
        else:
            yield path, node

    for schema in (rlinf.SCHEMA, roll.SCHEMA):
        for path, rule in leaves(schema):
            assert isinstance(rule, (Map, Read, NoEffect, Refuse)), path
            if not isinstance(rule, Map):
                assert len(rule.why) > 10, f"{path}: {type(rule).__name__} needs a reason"
