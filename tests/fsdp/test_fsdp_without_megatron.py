"""`pip install ".[fsdp]"` trains without megatron-core: a PPO actor and critic on --train-backend fsdp take
optimizer steps (cosine LR schedule with warm-up), save and resume, in a process where every `import megatron...`
raises ImportError (a sys.meta_path finder installed before anything of ours is imported)."""
import json
import math
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

SCRIPT = r"""
import importlib.abc, json, sys


class NoMegatron(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "megatron" or name.startswith("megatron."):
            raise ImportError(f"No module named {name!r} (megatron-core is not installed)")
        return None


sys.meta_path.insert(0, NoMegatron())
sys.path[:0] = [sys.argv[1], sys.argv[2]]  # tests/fsdp (its helpers), tests/megatron (the shared batch builders)
import torch
from _fsdp_common import make_args, make_batch
from slime_like.args import role_args
from slime_like.backends.fsdp.trainer import FSDPTrainer
from slime_like.utils.net import free_port

ckpt, save = sys.argv[3], sys.argv[4]
args = make_args(ckpt, "--advantage-estimator", "ppo", "--use-critic", "--critic-num-gpus-per-node", "1",
                 "--lr", "2e-3", "--lr-decay-style", "cosine", "--lr-warmup-iters", "1", "--lr-decay-iters", "4",
                 "--min-lr", "1e-4", "--global-batch-size", "8", "--micro-batch-size", "4", "--save", save)
port = free_port()


def build(a):
    actor = FSDPTrainer(role_args(a, "actor"), role="actor", rank=0, world_size=1, master_port=port)
    critic = FSDPTrainer(role_args(a, "critic"), role="critic", rank=0, world_size=1, master_port=port)
    return actor, critic


actor, critic = build(args)
batch = make_batch(8, seed=7)
batch["rewards"] = list(batch["raw_rewards"])
before = [p.detach().clone() for p in actor.model.parameters()]
out = {"metrics": []}
for rollout in range(2):
    b = dict(batch)
    b.update(actor.compute_log_probs(b))
    b.update(critic.compute_values(b))
    b.update(actor.compute_advantages(b))
    out["metrics"].append({"actor": actor.train_step(rollout, b), "critic": critic.train_step(rollout, b)})
out["moved"] = max(float((p.detach() - q).abs().max()) for p, q in zip(actor.model.parameters(), before))
actor.save(1), critic.save(1)
args.load = save
resumed_actor, resumed_critic = build(args)
out["resumed"] = [resumed_actor.loaded_rollout_id, resumed_critic.loaded_rollout_id]
out["resumed_lr"] = resumed_actor.optimizer.param_groups[0]["lr"]
out["lr_after"] = actor.optimizer.param_groups[0]["lr"]
out["megatron_imported"] = sorted(m for m in sys.modules if m == "megatron" or m.startswith("megatron."))
print("RESULT " + json.dumps(out))
"""


def test_fsdp_ppo_trains_saves_and_resumes_with_megatron_blocked(tiny_ckpt, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, HERE, os.path.join(os.path.dirname(HERE), "megatron"),
                           tiny_ckpt, str(tmp_path / "ckpt")], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    out = json.loads(line[len("RESULT "):])
    assert out["megatron_imported"] == []
    assert out["moved"] > 0
    (s0, s1) = out["metrics"]
    for step in (s0, s1):
        assert step["actor"]["num_steps"] == 1 and step["actor"]["grad_norm"] > 0
        assert math.isfinite(step["critic"]["value_loss"]) and step["critic"]["grad_norm"] > 0
    # cosine with one warm-up step over 4: step 0 at lr_warmup_init (0), step 1 at the peak
    assert (s0["actor"]["lr"], s1["actor"]["lr"]) == (0.0, pytest.approx(2e-3))
    assert out["resumed"] == [1, 1]
    assert out["resumed_lr"] == out["lr_after"]  # the schedule resumes where it stopped
