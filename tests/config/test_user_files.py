"""Users' own RLinf / ROLL files, as those frameworks' docs print them (tests/config/frontend_files/heldout/, only
model and data paths changed): they dry-run under omegaconf 2.3 and 2.4, keys they leave out take the framework's
defaults (listed), every problem of a file is reported at once by dotted key [slime flag], and a reward that cannot
be computed fails before anything starts."""
import json
import os
import subprocess
import sys

import pytest

from cfg_helpers import write_hf_dir
from slime_like.args import parse_run
from slime_like.config.errors import ConfigError
from slime_like.config.cluster import cuda_visible

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
HELDOUT = os.path.join(HERE, "frontend_files", "heldout")
RLINF = os.path.join(HELDOUT, "rlinf_grpo_megatron.yaml")
ROLL = os.path.join(HELDOUT, "roll_rlvr_docs.yaml")
OMEGACONF_23 = os.path.join(ROOT, ".venv", "side", "omegaconf-2.3")  # scripts/setup.sh installs it
ROLL_MATH = "roll.pipeline.rlvr.rewards.math_rule_reward_worker.MathRuleRewardWorker"


@pytest.fixture
def user(tmp_path, monkeypatch):
    """A user's directory: a model, data with the files' prompt / label columns, cwd a sub-directory of it."""
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "instruction": f"{i}+1=", "answer": str(i + 1),
                                        "ground_truth": str(i + 1)}) + "\n" for i in range(4)))
    monkeypatch.setenv("HELDOUT_MODEL", write_hf_dir(tmp_path / "model"))
    monkeypatch.setenv("HELDOUT_DATA", str(data))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return tmp_path


def dry(*argv):
    """The validated Namespace, its ConfigReport's warnings as `args.warnings`, as train.py --dry-run checks."""
    args, _, report = parse_run([str(a) for a in argv] + ["--dry-run"], exit_on_error=False, preflight=True)
    args.warnings = report.warnings
    return args


def test_rlinf_reference_file_dry_runs(user):
    args = dry("--config", RLINF, "data.answer_key=answer")
    # ${subtract:${runner.seq_length}, ${data.max_prompt_length}}: a nested interpolation in a resolver
    assert args.rollout_max_response_len == 28672 - 1024
    assert args.label_key == "answer" and args.n_samples_per_prompt == 16 and args.rollout_batch_size == 512
    # output_dir: ../results resolves against the working directory; checkpoints and metrics both go there
    results = user / "results" / "grpo-1.5b"
    assert args.run_dir == str(results) and args.save == str(results / "checkpoints")
    note = next(w for w in args.warnings if "defaults" in w)
    assert "keys the file leaves out take RLinf's defaults: algorithm.sampling_params.do_sample=True" in note
    assert f"relative paths resolve against the working directory {user / 'work'}: runner.output_dir ../results" \
        in note
    fp16 = [w for w in args.warnings if "fp16 training on a machine without CUDA" in w]
    assert len(fp16) == (0 if cuda_visible() else 1)
    if fp16:
        assert "actor.optim.fp16 [--fp16]" in fp16[0] and "set the key to fp32 on CPU" in fp16[0]


def test_roll_docs_file_takes_rolls_defaults(user):
    args = dry("--config", ROLL, f"rewards.math_rule.worker_cls={ROLL_MATH}")
    # absent from the file: ROLL's base_config.py / training_args.py / generating_args.py defaults
    assert (args.num_rollout, args.save_interval, args.seed, args.rollout_seed) == (500, 50, 42, 42)
    assert (args.rollout_top_p, args.rollout_top_k, args.lr_decay_style, args.clip_grad) == (0.7, 50, "linear", 1.0)
    # written in the file: the file's values
    assert (args.rollout_batch_size, args.rollout_max_prompt_len, args.lr, args.lr_warmup_iters) == (64, 2048, 1e-6, 20)
    assert args.run_dir == str(user / "work" / "output") and args.ref_load == os.environ["HELDOUT_MODEL"]
    note = next(w for w in args.warnings if "defaults" in w)
    for shown in ("keys the file leaves out take ROLL's defaults:", "max_steps=500 [--num-rollout]",
                  "save_steps=50 [--save-interval]", "output_dir=./output [--run-dir]"):
        assert shown in note, shown


def test_a_file_with_its_own_values_applies_no_default_for_them(user):
    args = dry("--config", ROLL, f"rewards.math_rule.worker_cls={ROLL_MATH}", "max_steps=70", "save_steps=3")
    assert (args.num_rollout, args.save_interval) == (70, 3)
    note = next(w for w in args.warnings if "defaults" in w)
    assert "max_steps=" not in note and "save_steps=" not in note and "eval_steps=10" in note


