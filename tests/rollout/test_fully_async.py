"""The fully async rollout worker against the real CPU engine: weight pushes while it generates, the staleness
bound from the versions the engine reported, and every scheduled prompt trained exactly once or still pending."""
import urllib.request
import json

import pytest

from slime_like.rollout import fully_async
from slime_like.rollout.controller import RolloutController
from slime_like.rollout.serialize import sample_from_dict
from slime_like.utils.auth import auth_headers

H = "rollout.hooks_for_tests"
FN = "slime.rollout.fully_async_rollout.generate_rollout_fully_async"   # slime's name, resolved to ours
ROWS = [{"q": f"{i}+{i}=", "a": str(2 * i)} for i in range(40)]


def _push(engine_url, ckpt, version: int):
    """A weight push as the run does it: pause the worker, load weights tagged `version`, resume."""
    fully_async.pause_for_weight_update()
    body = json.dumps({"model_path": ckpt, "weight_version": str(version)}).encode()
    req = urllib.request.Request(engine_url + "/update_weights_from_disk", data=body,
                                 headers={"Content-Type": "application/json", **auth_headers()})
    urllib.request.urlopen(req, timeout=60).read()
    fully_async.resume_after_weight_update(version)


def _pending(ctl):
    """(group indices the checkpoint puts back into the data buffer, groups issued so far)."""
    state = ctl.state_dict()["data_source"]
    return [sample_from_dict(g[0]).group_index for g in state["buffer"]], state["next_group_index"]


def _run_steps(ctl, engine_url, ckpt, steps: int, staleness: int):
    trained, versions, mixed = [], [], 0
    _push(engine_url, ckpt, 0)                       # the run's first push: version = start rollout id
    for step in range(steps):
        samples, metrics = ctl.generate(step)
        assert len(samples) == 4 * 2 and metrics["rollout/staleness/max"] <= staleness
        for s in samples[::2]:
            trained.append(s.group_index)
        for s in samples:
            assert s.weight_versions, s                # every answer carried the engine's version
            v = min(int(x) for x in s.weight_versions)
            assert 0 <= step - v <= staleness, (step, s.weight_versions)
            versions.append((step, v))
            mixed += len(set(s.weight_versions)) > 1
        _push(engine_url, ckpt, step + 1)            # while the worker goes on generating
    return trained, versions, metrics, mixed


@pytest.mark.parametrize("partial", [False, True])
def test_pushes_while_generating_bound_and_no_prompt_lost(engine_url, tiny_ckpt, prompt_file, make_args, partial):
    flags = ["--rollout-batch-size", 4, "--n-samples-per-prompt", 2, "--rollout-max-response-len", 96,
             "--rollout-function-path", FN, "--max-staleness", 1, "--custom-rm-path", f"{H}.reward_length"]
    args = make_args(prompt_file(ROWS), *flags, *(["--partial-rollout"] if partial else []))
    ctl = RolloutController(args, [engine_url])
    try:
        trained, versions, metrics, mixed = _run_steps(ctl, engine_url, tiny_ckpt, 5, 1)
        pending, issued = _pending(ctl)
    finally:
        ctl.close()
    assert fully_async.active_worker() is None        # close() stopped the worker thread
    assert len(trained) == len(set(trained)) == 20     # never trained twice
    assert set(pending).isdisjoint(trained) and sorted(trained + pending) == list(range(issued))  # never lost
    assert any(step - v == 1 for step, v in versions)  # generated before a push, trained after it
    assert max(v for _, v in versions) >= 3            # and the new weights were used
    assert metrics["rollout/buffer_groups"] + metrics["rollout/running_groups"] <= 2 * 4   # (S + 1) * B
    if partial:   # groups running at a push were aborted and continued on the new weights
        assert metrics["rollout/resumed_partial"] >= 1 and mixed >= 1, (metrics, mixed)
    else:         # they finished on the old weights: one version per sample
        assert mixed == 0


def test_stale_groups_are_generated_again(engine_url, tiny_ckpt, prompt_file, make_args):
    """--max-staleness 0: groups finished on version 0 but not trained by then are dropped when version 2 is
    pushed and their prompts come back (same group index) on the new weights."""
    args = make_args(prompt_file(ROWS), "--rollout-batch-size", 2, "--n-samples-per-prompt", 2,
                     "--rollout-function-path", FN, "--max-staleness", 0, "--custom-rm-path", f"{H}.reward_length")
    ctl = RolloutController(args, [engine_url])
    try:
        _push(engine_url, tiny_ckpt, 0)
        first, _ = ctl.generate(0)
        _push(engine_url, tiny_ckpt, 1)
        _push(engine_url, tiny_ckpt, 2)            # the trainer skipped ahead: whatever was generated is stale
        second, metrics = ctl.generate(2)
        pending, issued = _pending(ctl)
        state = ctl.state_dict()
    finally:
        ctl.close()
    assert all(s.weight_versions and set(s.weight_versions) == {"2"} for s in second)
    assert metrics["rollout/staleness/max"] == 0 and metrics["rollout/dropped_stale"] >= 1
    trained = sorted({s.group_index for s in first} | {s.group_index for s in second})
    assert len(trained) == 4 and sorted(trained + pending) == list(range(issued))

    # a run resumed from that state generates the saved pending prompts again: still none lost or repeated
    ctl = RolloutController(args, [engine_url])
    ctl.load_state_dict(state)
    try:
        _push(engine_url, tiny_ckpt, 3)
        third, _ = ctl.generate(3)
        pending2, issued2 = _pending(ctl)
    finally:
        ctl.close()
    trained += sorted({s.group_index for s in third})
    assert len(trained) == len(set(trained)) == 6 and sorted(trained + pending2) == list(range(issued2))


def test_a_generation_error_fails_the_step_instead_of_hanging(engine_url, prompt_file, make_args):
    args = make_args(prompt_file(ROWS), "--rollout-batch-size", 2, "--n-samples-per-prompt", 2,
                     "--rollout-function-path", FN, "--custom-rm-path", f"{H}.reward_raises")
    ctl = RolloutController(args, [engine_url])
    try:
        with pytest.raises(Exception, match="reward"):
            ctl.generate(0)
    finally:
        ctl.close()
    assert fully_async.active_worker() is None
