"""Generation against the real embedded CPU engine (subprocess, SGLang HTTP protocol)."""
import math

import pytest

from slime_like.rollout.controller import RolloutController
from slime_like.rollout.engines import NoEngineLeft
from slime_like.rollout.rewards import RewardFunctionError
from slime_like.sample import Status

from .conftest import free_port

H = "rollout.hooks_for_tests"
ROWS = [{"q": f"{i}+{i}=", "a": str(2 * i)} for i in range(6)]


def _check_sample_shapes(s):
    assert s.response_length == len(s.loss_mask) == len(s.rollout_log_probs) > 0
    assert len(s.tokens) == s.prompt_length + s.response_length
    assert all(math.isfinite(lp) and lp <= 0 for lp in s.rollout_log_probs)


def test_groups_statuses_logprobs(engine_url, prompt_file, make_args):
    args = make_args(prompt_file(ROWS), "--rollout-batch-size", 3, "--n-samples-per-prompt", 2,
                     "--rollout-max-response-len", 6, "--custom-rm-path", f"{H}.reward_length")
    ctl = RolloutController(args, [engine_url])
    samples, metrics = ctl.generate(0)
    assert len(samples) == 6
    groups = {}
    for s in samples:
        groups.setdefault(s.group_index, []).append(s.index)
        _check_sample_shapes(s)
        assert s.loss_mask == [1] * s.response_length
        assert s.status in (Status.COMPLETED, Status.TRUNCATED)
        if s.status == Status.TRUNCATED:
            assert s.response_length == 6
        else:                                           # completed: stopped on eos (id 1), which is kept
            assert s.tokens[-1] == 1 and s.response_length <= 6
        assert s.reward == float(s.response_length)
    assert groups == {0: [0, 1], 1: [2, 3], 2: [4, 5]}
    assert metrics["rollout/groups_kept"] == 3 and metrics["rollout/num_samples"] == 6
    assert metrics["rollout/reward"] == pytest.approx(sum(s.response_length for s in samples) / 6)
    assert metrics["rollout/response_len/max"] <= 6 and metrics["rollout/tokens_per_s"] > 0
    # the next rollout continues with the next prompts, on the same event loop and engine connections
    loop, pool = ctl._loop, ctl._pool
    conns = pool.clients[engine_url]._session.connector._conns  # the engine's kept-alive connections
    assert sum(map(len, conns.values())) >= 1
    samples2, metrics2 = ctl.generate(1)
    assert ctl._loop is loop and ctl._pool is pool and not pool.clients[engine_url]._session.closed
    assert metrics2["rollout/tokens_per_s"] > 0  # counted per rollout
    assert sorted({s.group_index for s in samples2}) == [3, 4, 5]
    assert [s.prompt for s in samples2[::2]] == [r["q"] for r in ROWS[3:]]
    ctl.close()
    assert loop.is_closed() and ctl._pool is None


def test_over_sampling_filter_bookkeeping(engine_url, prompt_file, make_args):
    args = make_args(prompt_file(ROWS * 2), "--rollout-batch-size", 2, "--n-samples-per-prompt", 2,
                     "--over-sampling-batch-size", 2, "--custom-rm-path", f"{H}.reward_even_groups_split",
                     "--dynamic-sampling-filter-path", "slime_like.rollout.filters.check_reward_nonzero_std")
    ctl = RolloutController(args, [engine_url])
    samples, metrics = ctl.generate(0)
    kept = sorted({s.group_index for s in samples})
    assert len(kept) == 2 and all(g % 2 == 0 for g in kept)          # odd prompts have constant rewards
    submitted = metrics["rollout/groups_submitted"]
    buffered = [g[0].group_index for g in ctl.data_source.buffer]
    filtered_count = metrics["rollout/groups_filtered"]
    assert filtered_count >= 1
    # every submitted prompt is kept, filtered, or back in the buffer: exactly once
    assert len(kept) + filtered_count + len(buffered) == submitted
    assert set(kept).isdisjoint(buffered) and submitted == ctl.data_source.next_group_index


