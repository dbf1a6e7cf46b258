"""The trainer contract (backends/training/base.py): RLTrainerBase is abstract, a backend that misses a hook cannot
be instantiated (TypeError naming the hook), and the template constructor takes its steps in one order for every
backend, handing the driver's resume iteration to the backend's checkpoint load."""
import pytest

from slime_like.args import make_args
from slime_like.backends.training.base import RLTrainerBase

# what the brief of the contract names: build, scoring / value forward, one optimizer step, save / load, HF export,
# offload / onload
CORE_HOOKS = {"_init_parallel", "_build_model", "_build_optimizer", "_build_reference", "_build_teacher",
              "_has_checkpoint", "_load_checkpoint", "_save_checkpoint", "_forward_only", "_teacher_output",
              "_train_micro_batches", "_reset_optimizer_states", "_update_reference", "iter_hf_weights",
              "_release_accelerator_memory", "_restore_accelerator_memory", "parallel_info"}


def _args(*flags):
    args = make_args("--lr", "1e-3", *flags)
    args.reference_worker = False  # derived by the launch checks (config/validate_cluster.py)
    return args


def _toy(calls: list, missing: str | None = None) -> type:
    """A backend class whose every hook records its call; `missing` left out."""

    def recorder(name):
        def hook(self, *a, **k):
            calls.append((name, a))
            if name == "_has_checkpoint":
                return True
            if name == "_load_checkpoint":
                return a[2]
            if name == "_prepare_args":
                return a[0]
            return object()
        return hook

    names = CORE_HOOKS | {"_prepare_args", "_distributed_ready", "_build_scheduler"}
    return type("ToyTrainer", (RLTrainerBase,), {n: recorder(n) for n in names if n != missing})


def test_the_base_is_abstract_and_names_the_core_hooks():
    assert RLTrainerBase.__abstractmethods__ == CORE_HOOKS
    with pytest.raises(TypeError, match="abstract"):
        RLTrainerBase(_args())


@pytest.mark.parametrize("missing", sorted(CORE_HOOKS))
def test_a_backend_missing_a_hook_fails_naming_it(missing):
    with pytest.raises(TypeError, match=missing):
        _toy([], missing)(_args())


def test_the_template_constructor_order_and_the_resume_iteration():
    calls = []
    t = _toy(calls)(_args("--use-kl-loss", "--load", "/nowhere"), role="actor", resume_iteration=3)
    order = [name for name, _ in calls]
    assert order == ["_prepare_args", "_init_parallel", "_distributed_ready", "_has_checkpoint", "_build_model",
                     "_build_optimizer", "_build_scheduler", "_load_checkpoint", "_build_reference"]
    assert dict(calls)["_load_checkpoint"] == ("/nowhere", True, 3)  # load_dir, load_optim, the run's iteration
    assert t.loaded_rollout_id == 3 and t.teacher_model is None
    assert t.estimator.name == "grpo"


def test_role_reference_builds_the_frozen_model_alone_and_roles_are_checked():
    calls = []
    t = _toy(calls)(_args("--use-kl-loss"), role="reference")
    assert [name for name, _ in calls][-1] == "_build_reference" and t.optimizer is None
    assert "_build_model" not in [name for name, _ in calls]
    with pytest.raises(ValueError, match="ToyTrainer role must be one of"):
        _toy([])(_args(), role="judge")
