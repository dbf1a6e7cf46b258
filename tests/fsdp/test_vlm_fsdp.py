"""The FSDP trainer on tiny random Qwen2.5-VL and Qwen3-VL (issue 30), in real gloo processes.

- Log-probs of multimodal samples (one image, two images, a text sample, several image sizes; several samples per
  micro-batch, padded rows; and --use-dynamic-batch-size) equal transformers' own forward of each sample alone
  (fp32, < 1e-4), and not the forward with 1-D positions: the M-RoPE positions are transformers' get_rope_index.
- Another image in one sample changes that sample's log-probs only: the image reached the trainer.
- One GRPO step trains the vision tower, or with --freeze-vision-tower leaves it bit-identical while the language
  model moves; the weight push carries the tower only when it trains, under the names of the HF model (loaded
  into transformers' model by the CPU engine's own loader, which then scores as the trained trainer does).
- World size 2 (vision blocks sharded over both ranks) gives the world-size-1 step.
One run per (family, setting) feeds the tests (module fixture): spawning ranks costs more than the checks."""
import pytest
import torch
from _fsdp_common import flat, make_args, run_ranks, shard
from _vlm_common import (FAMILIES, build_tiny_vlm, hf_vlm, hf_vlm_log_probs, other_image, vlm_batch,
                         with_observation_image)

pytestmark = pytest.mark.slow
STEP_FLAGS = ["--lr", "1e-2", "--micro-batch-size", "4", "--global-batch-size", "8", "--clip-grad", "1.0",
              "--optimizer", "sgd"]
VISUAL = "model.visual."


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    return {f: build_tiny_vlm(str(tmp_path_factory.mktemp(f)), f) for f in FAMILIES}