def test_partial_rollout_resumes_aborted_groups(engine_url, prompt_file, make_args):
    # concurrency 1: samples run one at a time, so when the first group is done the others are
    # queued or mid-generation, and get aborted.
    from rollout import hooks_for_tests

    hooks_for_tests.ENGINE_URL[:] = [engine_url]
    args = make_args(prompt_file(ROWS), "--rollout-batch-size", 1, "--n-samples-per-prompt", 2,
                     "--over-sampling-batch-size", 3, "--rollout-max-response-len", 200, "--partial-rollout",
                     "--sglang-server-concurrency", 1, "--custom-rm-path", f"{H}.reward_length_once_next_runs",
                     # eos ignored: a response cannot end early, so one is surely running when the abort comes
                     "--custom-generate-function-path", f"{H}.generate_ignore_eos")
    ctl = RolloutController(args, [engine_url])
    samples, metrics = ctl.generate(0)
    assert {s.group_index for s in samples} == {0}
    assert metrics["rollout/groups_returned"] == 2
    buffer = ctl.data_source.buffer
    assert [g[0].group_index for g in buffer] == [1, 2]
    partial = {}
    for g in buffer:
        for s in g:
            assert s.status in (Status.ABORTED, Status.COMPLETED, Status.TRUNCATED)
            assert s.response_length == len(s.loss_mask) == len(s.rollout_log_probs)
            partial[s.index] = (list(s.tokens), list(s.rollout_log_probs))
    # group 1's first sample was generating when group 0's scoring ended: aborted mid-response
    cut = [s for g in buffer for s in g if s.status == Status.ABORTED and 0 < s.response_length < 200]
    assert cut, [(s.index, s.status, s.response_length) for g in buffer for s in g]
    state = ctl.state_dict()

    ctl2 = RolloutController(args, [engine_url])      # resume in a new controller from the saved state
    ctl2.load_state_dict(state)
    samples2, metrics2 = ctl2.generate(1)
    assert {s.group_index for s in samples2} == {1}   # the buffered group comes first and is finished
    for s in samples2:
        _check_sample_shapes(s)
        old_tokens, old_lps = partial[s.index]
        assert s.tokens[:len(old_tokens)] == old_tokens            # continued, not restarted
        assert s.rollout_log_probs[:len(old_lps)] == old_lps
    # Which group was cut mid-response depends on timing: group 1 finishes in rollout 1; group 2, aborted
    # again, stays in the buffer with its partial response kept (never restarted).
    later = {s.index: s for s in samples2} | {s.index: s for g in ctl2.data_source.buffer for s in g}
    for c in cut:
        resumed = later[c.index]
        assert resumed.tokens[:len(c.tokens)] == c.tokens and resumed.response_length >= c.response_length
        assert resumed.metadata["start_rollout_id"] == 0   # where its partial response began
        if c.group_index == 1:
            assert resumed.response_length > c.response_length and resumed.status != Status.ABORTED
    assert [g[0].group_index for g in ctl2.data_source.buffer] == [2, 3]   # 2 buffered + 1 fresh were taken
    assert metrics2["rollout/groups_submitted"] == 3


def test_without_partial_rollout_aborted_groups_restart(engine_url, prompt_file, make_args):
    args = make_args(prompt_file(ROWS), "--rollout-batch-size", 1, "--n-samples-per-prompt", 2,
                     "--over-sampling-batch-size", 3, "--rollout-max-response-len", 40,
                     "--sglang-server-concurrency", 1, "--custom-rm-path", f"{H}.reward_length")
    ctl = RolloutController(args, [engine_url])
    ctl.generate(0)
    for g in ctl.data_source.buffer:                  # prompts kept for later, responses dropped
        assert all(s.response_length == 0 and s.status == Status.PENDING and s.reward is None for s in g)