@pytest.mark.parametrize("version", ["2.3", "2.4"])
def test_both_files_under_omegaconf(user, version):
    """omegaconf 2.3 is what hydra-core pins: RLinf's nested resolver call must work there too."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        ([OMEGACONF_23] if version == "2.3" else []) + [ROOT, os.environ.get("PYTHONPATH", "")]))
    if version == "2.3":
        assert os.path.isdir(os.path.join(OMEGACONF_23, "omegaconf")), "run scripts/setup.sh (omegaconf 2.3 side dir)"
    script = ("import sys, omegaconf; print('omegaconf', omegaconf.__version__, flush=True); "
              "sys.argv[0] = 'train.py'; import train; sys.exit(train.main(sys.argv[1:]))")
    for argv in (["--config", RLINF, "data.answer_key=answer"],
                 ["--config", ROLL, f"rewards.math_rule.worker_cls={ROLL_MATH}"]):
        out = subprocess.run([sys.executable, "-c", script, *argv, "--dry-run"], env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.splitlines()[0].startswith(f"omegaconf {version}.")
        assert "== slime_like dry run: configuration valid ==" in out.stdout
        assert "'s defaults for keys the file leaves out --" in out.stdout  # the dry run's own section
        assert "take RLinf's defaults" in out.stderr or "take ROLL's defaults" in out.stderr
        if argv[1] == RLINF:
            assert "--rollout-max-response-len 27648" in out.stdout  # 28672 - 1024, resolved by the resolver
            assert "    actor.model.context_parallel_size = 1    [--context-parallel-size]" in out.stdout
            assert "    runner.output_dir: ../results -> " in out.stdout
        else:
            assert "    max_steps = 500    [--num-rollout]" in out.stdout


def test_three_independent_mistakes_in_one_dry_run(user):
    """A ROLL file with a typo'd key, a prompt column the data lacks, a model path that does not exist and no
    rewards section: one dry run names all four, each by the user's dotted key with the slime flag in brackets."""
    with pytest.raises(ConfigError) as err:
        dry("--config", ROLL, "actor_train.training_args.warmup_step=5", "actor_train.data_args.prompt=question",
            f"pretrain={user / 'no-such-model'}")
    text = str(err.value)
    assert text.startswith(f"5 problems, all found before starting (keys of {ROLL} by dotted path")
    assert "  - actor_train.training_args.warmup_step: unknown key (did you mean warmup_steps?)" in text
    assert "  - rewards [--rm-type]: absent: ROLL computes rewards only through the reward workers" in text
    assert "no key 'question' (actor_train.data_args.prompt [--input-key])" in text
    assert f"  - pretrain [--hf-checkpoint] {user / 'no-such-model'}: no such directory" in text
    # the fifth follows from the fourth: ROLL's reference starts from pretrain
    assert "  - reference.model_args.model_name_or_path (absent: ROLL uses pretrain" in text


def test_rlinf_file_without_an_answer_key_or_reward_type_fails(user):
    with pytest.raises(ConfigError, match=r"data.answer_key \[--label-key\]: absent: the reward compares each "
                                          r"response with the reference answer"):
        dry("--config", RLINF)
    with pytest.raises(ConfigError) as err:
        dry("--config", RLINF, "reward.reward_type=null")
    assert "reward.reward_type [--rm-type]: absent: no reward function" in str(err.value)
    assert "data.answer_key [--label-key]: absent" in str(err.value)
    # the user's own flag supplies the key the file leaves out
    assert dry("--config", RLINF, "--label-key", "answer").label_key == "answer"


def test_roll_label_column_missing_from_the_data_names_the_reward(user, tmp_path):
    data = tmp_path / "no_label.jsonl"
    data.write_text(json.dumps({"instruction": "1+1="}) + "\n")
    with pytest.raises(ConfigError, match=r"no key 'ground_truth' \(rewards.math_rule \[--label-key\]\)"):
        dry("--config", ROLL, f"rewards.math_rule.worker_cls={ROLL_MATH}", f"actor_train.data_args.file_name={data}")


def test_uncomputable_reward_fails_before_ray(user):
    """train.py itself (no --dry-run): the missing rewards section stops it with status 2 before Ray starts."""
    out = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--config", ROLL], capture_output=True,
                         text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 2
    assert "train.py: error: " in out.stderr and "rewards [--rm-type]: absent" in out.stderr
    assert "Ray" not in out.stderr and "ray" not in out.stdout
