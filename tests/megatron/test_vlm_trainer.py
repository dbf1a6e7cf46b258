"""MegatronTrainer on a tiny vision-language model (Qwen2.5-VL, Qwen3-VL): each sample's `multimodal_train_inputs`
reach the HF vision tower inside the trainer.

- log-probs of multimodal samples equal transformers' log-softmax (fp32, < 1e-4), in padded and packed micro-batches
  and at TP=2 (the tower replicated); a different image changes them, a text sample's stay put;
- GRPO steps move the log-probs the advantage's way and train the tower (its pushed tensors change), or keep it
  frozen under --freeze-vision-tower (then the weight push leaves the tower out).
"""
import pytest
import torch
from _dist import run_ranks
from _vlm import build_tiny_vlm, hf_logits, sample
from test_trainer_common import BASE_FLAGS, flat

FAMILIES = ["qwen2_5_vl", "qwen3_vl"]


@pytest.fixture(scope="module")
def vlm_ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_vlm_trainer")
    return {f: build_tiny_vlm(root / f, f, tie=f == "qwen3_vl") for f in FAMILIES}


def vlm_batch(ckpt, seed=0, pixel_shift=0.0):
    """4 samples: two with one image, one with two, one text-only; 3-5 response tokens; rewards -1 / +1."""
    shapes = [[(1, 4, 4)], [(1, 4, 6), (1, 4, 4)], [(1, 8, 4)], []]
    b = {k: [] for k in ("tokens", "response_lengths", "loss_masks", "rewards", "raw_rewards", "rollout_log_probs",
                         "sample_indices", "truncated", "multimodal_train_inputs")}
    for i, grids in enumerate(shapes):
        ids, mm = sample(ckpt, grids, 3 + i, 0, seed=seed + i)
        if not grids:
            mm = None
        elif pixel_shift:
            mm = dict(mm, pixel_values=mm["pixel_values"] + pixel_shift)
        r = 3 + i % 3
        response = torch.randint(3, 60, (r,), generator=torch.Generator().manual_seed(100 + i)).tolist()
        b["tokens"].append(ids + response)
        b["response_lengths"].append(r)
        b["loss_masks"].append([1] * r)
        b["rewards"].append(1.0 if i % 2 else -1.0)
        b["raw_rewards"].append(float(i % 2))
        b["rollout_log_probs"].append([-4.0] * r)
        b["sample_indices"].append(i)
        b["truncated"].append(0)
        b["multimodal_train_inputs"].append(mm)
    return b


def _trainer(ckpt, rank, world, port, *flags):
    from slime_like.args import make_args, role_args
    from slime_like.backends.megatron.trainer import MegatronTrainer

    args = make_args("--hf-checkpoint", ckpt, *BASE_FLAGS, "--global-batch-size", "4", "--micro-batch-size", "2",
                     "--actor-num-gpus-per-node", str(world), *flags, validate=True)
    return MegatronTrainer(role_args(args, "actor"), role="actor", rank=rank, world_size=world, master_port=port)


def hf_response_log_probs(ckpt, batch):
    out = []
    for toks, r, mm in zip(batch["tokens"], batch["response_lengths"], batch["multimodal_train_inputs"]):
        logp = torch.log_softmax(hf_logits(ckpt, toks, mm).float(), -1)[:-1]
        out.append(logp.gather(-1, torch.tensor(toks[1:])[:, None])[:, 0][-r:])
    return out


def log_prob_case(rank, world, port, ckpt, family, flags):
    t = _trainer(ckpt, rank, world, port, *flags)
    batch = vlm_batch(ckpt)
    ours = t.compute_log_probs(batch)["log_probs"]
    other = t.compute_log_probs(vlm_batch(ckpt, pixel_shift=1.0))["log_probs"]
    return dict(ours=ours, other=other, hf=hf_response_log_probs(ckpt, batch) if rank == 0 else None)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("layout", ["padded", "packed", "tp2"])