def test_dead_engine_requests_move_to_live_one(engine_url, prompt_file, make_args):
    dead = f"http://127.0.0.1:{free_port()}"
    args = make_args(prompt_file(ROWS), "--rollout-batch-size", 3, "--n-samples-per-prompt", 2,
                     "--custom-rm-path", f"{H}.reward_length")
    ctl = RolloutController(args, [dead, engine_url])
    samples, metrics = ctl.generate(0)
    assert sorted(s.index for s in samples) == list(range(6))   # nothing dropped or doubled
    assert metrics["rollout/dead_engines"] == 1 and dead in ctl.dead_engines


def test_all_engines_dead_fails_with_address(prompt_file, make_args):
    dead = f"http://127.0.0.1:{free_port()}"
    args = make_args(prompt_file(ROWS), "--rollout-batch-size", 1, "--custom-rm-path", f"{H}.reward_length")
    with pytest.raises(NoEngineLeft, match=dead.replace(".", r"\.")):
        RolloutController(args, [dead]).generate(0)


def test_reward_error_names_prompt(engine_url, prompt_file, make_args):
    args = make_args(prompt_file(ROWS), "--rollout-batch-size", 1, "--custom-rm-path", f"{H}.reward_raises")
    with pytest.raises(RewardFunctionError, match=r"prompt index 0 .*RuntimeError: grader crashed"):
        RolloutController(args, [engine_url]).generate(0)


def test_custom_generate_hook(engine_url, prompt_file, make_args):
    args = make_args(prompt_file(ROWS), "--rollout-batch-size", 2, "--n-samples-per-prompt", 2,
                     "--rollout-max-response-len", 10, "--custom-rm-path", f"{H}.reward_length",
                     "--custom-generate-function-path", f"{H}.generate_three_tokens")
    samples, _ = RolloutController(args, [engine_url]).generate(0)
    assert len(samples) == 4
    for s in samples:
        assert s.metadata["custom_generate"] is True and 0 < s.response_length <= 3
        _check_sample_shapes(s)


def test_custom_generate_may_return_several_samples_per_prompt(engine_url, prompt_file, make_args):
    """slime allows a list of Samples: they replace the prompt's sample in its group (rewards, group step)."""
    from slime_like.rollout.batch import to_train_batch

    args = make_args(prompt_file(ROWS), "--rollout-batch-size", 2, "--n-samples-per-prompt", 1,
                     "--rollout-max-response-len", 10, "--custom-rm-path", f"{H}.reward_length",
                     "--custom-generate-function-path", f"{H}.generate_two_per_prompt")
    ctl = RolloutController(args, [engine_url])
    samples, metrics = ctl.generate(0)
    ctl.close()
    assert [(s.group_index, s.response_length, s.reward) for s in samples] == [(0, 2, 2.0), (0, 3, 3.0),
                                                                               (1, 2, 2.0), (1, 3, 3.0)]
    assert metrics["rollout/num_samples"] == 4
    for s in samples:
        _check_sample_shapes(s)
    batch = to_train_batch(args, samples)   # GRPO normalises over the two samples of each prompt
    assert batch["rewards"][0] < 0 < batch["rewards"][1] and batch["rewards"][2] < 0 < batch["rewards"][3]
    bad = make_args(prompt_file(ROWS), "--rollout-batch-size", 2, "--n-samples-per-prompt", 1,
                    "--custom-rm-path", f"{H}.reward_length",
                    "--custom-generate-function-path", f"{H}.generate_not_a_sample")
    ctl = RolloutController(bad, [engine_url])
    with pytest.raises(Exception, match=r"generate_not_a_sample returned dict for prompt index \d; expected a Sample "
                                        "or a non-empty list of Samples"):
        ctl.generate(0)
    ctl.close()


