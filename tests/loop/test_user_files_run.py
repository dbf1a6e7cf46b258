"""The held-out RLinf and ROLL files (tests/config/frontend_files/heldout/: the frameworks' own published configs,
model / data paths changed) train for real on CPU: the toy task's data carries the label column the file names,
so rewards are non-zero. Only sizes are overridden on the command line (dotted keys), as a user shrinks a recipe to
try it; everything else is the file's (and, for keys it leaves out, its framework's defaults)."""
import importlib.util
import json
import os

import pytest

import toy_task
import train
from slime_like.utils.metrics import read_metrics

pytestmark = pytest.mark.slow

HELDOUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "config", "frontend_files",
                       "heldout")


def _rewards(run_dir):
    got = [r for r in read_metrics(str(run_dir)) if r["rollout_id"] >= 0]
    assert [r["rollout_id"] for r in got] == [0, 1]
    return [r["rollout/reward"] for r in got]


def test_rlinf_reference_file_trains(tiny_ckpt, toy_prompts, tmp_path, monkeypatch):
    monkeypatch.setenv("HELDOUT_MODEL", tiny_ckpt)
    monkeypatch.setenv("HELDOUT_DATA", toy_prompts[0])
    monkeypatch.chdir(tmp_path)
    # 4 GPU slots as every loop test declares (one test process keeps one private Ray), the run on slot 0
    small = ["cluster.num_nodes=1", "cluster.num_gpus_per_node=4", "cluster.component_placement={'actor,rollout': 0}",
             "actor.model.tensor_model_parallel_size=1",
             "actor.model.precision=fp32", "actor.optim.fp16=false", "actor.model.recompute_granularity=null",
             "actor.model.recompute_method=null", "actor.model.recompute_num_layers=null",
             f"runner.seq_length={32 + toy_task.MAX_RESPONSE_LEN}", "data.max_prompt_length=32",
             "runner.max_steps=2", "runner.val_check_interval=-1", "data.rollout_batch_size=8",
             "algorithm.group_size=8", "algorithm.n_minibatches=1", "algorithm.training_batch_size_per_gpu=64",
             "actor.optim.lr=1e-2", "actor.lr_sched.max_lr=1e-2",
             # the toy task's data: the answer in 'label', its reward function
             "data.answer_key=label", "reward.reward_type=toy_task.digit_share"]
    assert train.main(["--config", os.path.join(HELDOUT, "rlinf_grpo_megatron.yaml"), *small]) == 0
    run_dir = tmp_path.parent / "results" / "grpo-1.5b"  # runner.output_dir ../results, from the working directory
    rewards = _rewards(run_dir)
    assert all(r != 0 for r in rewards), rewards
    # the run's own summary draws the curve where the metrics are: the file's output_dir / experiment_name
    assert os.path.isfile(run_dir / "learning_curve.png") == (importlib.util.find_spec("matplotlib") is not None)


def test_roll_docs_file_trains(tiny_ckpt, toy_prompts, tmp_path, monkeypatch):
    rows = [json.loads(line) for line in open(toy_prompts[0])]
    data = tmp_path / "train.json"
    data.write_text(json.dumps([{"instruction": r["prompt"], "ground_truth": r["label"]} for r in rows]))
    monkeypatch.setenv("HELDOUT_MODEL", tiny_ckpt)
    monkeypatch.setenv("HELDOUT_DATA", str(data))
    monkeypatch.chdir(tmp_path)
    small = ["num_gpus_per_node=4", "actor_train.device_mapping=[0]", "actor_infer.device_mapping=[0]",
             "reference.device_mapping=[0]", "actor_train.model_args.dtype=fp32", "max_steps=2",
             "rollout_batch_size=8", f"response_length={toy_task.MAX_RESPONSE_LEN}", "prompt_length=32",
             "actor_train.training_args.per_device_train_batch_size=64",
             "actor_train.training_args.gradient_accumulation_steps=1", "actor_train.training_args.warmup_steps=0",
             "actor_train.data_args.template=plain", "rewards.toy.worker_cls=toy_task.digit_share",
             "--rollout-engine", "cpu"]  # the file's vllm: our flag after the file picks the CPU engine
    assert train.main(["--config", os.path.join(HELDOUT, "roll_rlvr_docs.yaml"), *small]) == 0
    rewards = _rewards(tmp_path / "output")  # output_dir: ROLL's default ./output
    assert all(r != 0 for r in rewards), rewards
