"""One short real run from a ROLL file: JSON-array data, disaggregated placement from device_mapping, the
reference on a GPU of its own (its own worker) feeding the actor's KL loss. Ray, CPU engine, megatron-core."""
import json
import os

import pytest

import train
from slime_like.utils.metrics import read_metrics

pytestmark = pytest.mark.slow


def test_roll_file_with_a_reference_worker_runs(tiny_ckpt, toy_prompts, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # ROLL's default output_dir ./output (checkpoints) lands there
    rows = [json.loads(line) for line in open(toy_prompts[0])]
    data = tmp_path / "train.json"
    data.write_text(json.dumps([{"prompt": r["prompt"], "ground_truth": r["label"]} for r in rows]))
    config = tmp_path / "rlvr.yaml"
    config.write_text(f"""
seed: 1
num_gpus_per_node: 4
max_steps: 3
rollout_batch_size: 8
prompt_length: 32
response_length: 4
num_return_sequences_in_group: 8
adv_estimator: grpo
use_kl_loss: true
kl_loss_coef: 0.1
pretrain: {tiny_ckpt}
actor_train:
  training_args: {{learning_rate: 1.0e-2, per_device_train_batch_size: 64, gradient_accumulation_steps: 1}}
  data_args: {{template: plain, file_name: {data}, prompt: prompt}}
  strategy_args: {{strategy_name: megatron_train}}
  device_mapping: [0]
actor_infer:
  generating_args: {{max_new_tokens: "${{response_length}}", temperature: 1.0}}
  strategy_args: {{strategy_name: hf_infer}}
  device_mapping: [1]
reference:
  strategy_args: {{strategy_name: megatron_infer}}
  device_mapping: [2]
rewards:
  toy: {{worker_cls: toy_task.digit_share}}
""")
    assert train.main(["--config", str(config), "--lr-decay-style", "constant", "--ref-load", tiny_ckpt,
                       "--run-dir", str(tmp_path / "run")]) == 0
    got = [r for r in read_metrics(str(tmp_path / "run" / "metrics.jsonl")) if r["rollout_id"] >= 0]
    assert [r["rollout_id"] for r in got] == [0, 1, 2]
    assert got[0]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # same weights as the reference
    assert got[-1]["actor/kl_loss"] > 1e-5  # the actor moved; ref log-probs came from the reference worker
    assert os.path.isdir(tmp_path / "output" / "checkpoints")  # ROLL's defaults: output_dir ./output, saved at the end