def test_debug_save_and_load(engine_url, prompt_file, make_args, tmp_path):
    pattern = str(tmp_path / "dbg" / "rollout_{rollout_id}.pt")
    args = make_args(prompt_file(ROWS), "--rollout-batch-size", 2, "--custom-rm-path", f"{H}.reward_length",
                     "--save-debug-rollout-data", pattern)
    samples, _ = RolloutController(args, [engine_url]).generate(7)
    replay_args = make_args(prompt_file(ROWS), "--rollout-batch-size", 2, "--custom-rm-path", f"{H}.reward_length",
                            "--load-debug-rollout-data", pattern)
    replayed, metrics = RolloutController(replay_args, []).generate(7)
    assert [(s.index, s.tokens, s.rollout_log_probs, s.reward, s.status) for s in replayed] == \
           [(s.index, s.tokens, s.rollout_log_probs, s.reward, s.status) for s in samples]
    with pytest.raises(FileNotFoundError, match="rollout_8.pt"):
        RolloutController(replay_args, []).generate(8)


def test_opd_sglang_teacher_scores_the_students_tokens(engine_url, prompt_file, make_args):
    """--opd-type sglang with slime's reward / post-process pair: the teacher engine (here the student's own engine,
    so the scores must equal the rollout log-probs) scores each response token; rewards trained on are 0."""
    from slime_like.rollout.batch import to_train_batch

    opd = "slime.rollout.on_policy_distillation"
    args = make_args(prompt_file(ROWS), "--rollout-batch-size", 2, "--n-samples-per-prompt", 2, "--use-opd",
                     "--opd-type", "sglang", "--custom-rm-path", f"{opd}.reward_func", "--custom-reward-post-process-path",
                     f"{opd}.post_process_rewards", "--rm-url", f"{engine_url}/generate", "--rollout-temperature", 0.7)
    ctl = RolloutController(args, [engine_url])
    samples, _ = ctl.generate(0)
    ctl.close()
    for s in samples:
        assert len(s.teacher_log_probs) == s.response_length
        assert s.teacher_log_probs == pytest.approx(s.rollout_log_probs, abs=2e-4)  # same weights, same temperature
    batch = to_train_batch(args, samples)
    assert batch["teacher_log_probs"] == [pytest.approx(s.teacher_log_probs) for s in samples]
    assert batch["rewards"] == [0.0] * 4  # pure distillation: the OPD term is the only signal


def test_forge_load_replays_dumps_with_the_engines_live(engine_url, prompt_file, make_args, tmp_path):
    """slime's forge_load rollout: dumped samples come back as the rollout (literal path: every rollout; template:
    per rollout, falling back to rollout 0's file); eval replays eval_<id> files of a template, or nothing."""
    from slime_like.config.errors import ConfigError

    pattern = str(tmp_path / "dump" / "{rollout_id}.json")
    args = make_args(prompt_file(ROWS), "--rollout-batch-size", 2, "--custom-rm-path", f"{H}.reward_length",
                     "--save-debug-rollout-data", pattern)
    ctl = RolloutController(args, [engine_url])
    saved, _ = ctl.generate(0)
    ctl.close()
    key = lambda ss: [(s.group_index, s.tokens, s.rollout_log_probs, s.reward) for s in ss]  # noqa: E731
    forge = ["--rollout-function-path", "slime.rollout.forge_load.generate_rollout"]
    for path in (pattern.format(rollout_id=0), pattern):  # literal, then template (rollout 3 falls back to 0.json)
        replay = make_args(prompt_file(ROWS), "--rollout-batch-size", 2, "--custom-rm-path", f"{H}.reward_length",
                           *forge, "--load-forge-rollout-data", path, "--eval-prompt-data", "e", prompt_file(ROWS))
        ctl = RolloutController(replay, [engine_url])
        assert key(ctl.generate(0)[0]) == key(saved) and key(ctl.generate(3)[0]) == key(saved)
        assert ctl.evaluate(0) == {}  # no eval_0 dump
        ctl.close()
    with pytest.raises(ConfigError, match="--load-forge-rollout-data .* is read by slime's forge_load rollout only"):
        make_args(prompt_file(ROWS), "--rollout-batch-size", 2, "--load-forge-rollout-data", pattern)
    with pytest.raises(ConfigError, match="forge_load.generate_rollout needs --load-forge-rollout-data PATH"):
        make_args(prompt_file(ROWS), "--rollout-batch-size", 2, *forge)


