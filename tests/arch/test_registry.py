"""slime_like/registry.py is the one table of trainer backends, rollout engines and advantage estimators: the
configuration layer and the plan ask it for capabilities and never compare a name (an AST scan), and the backend
and estimator registries read and write that table instead of keeping copies."""
import ast
import pathlib

from slime_like import algorithms as alg
from slime_like.backends import trainer_api
from slime_like.backends.engine_api import engine as engine_api
from slime_like.registry import ADVANTAGE_ESTIMATORS, ROLLOUT_ENGINES, TRAINER_BACKENDS

ROOT = pathlib.Path(__file__).resolve().parents[2]
# config/frontends/ is left out: it reads RLinf / ROLL files, whose own vocabulary ("training_backend: fsdp",
# "rollout_backend: vllm") it compares to translate it into our flags
SCANNED = sorted((ROOT / "slime_like" / "config").glob("*.py")) + [ROOT / "slime_like" / "plan.py"]
NAMED_ATTRS = {"train_backend", "rollout_engine", "rollout_engine_requested", "advantage_estimator", "engine_kind"}
# words that are registered names but, where they are compared, name something else: slime's --opd-type values
# (where the distillation teacher runs: "megatron" = a model in the trainer, "sglang" = a teacher engine) and the
# top-level key of slime's --megatron-config-path file
OTHER_MEANING = {("opd_type",), ("raw", "megatron"), ("k", "megatron")}


def _names() -> set:
    return set(TRAINER_BACKENDS.names()) | set(ROLLOUT_ENGINES.names()) | set(ADVANTAGE_ESTIMATORS.names())


def _strings(node) -> list:
    """The string literals an operand compares: itself, or the elements of a literal tuple / list / set."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [c.value for c in items if isinstance(c, ast.Constant) and isinstance(c.value, str)]


def _operand_key(node) -> tuple:
    if isinstance(node, ast.Attribute):
        return (node.attr,)
    if isinstance(node, ast.Name):
        return (node.id,)
    return ()


def _offences(tree, where, names) -> list:
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        keys = {_operand_key(o) for o in operands} - {()}
        literal = [s for o in operands for s in _strings(o) if s in names]
        if literal and not any(k in OTHER_MEANING or (k + (s,)) in OTHER_MEANING for k in keys for s in literal):
            out.append(f"{where}:{node.lineno} compares {literal}")
        named = [o for o in operands if _operand_key(o) and _operand_key(o)[0] in NAMED_ATTRS]
        others = [o for o in operands if o not in named]
        if named and not all(isinstance(o, ast.Constant) and o.value == "auto" for o in others):
            out.append(f"{where}:{node.lineno} compares {_operand_key(named[0])[0]} with {ast.unparse(others[0])}")
    return out


def test_nothing_in_config_or_the_plan_compares_a_registered_name():
    names = _names()
    offences = []
    for path in SCANNED:
        offences += _offences(ast.parse(path.read_text()), path.relative_to(ROOT), names)
    assert offences == [], "ask slime_like/registry.py for a capability instead:\n" + "\n".join(offences)


def test_the_scan_sees_a_name_comparison():
    names = _names()
    for code in ('if args.train_backend == "fsdp": pass', 'x = engine in ("cpu", "sglang")',
                 'if args.rollout_engine != ROLLOUT_ENGINE: pass', 'ok = est == "ppo"'):
        assert _offences(ast.parse(code), "t.py", names), code
    for code in ('if args.opd_type == "megatron": pass', 'if args.rollout_engine == "auto": pass'):
        assert not _offences(ast.parse(code), "t.py", names), code


def test_the_backend_and_estimator_registries_are_views_of_the_table():
    """No copy to keep equal: registering through one side is visible on the other at once."""
    assert trainer_api.backend_names() == sorted(TRAINER_BACKENDS.names())
    assert engine_api.engine_names() == sorted(ROLLOUT_ENGINES.names())
    assert alg.estimator_names() == ADVANTAGE_ESTIMATORS.names()
    trainer_api.register_backend("view_probe", object)
    try:
        assert "view_probe" in TRAINER_BACKENDS and "view_probe" in trainer_api.backend_names()
    finally:
        TRAINER_BACKENDS.unregister("view_probe")
    assert "view_probe" not in trainer_api.backend_names()
    assert engine_api.get_engine("sglang").uses_router and not engine_api.get_engine("cpu").uses_router