def test_vlm_log_probs_equal_transformers(vlm_ckpts, family, layout):
    flags = {"padded": [], "packed": ["--use-dynamic-batch-size", "--max-tokens-per-gpu", "256"],
             "tp2": ["--tensor-model-parallel-size", "2"]}[layout]
    world = 2 if layout == "tp2" else 1
    out = run_ranks(log_prob_case, world, vlm_ckpts[family], family, flags, timeout=600)[0]
    diff = (flat(out["ours"]) - flat(out["hf"])).abs().max().item()
    print(f"{family} {layout}: max |log-prob - transformers| = {diff:.1e}")
    assert diff < 1e-4, diff
    moved = [(a - b).abs().max().item() for a, b in zip(out["ours"], out["other"])]
    assert min(moved[:3]) > 1e-4 and moved[3] == 0.0, moved  # images matter; the text-only sample is unchanged


def train_case(rank, world, port, ckpt, family, flags):
    t = _trainer(ckpt, rank, world, port, "--lr", "3e-3", "--rollout-batch-size", "2", "--num-steps-per-rollout", "1",
                 *flags)
    batch = vlm_batch(ckpt)

    from slime_like.backends.megatron.hf_weights import unwrap

    def tower():
        return {n: w.detach().clone() for n, w in unwrap(t.chunks[0]).visual.named_parameters()}

    pushed_tower = sum(n.startswith("model.visual.") for n, _ in t.iter_hf_weights())
    before_tower = tower()
    batch.update(t.compute_log_probs(batch))
    before = [lp.sum().item() for lp in batch["log_probs"]]
    batch.update(t.compute_advantages(batch))
    metrics = [t.train_step(i, batch) for i in range(3)]
    after = [lp.sum().item() for lp in t.compute_log_probs(batch)["log_probs"]]
    after_tower = tower()
    changed = max((after_tower[n] - w).abs().max().item() for n, w in before_tower.items())
    return dict(before=before, after=after, rewards=batch["rewards"], metrics=metrics, tower_changed=changed,
                pushed_tower=pushed_tower)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_vlm_grpo_trains_the_tower(vlm_ckpts, family):
    out = run_ranks(train_case, 1, vlm_ckpts[family], family, [], timeout=600)[0]
    for b, a, r in zip(out["before"], out["after"], out["rewards"]):
        assert (a - b) * r > 0, out  # log-probs follow the advantage's sign
    assert out["metrics"][0]["grad_norm"] > 0
    assert out["pushed_tower"] > 10 and out["tower_changed"] > 1e-4, out


@pytest.mark.slow
def test_vlm_frozen_tower_stays_and_is_not_pushed(vlm_ckpts):
    out = run_ranks(train_case, 1, vlm_ckpts["qwen2_5_vl"], "qwen2_5_vl", ["--freeze-vision-tower"], timeout=600)[0]
    for b, a, r in zip(out["before"], out["after"], out["rewards"]):
        assert (a - b) * r > 0, out
    assert out["pushed_tower"] == 0 and out["tower_changed"] == 0.0, out  # the push leaves the frozen tower out


def test_vlm_launch_check_names_what_the_tower_cannot_run_under(vlm_ckpts):
    from slime_like.args import make_args
    from slime_like.config.errors import ConfigError

    ckpt = vlm_ckpts["qwen2_5_vl"]  # 2 layers: PP=2 divides them
    with pytest.raises(ConfigError) as e:
        make_args("--hf-checkpoint", ckpt, *BASE_FLAGS, "--actor-num-gpus-per-node", "4",
                  "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--sequence-parallel",
                  validate=True)
    msg = str(e.value)
    assert "vision-language" in msg and "--pipeline-model-parallel-size 2" in msg and "--sequence-parallel" in msg
    with pytest.raises(ConfigError, match="--context-parallel-size 2: M-RoPE positions"):
        make_args("--hf-checkpoint", ckpt, *BASE_FLAGS, "--actor-num-gpus-per-node", "2",
                  "--context-parallel-size", "2", validate=True)
    make_args("--hf-checkpoint", ckpt, *BASE_FLAGS, "--actor-num-gpus-per-node", "2", "--tensor-model-parallel-size",
              "2", validate=True)  # TP alone is fine
