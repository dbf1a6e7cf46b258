"""slime_like/registry.py is the one source of the pluggable choices: a trainer backend, a rollout engine and an
advantage estimator registered here through the public registration calls become valid command-line choices,
appear in --help (with their own flag group), and have their own validator run, whose error is what the user
sees. Registered from this module only for the duration of each test."""
import pytest
import torch

from cfg_helpers import parse, parse_report
from slime_like import algorithms as alg
from slime_like.backends import trainer_api
from slime_like.backends.engine_api import engine as engine_api
from slime_like.config.errors import ConfigError
from slime_like.config.parser import shared_parser
from slime_like.registry import ADVANTAGE_ESTIMATORS, ROLLOUT_ENGINES, TRAINER_BACKENDS


class ToyTrainer:
    """Stands in for a trainer class: the configuration layer only names it (nothing here builds one)."""


class ToyEngine(engine_api.Engine):
    name = "toy_engine"

    def launch_command(self, args, *, host, port, gpu_ids):
        return ["toy-server", "--port", str(port)]


def add_toy_trainer_flags(parser):
    g = parser.add_argument_group("toy trainer", "(a test's trainer backend) its own flags")
    g.add_argument("--toy-trainer-stages", type=int, default=1, help="Stages of the toy trainer.")


def check_toy_trainer(args, report):
    if args.toy_trainer_stages < 1:
        raise ConfigError(f"--toy-trainer-stages {args.toy_trainer_stages}: the toy trainer needs >= 1 stage")


def check_toy_engine(args, report):
    if args.rollout_num_gpus_per_engine != 1:
        raise ConfigError(f"--rollout-num-gpus-per-engine {args.rollout_num_gpus_per_engine}: the toy engine "
                          "serves from one GPU")


def check_toy_estimator(args, report):
    if args.n_samples_per_prompt < 2:
        raise ConfigError("--advantage-estimator toy_estimator compares samples: --n-samples-per-prompt >= 2")
    report.warn("toy_estimator: a test estimator")


@pytest.fixture
def toys():
    trainer_api.register_backend("toy_trainer", ToyTrainer, capabilities={"supports_lora"},
                                 flag_group="toy trainer", add_flags=add_toy_trainer_flags,
                                 validator=check_toy_trainer)
    engine_api.register_engine("toy_engine", ToyEngine, capabilities={"weights_checker"}, validator=check_toy_engine)
    alg.register_estimator("toy_estimator", group_step=alg.raw_rewards, validator=check_toy_estimator,
                           normalizes_group_std=True)(lambda **kw: (kw["mask"], kw["mask"]))
    try:
        yield
    finally:
        TRAINER_BACKENDS.unregister("toy_trainer")
        ROLLOUT_ENGINES.unregister("toy_engine")
        alg.unregister_estimator("toy_estimator")


TOYS = ["--train-backend", "toy_trainer", "--rollout-engine", "toy_engine", "--advantage-estimator", "toy_estimator"]


def test_unregistered_names_are_invalid_choices(base):
    for flag, value in zip(TOYS[0::2], TOYS[1::2]):
        with pytest.raises(ConfigError, match=f"argument {flag}: invalid choice: '{value}'"):
            parse(base + [flag, value])


def test_registered_toys_are_valid_choices_documented_in_help(toys, base):
    args, report = parse_report(base + TOYS)
    assert (args.train_backend, args.rollout_engine, args.advantage_estimator) == tuple(TOYS[1::2])
    assert args.toy_trainer_stages == 1 and "toy_estimator: a test estimator" in report.warnings
    text = shared_parser().format_help()
    assert "{megatron,fsdp,toy_trainer}" in text and "{auto,sglang,vllm,cpu,toy_engine}" in text
    assert "toy_estimator}" in text and "toy trainer:\n" in text and "--toy-trainer-stages" in text
    # the capabilities they were registered with are what the configuration layer asks
    assert trainer_api.backend_class("toy_trainer") is ToyTrainer and isinstance(engine_api.get_engine("toy_engine"),
                                                                                 ToyEngine)
    assert alg.get_estimator("toy_estimator").normalizes_group_std and "toy_estimator" in alg.estimator_names()
    mask = torch.ones(1, 2)
    assert alg.compute_advantages_and_returns("toy_estimator", rewards=[1.0], mask=mask)[0].tolist() == [[1.0, 1.0]]


def test_each_toy_runs_its_own_validator(toys, base):
    with pytest.raises(ConfigError, match="--toy-trainer-stages 0: the toy trainer needs >= 1 stage"):
        parse(base + TOYS + ["--toy-trainer-stages", "0"])
    with pytest.raises(ConfigError, match="--rollout-num-gpus-per-engine 2: the toy engine serves from one GPU"):
        parse(base + TOYS + ["--rollout-num-gpus-per-engine", "2"])
    with pytest.raises(ConfigError, match="toy_estimator compares samples"):
        parse([*base, *TOYS, "--n-samples-per-prompt", "1", "--global-batch-size", "4"])


def test_capabilities_not_names_decide(toys, base):
    """The toy trainer registered with supports_lora takes --lora-rank (a LoRA trainer, whatever its name); the
    built-in megatron, without it, still refuses it with the message naming the LoRA backends."""
    assert parse(base + TOYS + ["--lora-rank", "4"]).lora_rank == 4
    with pytest.raises(ConfigError, match=r"--lora-rank 4 needs --train-backend fsdp or toy_trainer: the Megatron "
                                          r"trainer has no LoRA \(its fused layers"):
        parse(base + ["--lora-rank", "4"])
    # the toy engine serves /weights_checker: --check-weight-update-equal is not refused for it
    assert not parse_report(base + TOYS + ["--check-weight-update-equal"])[1].launch_refusals
