"""slime's import names resolve to slime_like's own objects (slime_like/utils/slime_names.py,
slime_like/slime_compat/), only when no real slime exists, and slime-style user code runs in a real rollout
against the CPU engine over HTTP."""
import asyncio
import os
import subprocess
import sys
import textwrap

import pytest

from slime_like.utils.slime_names import SLIME_NAMES
from slime_like.rollout.controller import RolloutController
from slime_like.sample import Status

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
F = "rollout.slime_style_functions"
ROWS = [{"q": f"{i}+{i}=", "a": str(2 * i)} for i in range(4)]

# (module, names): every name slime's examples import that slime_like provides
PROVIDED = {
    "slime.utils.types": ["Sample"],
    "slime.rollout.sglang_rollout": ["GenerateState", "generate", "generate_rollout", "get_model_url"],
    "slime.utils.http_utils": ["post", "get"],
    "slime.rollout.rm_hub": ["async_rm", "batched_async_rm", "grade_answer_verl", "extract_boxed_answer",
                             "compute_score_dapo", "f1_score", "compute_gpqa_reward", "remote_rm"],
    "slime.rollout.rm_hub.math_dapo_utils": ["compute_score"],
    "slime.rollout.rm_hub.math_utils": ["extract_answer", "grade_answer_verl"],
    "slime.rollout.filter_hub.dynamic_sampling_filters": ["check_reward_nonzero_std"],
    "slime.rollout.filter_hub.base_types": ["DynamicFilterOutput"],
    "slime.rollout.base_types": ["RolloutFnTrainOutput", "RolloutFnEvalOutput"],
    "slime.utils.async_utils": ["run", "get_async_loop"],
    "slime.utils.mask_utils": ["MultiTurnLossMaskGenerator", "get_response_lengths"],
    "slime.utils.misc": ["load_function", "SingletonMeta"],
    "slime.utils.processing_utils": ["load_tokenizer"],
    "slime.backends.megatron_utils.cp_utils": ["all_gather_with_cp", "slice_log_prob_with_cp"],
    "slime.rollout.sft_rollout": ["generate_rollout"],
    "slime.rollout.fully_async_rollout": ["generate_rollout_fully_async"],
    "slime.rollout.on_policy_distillation": ["reward_func", "post_process_rewards"],
}
REFUSED = ["from slime.agent.sandbox import E2BSandbox",
           "from slime.utils.external_utils.command_utils import execute_train",
           "from slime.utils.processing_utils import encode_image_for_rollout_engine"]


def _python(code: str, pythonpath: str = ROOT) -> subprocess.CompletedProcess:
    """A fresh interpreter (sys.path / sys.modules untouched by this test process)."""
    env = dict(os.environ, PYTHONPATH=pythonpath)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=300)


def test_each_name_imports_and_is_the_projects_object():
    code = f"""
        import importlib, slime_like.utils.slime_names as c
        assert c.install() and c.provided()
        for mod, names in {PROVIDED!r}.items():
            m = importlib.import_module(mod)
            for n in names:
                assert callable(getattr(m, n)), (mod, n)
        from slime.utils.types import Sample
        from slime.rollout.sglang_rollout import GenerateState, generate
        from slime.utils.http_utils import post
        import slime_like.sample, slime_like.rollout.generate_group as gg, slime_like.rollout.engine_http as eh
        assert Sample is slime_like.sample.Sample and Sample.Status is slime_like.sample.Status
        assert Sample.Status.COMPLETED.value == "completed" and Sample.Status("aborted") is Sample.Status.ABORTED
        assert GenerateState is gg.GenerateState and generate is gg.generate_sample and post is eh.post
        print("ok")
    """
    out = _python(code)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


@pytest.mark.parametrize("statement", REFUSED)
def test_refused_names_say_why(statement):
    out = _python(f"import slime_like.utils.slime_names as c; c.install()\ntry:\n    {statement}\n"
                  f"except ImportError as e:\n    print('REFUSED', e)")
    assert out.returncode == 0 and "REFUSED" in out.stdout and "not provided by slime_like" in out.stdout, \
        out.stdout + out.stderr[-2000:]
    assert "Bringing slime code" in out.stdout


