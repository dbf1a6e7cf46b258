"""MoE routing replay on a tiny Qwen3-MoE: the CPU engine (bfloat16, over HTTP) returns the experts it routed each
token to; the Megatron trainer (float32) replays them (--use-rollout-routing-replay, slime's R3) or its own
old-policy routing (--use-routing-replay, R2)."""
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import torch
from _dist import run_ranks
from test_trainer_common import make_args

from slime_like.backends.engine_api.routed_experts import decode
from slime_like.utils.auth import auth_headers

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16], [20, 21]]


@pytest.fixture(scope="module")
def moe_ckpt(tmp_path_factory):
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    return build_tiny_checkpoint(str(tmp_path_factory.mktemp("rr") / "qwen3_moe"), arch="qwen3_moe",
                                 num_experts=4, moe_topk=2)


def _post(url, body):
    import json

    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json",
                                                                  **auth_headers()})
    return json.loads(urllib.request.urlopen(req, timeout=120).read())


@pytest.fixture(scope="module")
def rollout(moe_ckpt, tmp_path_factory):
    """Samples from a real CPU engine in bfloat16 (the trainer runs float32: routing can differ near ties)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path_factory.mktemp("rr_engine") / "engine.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "slime_like.backends.cpu_engine", "--model-path", moe_ckpt,
                             "--port", str(port), "--dtype", "bfloat16", "--num-threads", "1"],
                            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1"))
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(urllib.request.Request(url + "/health", headers=auth_headers()), timeout=5)
                break
            except OSError:
                time.sleep(0.3)
        outs = _post(url + "/generate", {"input_ids": [p for p in PROMPTS for _ in range(2)],
                                         "sampling_params": {"max_new_tokens": 12, "temperature": 1.0},
                                         "return_logprob": True, "return_routed_experts": True})
        dense = _post(url + "/generate", {"input_ids": PROMPTS[0], "sampling_params": {"max_new_tokens": 1}})
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "routed_experts" not in dense["meta_info"]                 # only when asked
    batch = {k: [] for k in ("tokens", "response_lengths", "loss_masks", "rewards", "raw_rewards",
                             "rollout_log_probs", "rollout_routed_experts", "sample_indices", "truncated")}
    for i, (prompt, out) in enumerate(zip([p for p in PROMPTS for _ in range(2)], outs)):
        pairs = out["meta_info"]["output_token_logprobs"]
        batch["tokens"].append(prompt + [t for _, t, _ in pairs])
        batch["response_lengths"].append(len(pairs))
        batch["loss_masks"].append([1] * len(pairs))
        batch["rewards"].append(1.0 if i % 2 else -1.0)
        batch["raw_rewards"].append(float(i % 2))
        batch["rollout_log_probs"].append([lp for lp, _, _ in pairs])
        batch["rollout_routed_experts"].append(out["meta_info"]["routed_experts"])
        batch["sample_indices"].append(i)
        batch["truncated"].append(0)
    return batch


def _trainer(ckpt, rank, world_size, port, *flags):
    from slime_like.args import role_args
    from slime_like.backends.megatron.trainer import MegatronTrainer

    args = make_args(ckpt, "--global-batch-size", "4", "--micro-batch-size", "2", "--lr", "1e-3", *flags)
    return MegatronTrainer(role_args(args, "actor"), role="actor", rank=rank, world_size=world_size,
                           master_port=port)


def r3_case(rank, world_size, port, ckpt, batch):
    t = _trainer(ckpt, rank, world_size, port, "--use-rollout-routing-replay", "--num-steps-per-rollout", "2")
    rr = t.routing
    rr.batch, rr.recording = batch, True                          # the trainer's own routing, recorded
    free = t._forward_only(t.model, batch, "logp")
    own = rr.end()
    replayed = t.compute_log_probs(batch)["log_probs"]            # R3: the engine's routing
    rr.begin(batch, scoring=False)                                # a wrong routing replayed: expert ids shifted
    rr.source = [(s + 1) % 4 for s in rr.source]
    wrong = t._forward_only(t.model, batch, "logp")
    rr.end()
    batch = dict(batch, log_probs=replayed)
    batch.update(t.compute_advantages(batch))
    metrics = t.train_step(0, batch)
    return free, replayed, wrong, own, metrics


def r2_case(rank, world_size, port, ckpt, batch):
    batch = {k: v for k, v in batch.items() if k != "rollout_routed_experts"}
    t = _trainer(ckpt, rank, world_size, port, "--use-routing-replay", "--num-steps-per-rollout", "2")
    out = t.compute_log_probs(batch)
    rr = t.routing
    rr.batch, rr.recording = batch, True
    t._forward_only(t.model, batch, "logp")
    own = rr.end()
    batch.update(out)
    batch.update(t.compute_advantages(batch))
    return out["replay_routing"], own, t.train_step(0, batch)


def _gap(log_probs, batch):
    return sum(float((lp - torch.tensor(r)).abs().sum()) for lp, r in zip(log_probs, batch["rollout_log_probs"])) \
        / sum(batch["response_lengths"])


def test_rollout_routing_replay_matches_the_engine(moe_ckpt, rollout):
    free, replayed, wrong, own, metrics = run_ranks(r3_case, 1, moe_ckpt, rollout)[0]
    engine = [decode(v, len(t) - 1).reshape(len(t) - 1, 2, 2) for v, t in zip(rollout["rollout_routed_experts"],
                                                                                rollout["tokens"])]
    # the trainer's own routing of the same tokens: mostly the engine's (same weights), not all (bf16 vs fp32)
    rows = [(o[:-1].sort(-1).values == e.sort(-1).values).all(-1) for o, e in zip(own, engine)]
    agree = float(torch.cat([r.reshape(-1) for r in rows]).float().mean())
    assert 0.5 < agree < 1.0, agree
    gap_free, gap_replay, gap_wrong = _gap(free, rollout), _gap(replayed, rollout), _gap(wrong, rollout)
    assert gap_replay < gap_free < gap_wrong, (gap_replay, gap_free, gap_wrong)
    assert metrics["grad_norm"] > 0 and metrics["num_steps"] == 2


def test_routing_replay_records_the_old_policy_routing(moe_ckpt, rollout):
    recorded, own, metrics = run_ranks(r2_case, 1, moe_ckpt, rollout)[0]
    assert len(recorded) == len(rollout["tokens"])
    for r, o, t in zip(recorded, own, rollout["tokens"]):
        assert r.shape == (len(t), 2, 2) and torch.equal(r, o)     # same weights, same routing
    assert metrics["grad_norm"] > 0 and metrics["num_steps"] == 2