def _full(p):
    return (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()


def vlm_rank(rank, world_size, port, ckpt, family, *flags):
    """Score (also with another image, and with --use-dynamic-batch-size), one GRPO step, the pushed weights,
    every parameter before / after, score again."""
    from slime_like.backends.fsdp.trainer import FSDPTrainer

    t = FSDPTrainer(make_args(ckpt, *STEP_FLAGS, *flags), "actor", rank, world_size, master_port=port)
    batch = vlm_batch(ckpt, family)
    mine = shard(batch, world_size, rank)
    out = dict(before=t.compute_log_probs(mine)["log_probs"],
               other=t.compute_log_probs(shard(other_image(ckpt, family, batch), world_size, rank))["log_probs"],
               observation=t.compute_log_probs(with_observation_image(ckpt, family, batch))["log_probs"],
               params0={n: _full(p) for n, p in t.model.named_parameters()},
               trainable={n for n, p in t.model.named_parameters() if p.requires_grad})
    mine.update(t.compute_advantages(mine))
    out["metrics"] = t.train_step(0, mine)
    out["params1"] = {n: _full(p) for n, p in t.model.named_parameters()}
    out["pushed"] = {n: w.clone() for n, w in t.iter_hf_weights()}
    out["after"] = t.compute_log_probs(shard(batch, world_size, rank))["log_probs"]
    if world_size == 1:
        packed = FSDPTrainer(make_args(ckpt, *STEP_FLAGS, *flags, "--use-dynamic-batch-size",
                                       "--max-tokens-per-gpu", "96"), "actor", rank, world_size, master_port=port)
        out["dynamic"] = packed.compute_log_probs(batch)["log_probs"]
    return out


@pytest.fixture(scope="module")
def runs(ckpts):
    got = {}
    for family in FAMILIES:
        got[family, "trained"] = run_ranks(vlm_rank, 1, ckpts[family], family)[0]
        got[family, "frozen"] = run_ranks(vlm_rank, 1, ckpts[family], family, "--freeze-vision-tower")[0]
    got["ws2"] = run_ranks(vlm_rank, 2, ckpts["qwen2_5_vl"], "qwen2_5_vl")
    return got


@pytest.mark.parametrize("family", FAMILIES)
def test_log_probs_equal_transformers_with_its_mrope_positions(ckpts, runs, family):
    batch = vlm_batch(ckpts[family], family)
    reference = flat(hf_vlm_log_probs(ckpts[family], batch))
    for setting in ("trained", "frozen"):
        run = runs[family, setting]
        assert (flat(run["before"]) - reference).abs().max().item() < 1e-4
        assert (flat(run["dynamic"]) - reference).abs().max().item() < 1e-4  # token-budget micro-batches
    one_d = flat(hf_vlm_log_probs(ckpts[family], batch, one_d_positions=True))
    assert (one_d - reference).abs().max().item() > 1e-4  # the positions matter: ours are M-RoPE's


@pytest.mark.parametrize("family", FAMILIES)
def test_an_observation_image_inside_the_response_reaches_the_trainer(ckpts, runs, family):
    """Multi-turn with images: an environment turn's image inside the response (its pixels appended to the
    sample's multimodal_train_inputs) is an image for the trainer as for transformers' forward."""
    batch = with_observation_image(ckpts[family], family, vlm_batch(ckpts[family], family))
    reference = flat(hf_vlm_log_probs(ckpts[family], batch))
    ours = runs[family, "trained"]["observation"]
    assert (flat(ours) - reference).abs().max().item() < 1e-4
    # another observation image moves sample 0 away from ours: the trainer used this one
    mm = dict(batch["multimodal_train_inputs"][0])
    n_obs = int(mm["image_grid_thw"][-1].prod())
    mm["pixel_values"] = torch.cat([mm["pixel_values"][:-n_obs], torch.randn(n_obs, mm["pixel_values"].shape[1])])
    moved = hf_vlm_log_probs(ckpts[family], dict(batch, multimodal_train_inputs=[mm] + batch[
        "multimodal_train_inputs"][1:]))[0]
    assert (moved - ours[0]).abs().max().item() > 1e-3


@pytest.mark.parametrize("family", FAMILIES)
def test_another_image_changes_that_samples_log_probs_only(runs, family):
    run = runs[family, "trained"]
    assert (run["other"][0] - run["before"][0]).abs().max().item() > 1e-3
    for before, other in zip(run["before"][1:], run["other"][1:]):
        assert (before - other).abs().max().item() < 1e-6


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("setting", ("trained", "frozen"))
def test_step_trains_or_freezes_the_vision_tower_and_the_push_follows(ckpts, runs, family, setting):
    from slime_like.backends.cpu_engine.weights import load_named_tensors

    run = runs[family, setting]
    moved = {n for n in run["params0"] if not torch.equal(run["params0"][n], run["params1"][n])}
    vision = {n for n in run["params0"] if n.startswith(VISUAL)}
    assert vision and moved - vision  # the language model always trains
    model = hf_vlm(ckpts[family])
    hf_names = {n for n, _ in model.named_parameters()}
    pushed = run["pushed"]
    assert set(pushed) <= hf_names
    if setting == "frozen":
        assert not moved & vision and not run["trainable"] & vision
        assert not any(n.startswith(VISUAL) for n in pushed)  # the engines already hold the frozen tower
        assert set(pushed) == hf_names - vision
    else:
        assert moved & vision  # the tower trained (its merger and blocks get gradients)
        assert set(pushed) == hf_names
    # the engine's own loader takes the push; the HF model then scores as the trained trainer
    assert load_named_tensors(model, pushed.items()) == len(pushed)
    after = flat(hf_vlm_log_probs(model, vlm_batch(ckpts[family], family)))
    assert (flat(run["after"]) - after).abs().max().item() < 1e-4
    assert (flat(run["after"]) - flat(run["before"])).abs().max().item() > 1e-3


def test_world_size_2_step_equals_world_size_1(runs):
    ws1, ws2 = runs["qwen2_5_vl", "trained"], runs["ws2"]
    assert (flat(ws2[0]["before"] + ws2[1]["before"]) - flat(ws1["before"])).abs().max().item() < 1e-5
    assert (flat(ws2[0]["after"] + ws2[1]["after"]) - flat(ws1["after"])).abs().max().item() < 1e-5
    assert ws2[1]["pushed"] == {}  # only rank 0 yields
    for name, w in ws1["pushed"].items():
        assert (ws2[0]["pushed"][name] - w).abs().max().item() < 1e-5, name


def lora_and_critic_rank(rank, world_size, port, ckpt, family):
    """LoRA with the tower frozen / trained (which modules get adapters), its log-probs; bf16 compute's log-probs;
    a VLM critic's values with the sample's image and another one."""
    from slime_like.backends.fsdp.trainer import FSDPTrainer

    flags = [*STEP_FLAGS, "--lora-rank", "4"]
    out = {}
    for setting, extra in (("frozen", ["--freeze-vision-tower"]), ("trained", [])):
        t = FSDPTrainer(make_args(ckpt, *flags, *extra), "actor", rank, world_size, master_port=port)
        out[setting] = [n for n, p in t.model.named_parameters() if p.requires_grad]
        if setting == "frozen":
            out["lora_log_probs"] = t.compute_log_probs(vlm_batch(ckpt, family))["log_probs"]
            out["lora_pushed"] = sorted(n for n, _ in t.iter_hf_weights())
    bf16 = FSDPTrainer(make_args(ckpt, *STEP_FLAGS, "--fsdp-param-dtype", "bf16"), "actor", rank, world_size,
                       master_port=port)  # the GPU default's precision: bf16 gathered params, vision tower included
    out["bf16_log_probs"] = bf16.compute_log_probs(vlm_batch(ckpt, family))["log_probs"]
    critic = FSDPTrainer(make_args(ckpt, *STEP_FLAGS, "--advantage-estimator", "ppo"), "critic", rank, world_size,
                         master_port=port)
    batch = vlm_batch(ckpt, family)
    out["values"] = critic.compute_values(batch)["values"]
    out["values_other"] = critic.compute_values(other_image(ckpt, family, batch))["values"]
    return out


def test_lora_skips_a_frozen_tower_bf16_runs_and_a_vlm_critic_sees_the_image(ckpts):
    family = "qwen2_5_vl"
    run = run_ranks(lora_and_critic_rank, 1, ckpts[family], family)[0]
    assert run["frozen"] and not any(".visual." in n for n in run["frozen"])
    assert all(".lora_" in n for n in run["frozen"])
    assert any(".visual." in n and ".lora_" in n for n in run["trained"])  # the trained tower gets adapters too
    reference = flat(hf_vlm_log_probs(ckpts[family], vlm_batch(ckpts[family], family)))
    assert (flat(run["lora_log_probs"]) - reference).abs().max().item() < 1e-4
    # bf16 compute (fp32 master weights): bf16 rounding away from fp32 (measured 1.9e-2), nothing worse
    assert 1e-5 < (flat(run["bf16_log_probs"]) - reference).abs().max().item() < 0.1
    vision = {n for n, _ in hf_vlm(ckpts[family]).named_parameters() if n.startswith(VISUAL)}
    assert run["lora_pushed"] and not vision & set(run["lora_pushed"])
    assert (run["values"][0] - run["values_other"][0]).abs().max().item() > 1e-4
    assert all(torch.equal(a, b) for a, b in zip(run["values"][1:], run["values_other"][1:]))


def test_freeze_vision_tower_on_a_text_checkpoint_is_an_error(tiny_ckpt):
    from slime_like.config.errors import ConfigError

    with pytest.raises(ConfigError, match=r"--freeze-vision-tower: --hf-checkpoint .* is a text model"):
        make_args(tiny_ckpt, "--freeze-vision-tower")
    assert make_args(tiny_ckpt, "--no-freeze-vision-tower").freeze_vision_tower is False
