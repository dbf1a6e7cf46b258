"""--megatron-config-path: per-role YAML overlays (seed 000) and the stricter errors; role_args copies."""
import pytest

from slime_like.args import role_args
from slime_like.config.errors import ConfigError

from cfg_helpers import parse


@pytest.fixture
def ppo(base):
    return base + ["--advantage-estimator", "ppo", "--lr", "2e-6", "--save", "/ckpt/run1"]


def yaml_file(tmp_path, text, name="roles.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_critic_only_overlay_and_actor_inherits(ppo, tmp_path):
    y = yaml_file(tmp_path, "megatron:\n  - name: default\n    role: critic\n    overrides:\n      lr: 1e-5\n")
    args = parse(ppo + ["--megatron-config-path", y])
    critic, actor = role_args(args, "critic"), role_args(args, "actor")
    assert critic.lr == 1e-5 and isinstance(critic.lr, float)  # YAML 1.1 reads 1e-5 as a string
    assert actor.lr == 2e-6 and args.lr == 2e-6  # the shared namespace is untouched
    assert critic.role == "critic" and actor.role == "actor" and not hasattr(args, "role")


def test_actor_only_and_both_roles(ppo, tmp_path):
    y = yaml_file(tmp_path, "megatron:\n  - role: actor\n    overrides: {lr: 3e-6, save: /a}\n")
    args = parse(ppo + ["--megatron-config-path", y])
    assert role_args(args, "actor").lr == 3e-6 and role_args(args, "actor").save == "/a"
    assert role_args(args, "critic").lr == 2e-6
    y = yaml_file(tmp_path, "megatron:\n  - role: actor\n    overrides: {lr: 3e-6}\n"
                            "  - role: critic\n    overrides: {lr: 1e-5, weight_decay: '0.05', lr_warmup_iters: 7}\n")
    args = parse(ppo + ["--megatron-config-path", y])
    a, c = role_args(args, "actor"), role_args(args, "critic")
    assert (a.lr, c.lr, c.weight_decay, c.lr_warmup_iters) == (3e-6, 1e-5, 0.05, 7)
    assert a.weight_decay == 0.01


def test_args_alias(ppo, tmp_path):
    y = yaml_file(tmp_path, "megatron:\n  - name: default\n    role: critic\n    args:\n      lr: 1e-5\n")
    assert role_args(parse(ppo + ["--megatron-config-path", y]), "critic").lr == 1e-5


def test_role_args_returns_independent_copies(ppo):
    args = parse(ppo + ["--rollout-stop", "x"])
    view = role_args(args, "actor")
    view.rollout_stop.append("y")
    view.lr = 1.0
    assert args.rollout_stop == ["x"] and args.lr == 2e-6


def test_critic_flags(ppo):
    args = parse(ppo + ["--critic-lr", "5e-6", "--critic-lr-warmup-iters", "3", "--critic-load", "/c"])
    c = role_args(args, "critic")
    assert (c.lr, c.lr_warmup_iters, c.load, c.save) == (5e-6, 3, "/c", "/ckpt/run1_critic")
    assert c.kl_coef == 0.0 and role_args(args, "actor").save == "/ckpt/run1"


@pytest.mark.parametrize("text, message", [
    ("megatron:\n  - role: critic\n    overrides: {lrr: 1e-5}\n", r"megatron\[0\] \(role critic\): unknown key 'lrr' \(did you mean lr\?\)"),
    ("megatron:\n  - role: critc\n    overrides: {lr: 1e-5}\n", r"role 'critc' is not supported \(did you mean critic\?\)"),
    ("megatron:\n  - role: critic\n  - role: critic\n", r"megatron\[1\]: duplicate role 'critic' \(already in megatron\[0\]\)"),
    ("megatron:\n  role: critic\n", r"'megatron' must be a list of role entries, got dict"),
    ("critic:\n  lr: 1e-5\n", r"expected a top-level 'megatron' list"),
    ("megatron:\n  - role: critic\n    overides: {lr: 1}\n", r"unknown field 'overides' \(did you mean overrides\?\)"),
    ("megatron:\n  - role: critic\n    overrides: {tensor_model_parallel_size: 2}\n",
     r"tensor_model_parallel_size would be 1 for the actor but 2 for the critic"),
    ("megatron:\n  - role: critic\n    overrides: {lr: fast}\n", r"key 'lr': invalid value 'fast'"),
    ("megatron:\n  - role: critic\n    overrides: {optimizer: adamw}\n", r"'adamw' is not one of \['adam', 'sgd'\]"),
    ("megatron:\n  - role: critic\n    overrides: {critic_num_nodes: 2}\n", r"'critic_num_nodes' is a placement"),
    ("megatron:\n  - role: critic\n    overrides: {tensor-model-parallel-size: 2}\n",
     r"unknown key 'tensor-model-parallel-size' \(did you mean tensor_model_parallel_size\?\)"),
    ("megatron:\n  - role: critic\n    overrides: {lr: 1e-5}\n    args: {lr: 1e-5}\n", r"both 'overrides' and its alias"),
    ("megatron:\n  - [critic]\n", r"each entry must be a mapping"),
])
def test_bad_yaml_is_an_error_naming_file_and_entry(ppo, tmp_path, text, message):
    y = yaml_file(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as e:
        parse(ppo + ["--megatron-config-path", y])
    assert y in str(e.value)


def test_num_nodes_ignored_with_warning(ppo, tmp_path, capsys):
    y = yaml_file(tmp_path, "megatron:\n  - role: critic\n    overrides: {num_nodes: 4, num_gpus_per_node: 2, lr: 1e-5}\n")
    args = parse(ppo + ["--megatron-config-path", y])
    err = capsys.readouterr().err
    assert "'num_nodes' is ignored" in err and "'num_gpus_per_node' is ignored" in err
    c = role_args(args, "critic")
    assert c.num_nodes is None and c.critic_num_nodes == 1 and c.lr == 1e-5  # the YAML value never lands


def test_same_topology_in_both_roles_is_fine(ppo, tmp_path):
    y = yaml_file(tmp_path, "megatron:\n  - role: actor\n    overrides: {sequence_parallel: false}\n"
                            "  - role: critic\n    overrides: {sequence_parallel: false}\n")
    assert parse(ppo + ["--megatron-config-path", y]).megatron_role_overrides["critic"] == {"sequence_parallel": False}


def test_without_critic_warns(base, tmp_path, capsys):
    y = yaml_file(tmp_path, "megatron:\n  - role: actor\n    overrides: {lr: 1e-5}\n")
    parse(base + ["--megatron-config-path", y])
    assert "used without a critic" in capsys.readouterr().err


def test_missing_file_and_unknown_role_in_role_args(ppo):
    with pytest.raises(ConfigError, match="--megatron-config-path /no/file.yaml: no such file"):
        parse(ppo + ["--megatron-config-path", "/no/file.yaml"])
    with pytest.raises(ConfigError, match="unknown role 'reward'"):
        role_args(parse(ppo), "reward")