def test_slime_post_rollout_hooks_and_passrate(engine_url, prompt_file, make_args):
    from rollout import hooks_for_tests
    from slime_like.rollout.batch import to_train_batch

    hooks_for_tests.SEEN_ALL_GROUPS.clear()
    args = make_args(prompt_file(ROWS * 2), "--rollout-batch-size", 2, "--n-samples-per-prompt", 2,
                     "--over-sampling-batch-size", 2, "--custom-rm-path", f"{H}.reward_even_groups_split",
                     "--dynamic-sampling-filter-path", "slime_like.rollout.filters.check_reward_nonzero_std",
                     "--rollout-sample-filter-path", f"{H}.mark_first_sample_removed",
                     "--rollout-all-samples-process-path", f"{H}.record_all_groups", "--log-passrate")
    ctl = RolloutController(args, [engine_url])
    samples, metrics = ctl.generate(0)
    kept = sorted({s.group_index for s in samples})
    # the all-samples hook saw the kept groups and the filtered (odd) ones
    seen = hooks_for_tests.SEEN_ALL_GROUPS[0]
    assert set(kept) < set(seen) and all(g % 2 == 1 for g in set(seen) - set(kept))
    assert metrics["rollout/pass@1"] == pytest.approx(0.5) and metrics["rollout/pass@2"] == pytest.approx(1.0)
    batch = to_train_batch(args, samples)
    assert batch["loss_masks"][0] == [0] * samples[0].response_length          # removed from the loss
    assert batch["loss_masks"][1] == [1] * samples[1].response_length
    args.custom_rollout_log_function_path = f"{H}.log_everything_myself"
    assert ctl.generate(1)[1] == {}                   # the hook logged: nothing left to log


def test_slime_sample_hooks_buffer_filter_and_train_data_conversion(engine_url, prompt_file, make_args):
    from rollout import hooks_for_tests
    from slime_like.rollout.batch import to_train_batch
    from slime_like.rollout.data_source import RolloutDataSource

    hooks_for_tests.HOOKED.clear()
    args = make_args(prompt_file(ROWS), "--rollout-batch-size", 2, "--n-samples-per-prompt", 2,
                     "--custom-rm-path", f"{H}.reward_label_is_hooked",
                     "--rollout-sample-hook-path", f"{H}.record_sample", "--rollout-sample-hook-path",
                     f"{H}.relabel_sample",
                     "--custom-convert-samples-to-train-data-path", f"{H}.train_data_with_doubled_rewards")
    ctl = RolloutController(args, [engine_url])
    samples, _ = ctl.generate(5)
    assert sorted(hooks_for_tests.HOOKED) == [(5, i) for i in range(4)]   # each sample once, with rollout_id
    assert all(s.reward == 1.0 and s.metadata["evaluation"] is False for s in samples)  # hooked before reward
    batch = to_train_batch(args, samples)
    assert batch["rewards"] == [2.0] * 4 and batch["raw_rewards"] == [1.0] * 4
    assert batch["my_key"] == [s.index for s in samples] and batch["truncated"] == [0] * 4

    args.buffer_filter_path = f"{H}.newest_first"
    ds = RolloutDataSource(args, ctl.tokenizer)
    groups = ds.get_samples(3)
    ds.add_samples(groups)                                                # returned, e.g. aborted
    assert [g[0].group_index for g in ds.get_samples(2)] == [2, 1]        # the filter's order, not FIFO
    assert [g[0].group_index for g in ds.get_samples(2)] == [0, 3]        # the rest of the buffer, then new
    args.buffer_filter_path = f"{H}.reward_length"                        # wrong signature: named in the error
    ds.add_samples([groups[0]])
    with pytest.raises(ValueError, match=r"--buffer-filter-path .*filter\(args, rollout_id, buffer, num_samples\)"):
        ds.get_samples(1)
