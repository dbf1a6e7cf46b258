"""PPO actor + critic built from role views of one CLI + YAML overlay, and save -> load -> step == no break.

Each case runs in a fresh spawned process (one CPU rank).
"""
import os

import pytest
import torch
from _dist import run_ranks
from test_trainer_common import flat, make_args, make_batch

pytestmark = pytest.mark.slow

YAML = """megatron:
  - name: default
    role: actor
    overrides:
      lr: 1.0e-3
  - name: default
    role: critic
    overrides:
      lr: 4.0e-3
      lr_warmup_iters: 2
"""


def ppo_case(rank, world_size, port, ckpt, yaml_path, save_dir):
    from slime_like.args import role_args
    from slime_like.backends.megatron.trainer import MegatronTrainer

    args = make_args(ckpt, "--advantage-estimator", "ppo", "--use-critic", "--critic-num-gpus-per-node", 1,
                     "--megatron-config-path", yaml_path, "--global-batch-size", 8, "--micro-batch-size", 4,
                     "--gamma", 1.0, "--lambd", 1.0, "--value-clip", 0.5, "--save", save_dir)
    actor = MegatronTrainer(role_args(args, "actor"), role="actor", rank=rank, world_size=world_size,
                            master_port=port)
    critic = MegatronTrainer(role_args(args, "critic"), role="critic", rank=rank, world_size=world_size,
                             master_port=port)
    batch = make_batch(8, seed=7)
    batch["rewards"] = list(batch["raw_rewards"])  # ppo trains on the raw reward
    history = []
    for rollout in range(4):
        b = dict(batch)
        b.update(actor.compute_log_probs(b))
        b.update(critic.compute_values(b))
        b.update(actor.compute_advantages(b))
        history.append({"actor": actor.train_step(rollout, b), "critic": critic.train_step(rollout, b),
                        "values": b["values"], "returns": b["returns"]})
    dirs = (actor.save(3), critic.save(3))
    return {"history": history, "dirs": dirs}


def test_ppo_actor_and_critic_use_their_own_role_settings(tiny_ckpt, tmp_path):
    yaml_path = tmp_path / "ppo.yaml"
    yaml_path.write_text(YAML)
    out = run_ranks(ppo_case, 1, tiny_ckpt, str(yaml_path), str(tmp_path / "ckpt"))[0]
    hist = out["history"]
    # the YAML's lr reached each role's optimizer: actor constant 1e-3, critic warms up 0 -> 2e-3 -> 4e-3
    assert [h["actor"]["lr"] for h in hist] == pytest.approx([1e-3] * 4)
    assert [h["critic"]["lr"] for h in hist] == pytest.approx([0.0, 2e-3, 4e-3, 4e-3])
    assert {"value_loss", "values", "grad_norm"} <= set(hist[0]["critic"]) and "pg_loss" in hist[0]["actor"]
    # gamma = lambda = 1: returns are the reward-to-go (the reward), so the critic's loss must fall
    value_losses = [h["critic"]["value_loss"] for h in hist]
    assert value_losses[1] == pytest.approx(value_losses[0])        # warm-up step 0 has lr 0: no change
    assert max(value_losses[2:]) < 0.5 * value_losses[0], value_losses
    for h in hist:
        assert all(v.dim() == 1 and v.dtype == torch.float32 for v in h["values"])
    actor_dir, critic_dir = out["dirs"]
    assert critic_dir == actor_dir + "_critic"  # the critic saves to its own role's directory
    for d in out["dirs"]:
        assert open(os.path.join(d, "latest_checkpointed_iteration.txt")).read().strip() == "3"


def resume_case(rank, world_size, port, ckpt, save_dir, phase):
    from slime_like.args import role_args
    from slime_like.backends.megatron.trainer import MegatronTrainer

    flags = ["--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--lr-decay-iters", "6",
             "--global-batch-size", "4", "--num-steps-per-rollout", "2", "--micro-batch-size", "2",
             "--use-kl-loss", "--kl-loss-coef", "0.1", "--kl-loss-type", "low_var_kl", "--ref-load", ckpt,
             "--save", save_dir]
    if phase == "resume":
        flags += ["--load", save_dir]
    t = MegatronTrainer(role_args(make_args(ckpt, *flags), "actor"), role="actor", rank=rank,
                        world_size=world_size, master_port=port)

    def rollout(i):
        b = make_batch(8, seed=100 + i)
        b.update(t.compute_log_probs(b))
        b.update(t.compute_advantages(b))
        return t.train_step(i, b)

    if phase == "full":
        rollout(0)
        t.save(0)
    start = 1 if phase == "full" else t.loaded_rollout_id + 1
    metrics = [rollout(i) for i in range(start, start + 2)]
    return {"loaded": t.loaded_rollout_id, "metrics": metrics,
            "log_probs": t.compute_log_probs(make_batch(8, seed=999))["log_probs"]}


def test_save_load_one_more_step_equals_uninterrupted(tiny_ckpt, tmp_path):
    save_dir = str(tmp_path / "actor")
    full = run_ranks(resume_case, 1, tiny_ckpt, save_dir, "full")[0]
    resumed = run_ranks(resume_case, 1, tiny_ckpt, save_dir, "resume")[0]
    assert full["loaded"] is None and resumed["loaded"] == 0
    for a, b in zip(full["metrics"], resumed["metrics"]):
        for key in ("loss", "kl_loss", "grad_norm", "lr"):
            assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-9), key  # optimizer + LR schedule restored
    torch.testing.assert_close(flat(resumed["log_probs"]), flat(full["log_probs"]), atol=1e-6, rtol=1e-6)
    assert full["metrics"][0]["kl_loss"] > 0  # the reference stayed at the initial weights after the resume