def test_a_real_slime_is_never_shadowed(tmp_path):
    real = tmp_path / "site" / "slime"
    (real / "utils").mkdir(parents=True)
    (real / "__init__.py").write_text("REAL = True\n")
    (real / "utils" / "__init__.py").write_text("")
    (real / "utils" / "types.py").write_text("class Sample:\n    real = True\n")
    code = """
        import slime_like.utils.slime_names as c
        assert c.install() is False and not c.provided()
        import sys, slime
        from slime.utils.types import Sample
        assert slime.REAL and Sample.real and c.SLIME_NAMES not in sys.path
        from slime_like.utils.user_functions import load_function
        assert load_function("slime.utils.types.Sample", "--x").real     # user code loading keeps the real one
        print("ok")
    """
    out = _python(code, pythonpath=f"{ROOT}{os.pathsep}{tmp_path / 'site'}")
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_compat_directory_goes_last_on_sys_path():
    out = _python("import sys, slime_like.utils.slime_names as c; c.install(); print(sys.path[-1] == c.SLIME_NAMES)")
    assert out.stdout.strip() == "True", out.stderr[-2000:]
    assert not os.path.exists(os.path.join(SLIME_NAMES, "__init__.py"))      # not a slime_like subpackage


@pytest.mark.parametrize("fn", ["generate_two_turns", "generate_from_text"])
def test_slime_style_generate_runs_in_a_rollout(engine_url, prompt_file, make_args, fn):
    args = make_args(prompt_file(ROWS), "--rollout-batch-size", 2, "--n-samples-per-prompt", 2,
                     "--custom-generate-function-path", f"{F}.{fn}", "--custom-rm-path", f"{F}.reward_length",
                     "--dynamic-sampling-filter-path", f"{F}.keep_all")
    samples, _ = RolloutController(args, [engine_url]).generate(0)
    assert len(samples) == 4
    for s in samples:
        assert s.status in (Status.COMPLETED, Status.TRUNCATED)
        assert s.response_length == len(s.loss_mask) == len(s.rollout_log_probs) > 0
        assert s.reward == float(s.response_length) and s.weight_versions
        if fn == "generate_two_turns":
            tool = s.loss_mask.count(0)
            assert tool > 0 and s.metadata["turns"] == 2
            # the tool's tokens sit between the two generated turns, masked out with log-prob 0
            first = s.loss_mask.index(0)
            assert s.loss_mask[first:first + tool] == [0] * tool
            assert s.rollout_log_probs[first:first + tool] == [0.0] * tool
            assert all(lp <= 0 for lp in s.rollout_log_probs) and any(lp < 0 for lp in s.rollout_log_probs)


def test_rm_hub_and_async_utils_helpers(make_args, prompt_file):
    from slime_like.utils.slime_names import install

    install()
    from slime.rollout.rm_hub import async_rm, batched_async_rm
    from slime.rollout.rm_hub.math_dapo_utils import compute_score
    from slime.utils.async_utils import run
    from slime.utils.mask_utils import get_response_lengths
    from slime.utils.types import Sample

    args = make_args(prompt_file(ROWS), "--rm-type", "math", "--rollout-batch-size", 1)
    right = Sample(response="so \\boxed{4}", label="4")
    wrong = Sample(response="so \\boxed{5}", label="4")
    assert run(batched_async_rm(args, [right, wrong])) == [1.0, 0.0]
    assert run(async_rm(args, wrong)) == 0.0
    assert compute_score("... \\boxed{4}", "4", strict_box_verify=True)["score"] == 1.0
    assert compute_score("... \\boxed{5}", "4", strict_box_verify=True)["score"] == -1.0
    assert compute_score("Answer: 4", "4")["acc"] is True
    assert get_response_lengths([[0, 0, 1, 0, 1], [0, 0]]) == [3, 0]
    assert asyncio.run(asyncio.sleep(0, result=3)) == 3
