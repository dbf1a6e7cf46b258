"""Issue 31 item 1: a checkpoint directory is data. A `.metadata` or a stored object whose pickle would create a marker
file is refused with one line naming the file, and the marker is not created, for DCP as the FSDP trainer reads it
and for torch_dist as the Megatron trainer reads it (real checkpoints written by megatron-core, then tampered with).
Each malicious file is first shown to run its code through torch's own reader, so the test proves something."""
import io
import os
import pickle
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "megatron"))


class Evil:
    """Pickles as os.system('touch MARKER')."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _dcp_pair(tmp_path, bad_object):
    """A DCP checkpoint holding one tensor and one stored object (as the FSDP trainer's optimizer param groups)."""
    import torch.distributed.checkpoint as dcp

    path = str(tmp_path / ("bad" if bad_object is not None else "good"))
    dcp.save({"w": torch.arange(6.0), "obj": bad_object if bad_object is not None else ("lr", 0.1)},
             checkpoint_id=path, no_dist=True)
    return path


def _safe_load(path):
    from slime_like.backends.training import safe_dcp

    state = {"w": torch.zeros(6), "obj": None}
    safe_dcp.load(state, path)   # what the FSDP trainer's load calls
    return state


def test_dcp_checkpoint_loads_through_the_safe_reader(tmp_path):
    state = _safe_load(_dcp_pair(tmp_path, None))
    assert state["w"].equal(torch.arange(6.0)) and state["obj"] == ("lr", 0.1)


def test_dcp_stored_object_that_runs_code_is_refused(tmp_path):
    import torch.distributed.checkpoint as dcp

    from slime_like.backends.training.safe_dcp import CheckpointFileRefused

    marker = tmp_path / "ran"
    path = _dcp_pair(tmp_path, Evil(marker))
    with pytest.raises(CheckpointFileRefused) as info:
        _safe_load(path)
    msg = str(info.value)
    assert "\n" not in msg and os.path.join(path, "__0_0.distcp") in msg and "'obj'" in msg and "posix.system" in msg
    assert not marker.exists()
    dcp.load({"w": torch.zeros(6), "obj": None}, checkpoint_id=path, no_dist=True)   # torch's default planner
    assert marker.exists()


def test_dcp_metadata_that_runs_code_is_refused(tmp_path):
    import torch.distributed.checkpoint as dcp

    from slime_like.backends.training.safe_dcp import CheckpointFileRefused

    marker = tmp_path / "ran"
    path = _dcp_pair(tmp_path, None)
    with open(os.path.join(path, ".metadata"), "wb") as f:
        pickle.dump(Evil(marker), f)
    with pytest.raises(CheckpointFileRefused, match=r"\.metadata: refused: its pickle asks for posix\.system") as info:
        _safe_load(path)
    assert "\n" not in str(info.value) and not marker.exists()
    with pytest.raises(BaseException):   # DCP's CheckpointException, after the code ran
        dcp.load({"w": torch.zeros(6), "obj": None}, checkpoint_id=path, no_dist=True)
    assert marker.exists()   # torch's own reader ran it


def test_dcp_metadata_may_not_point_outside_the_directory(tmp_path):
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    from slime_like.backends.training.safe_dcp import CheckpointFileRefused

    path = _dcp_pair(tmp_path, None)
    meta = FileSystemReader(path).read_metadata()
    for info in meta.storage_data.values():
        info.relative_path = "../../../etc/passwd"
    with open(os.path.join(path, ".metadata"), "wb") as f:
        pickle.dump(meta, f)
    with pytest.raises(CheckpointFileRefused, match="names data file '../../../etc/passwd'"):
        _safe_load(path)


def megatron_rank(rank, world, port, hf_dir, save_dir, marker):
    import shutil
    import warnings

    warnings.filterwarnings("ignore")
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy

    from slime_like.args import make_args
    from slime_like.backends.megatron import checkpoint, model, parallel
    from slime_like.backends.training import manifest
    from slime_like.backends.training.safe_dcp import CheckpointFileRefused
    from slime_like.config.hf_config import fill_args_from_hf

    parallel.init_distributed(rank, world, master_port=port)
    args = fill_args_from_hf(make_args("--hf-checkpoint", hf_dir), hf_dir)
    chunks = model.build_model(args)
    out = {}

    def attempt(name, **kw):
        try:
            out[name] = ("loaded", checkpoint.load_checkpoint(save_dir, chunks, **kw))
        except CheckpointFileRefused as e:
            out[name] = ("refused", str(e))

    checkpoint.save_checkpoint(save_dir, 1, chunks)
    attempt("clean", iteration=1)
    # 2: a .metadata whose pickle runs code
    shutil.copytree(checkpoint.iteration_dir(save_dir, 1), checkpoint.iteration_dir(save_dir, 2))
    with open(os.path.join(checkpoint.iteration_dir(save_dir, 2), ".metadata"), "wb") as f:
        pickle.dump(Evil(marker), f)
    # whoever wrote the file can write the files' record too: it must not be what stops the file
    manifest.write(checkpoint.iteration_dir(save_dir, 2), [manifest.record_share(checkpoint.iteration_dir(save_dir, 2),
                                                                                0, 1)])
    attempt("metadata", iteration=2)
    # 3: common.pt holding the object (what --load's extra_state lands in)
    checkpoint.save_checkpoint(save_dir, 3, chunks, extra_state={"x": Evil(marker)})
    attempt("common", iteration=3)
    # 4: a ShardedObject stored through DCP (the per-rank RNG state) holding the object, written by megatron-core
    state = checkpoint._sharded_state(chunks, None, None, is_loading=False)
    state["rng_state"].data = Evil(marker)
    state.update(iteration=4, checkpoint_version=3.0, topology=checkpoint._topology(), has_optimizer=False,
                 extra_state={})
    os.makedirs(checkpoint.iteration_dir(save_dir, 4))
    dist_checkpointing.save(state, checkpoint.iteration_dir(save_dir, 4),
                            sharded_strategy=get_default_save_sharded_strategy("torch_dist"))
    attempt("stored_object", iteration=4)
    out["marker"] = os.path.exists(marker)
    return out


@pytest.mark.slow
def test_megatron_checkpoint_files_that_run_code_are_refused(tiny_ckpt, tmp_path):
    from _dist import run_ranks

    marker = str(tmp_path / "ran")
    save = str(tmp_path / "save")
    (r,) = run_ranks(megatron_rank, 1, tiny_ckpt, save, marker)
    assert r["clean"] == ("loaded", 1)
    for name, fname in (("metadata", "iter_0000002/.metadata"), ("common", "iter_0000003/common.pt"),
                        ("stored_object", "iter_0000004/__0_")):
        kind, msg = r[name]
        assert kind == "refused" and os.path.join(save, fname) in msg and "\n" not in msg, (name, msg)
        assert "posix.system" in msg or "os.system" in msg, (name, msg)
    assert "'rng_state/" in r["stored_object"][1]
    assert r["marker"] is False and not os.path.exists(marker)
