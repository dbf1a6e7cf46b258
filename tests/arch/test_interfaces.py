"""The two backend interfaces: registries, the CLI choices that name them, and the built-in implementations."""
import inspect

import pytest

from slime_like.args import make_args
from slime_like.backends import trainer_api
from slime_like.backends.cpu_engine.launch import CPUEngineServer, build_cpu_engine_command
from slime_like.backends.engine_api import engine as engine_api
from slime_like.backends.sglang.engine import SGLangEngine, build_sglang_command
from slime_like.config.parser import build_parser


def _choices(dest):
    parser, _ = build_parser()
    return next(a.choices for a in parser._actions if a.dest == dest)


def test_cli_choices_name_the_registered_implementations():
    assert sorted(c for c in _choices("rollout_engine") if c != "auto") == engine_api.engine_names()
    assert sorted(_choices("train_backend")) == trainer_api.backend_names()


def test_engines_build_the_same_commands_as_their_builders():
    args = make_args(hf_checkpoint="/m", seed=3, colocate=False, offload_rollout=False,
                              rollout_num_gpus_per_engine=2, sglang_server_args={"max_running_requests": 4})
    cpu, sglang = engine_api.get_engine("cpu"), engine_api.get_engine("sglang")
    assert isinstance(cpu, CPUEngineServer) and isinstance(sglang, SGLangEngine)
    cmd = cpu.launch_command(args, host="127.0.0.1", port=9, gpu_ids=[0])
    assert cmd[1:] == build_cpu_engine_command(args, port=9)[1:] and "--max-running-requests" in cmd
    cmd = sglang.launch_command(args, host="h", port=9, gpu_ids=[4, 5])
    assert cmd == build_sglang_command(args, port=9, host="h", base_gpu_id=4, tp_size=2)
    assert cmd[cmd.index("--base-gpu-id") + 1] == "4" and cmd[cmd.index("--tp-size") + 1] == "2"
    assert engine_api.FROM_TENSOR in cpu.weight_update_routes
    with pytest.raises(ValueError, match="does not serve /nowhere"):
        cpu.check_weight_route("/nowhere")


def test_registries_refuse_unknown_names_and_double_registration():
    with pytest.raises(ValueError, match=r"unknown rollout engine 'vlm'.*'cpu', 'sglang'"):
        engine_api.get_engine("vlm")
    with pytest.raises(ValueError, match="already registered"):
        engine_api.register_engine("cpu", SGLangEngine)
    with pytest.raises(ValueError, match="unknown --train-backend 'fsdq'"):
        trainer_api.backend_class("fsdq")
    with pytest.raises(ValueError, match="already registered"):
        trainer_api.register_backend("megatron", object)
    with pytest.raises(ValueError, match="role must be one of"):
        trainer_api.build(make_args(train_backend="megatron"), role="ref", rank=0, world_size=1,
                          master_addr="127.0.0.1", master_port=1)


@pytest.mark.parametrize("backend,fmt", [("megatron", "torch_dist"), ("fsdp", "dcp")])
def test_trainers_implement_the_trainer_backend_protocol(backend, fmt):
    cls = trainer_api.backend_class(backend)
    for name, member in inspect.getmembers(trainer_api.TrainerBackend, inspect.isfunction):
        if name.startswith("_"):
            continue
        mine = getattr(cls, name, None)
        assert callable(mine), f"{cls.__name__} lacks {name}()"
        assert list(inspect.signature(mine).parameters) == list(inspect.signature(member).parameters), name
    assert cls.checkpoint_format == fmt


def test_external_engine_group_is_built_through_init():
    from slime_like.ray.rollout_manager import EngineGroup

    group = EngineGroup.external(make_args(sglang_router_ip=None), ["127.0.0.1:1", "http://h:2"])
    assert group.urls == ["http://127.0.0.1:1", "http://h:2"] and group.actors == []
    assert group.router_url is None and group.router is None
    import ray

    group.stop()  # nothing of ours to stop: a no-op, not an error
    assert not ray.is_initialized()  # and no Ray cluster auto-started in this process (it broke later runs)
