"""Issue 31 item 6: a corrupt newest checkpoint. Every file's size and CRC-32 is recorded at save; resume verifies
them (and the JSON files it reads) before loading, falls back to the newest complete iteration with a warning naming
the bad file, and --ckpt-step N picks an iteration (refused, naming the file, when N is bad).

The probe: iter_N/metadata.json overwritten with garbage made resume fail with json's JSONDecodeError, naming no
file, and --ckpt-step was refused at parse time."""
import json
import logging
import os
import sys

import pytest

from slime_like.backends.training import manifest
from slime_like.ray.run_checkpoint import CheckpointMismatch, resume_iteration, rollout_state_path, write_marker

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "megatron"))
GARBAGE = b"\x00\x00garbage{"


def _role(root, *iterations, record=True):
    """A role's save dir with the layout the backends write (metadata.json, a shard, PUBLISHED, the record)."""
    for it in iterations:
        d = root / f"iter_{it:07d}"
        d.mkdir(parents=True)
        (d / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
        (d / "__0_0.distcp").write_bytes(os.urandom(4096))
        if record:
            manifest.write(str(d), [manifest.record_share(str(d), 0, 1)])
        (d / "PUBLISHED").write_text("")
        rs = rollout_state_path(str(root), it)
        os.makedirs(os.path.dirname(rs), exist_ok=True)
        with open(rs, "w") as f:
            json.dump({"epoch": 0, "sample_offset": it}, f)
    (root / "latest_checkpointed_iteration.txt").write_text(str(iterations[-1]))
    return str(root)


@pytest.mark.parametrize("damage, named", [
    (lambda d: (d / "metadata.json").write_bytes(GARBAGE), "iter_0000002/metadata.json: "),
    (lambda d: (d / "__0_0.distcp").write_bytes(b"x" * 4096), "iter_0000002/__0_0.distcp: CRC-32"),
    (lambda d: os.truncate(d / "__0_0.distcp", 100), "iter_0000002/__0_0.distcp: 100 bytes, 4096 when saved"),
    (lambda d: (d.parent / "rollout_state" / "rollout_0000002.json").write_bytes(GARBAGE),
     "rollout_state/rollout_0000002.json: not readable as JSON"),
])
def test_a_corrupt_newest_iteration_falls_back_naming_the_file(tmp_path, caplog, damage, named):
    actor = _role(tmp_path / "a", 0, 1, 2)
    write_marker(actor, 2, {"actor": actor})
    damage(tmp_path / "a" / "iter_0000002")
    with caplog.at_level(logging.WARNING):
        assert resume_iteration(actor, None) == 1
    assert named in caplog.text and "resuming from iteration 1, the newest complete one" in caplog.text
    assert resume_iteration(actor, None, ckpt_step=0) == 0
    with pytest.raises(CheckpointMismatch, match=f"--ckpt-step 2: .*{named.split(':')[0]}"):
        resume_iteration(actor, None, ckpt_step=2)


def test_garbage_metadata_json_of_a_checkpoint_without_a_record_names_the_file(tmp_path, caplog):
    actor = _role(tmp_path / "a", 0, 1, record=False)
    (tmp_path / "a" / "iter_0000001" / "metadata.json").write_bytes(GARBAGE)
    assert resume_iteration(actor, None) == 0
    assert "iter_0000001/metadata.json: not readable as JSON" in caplog.text


def test_the_fsdp_layout_is_checked_the_same_way(tmp_path, caplog):
    """The FSDP trainer's iterations hold fsdp_meta.json and DCP's .metadata, no metadata.json."""
    actor = _role(tmp_path / "a", 0, 1, record=False)
    for it in (0, 1):
        d = tmp_path / "a" / f"iter_{it:07d}"
        (d / "metadata.json").rename(d / "fsdp_meta.json")
    assert resume_iteration(actor, None) == 1
    (tmp_path / "a" / "iter_0000001" / "fsdp_meta.json").write_bytes(GARBAGE)
    assert resume_iteration(actor, None) == 0
    assert "iter_0000001/fsdp_meta.json: not readable as JSON" in caplog.text


def test_an_unreadable_run_marker_is_named_and_the_roles_decide(tmp_path, caplog):
    actor = _role(tmp_path / "a", 0, 1)
    (tmp_path / "a" / "latest_run_iteration.json").write_bytes(GARBAGE)
    assert resume_iteration(actor, None) == 1
    assert "latest_run_iteration.json: unreadable" in caplog.text


def test_nothing_complete_is_one_error_naming_the_file(tmp_path):
    actor = _role(tmp_path / "a", 3)
    os.truncate(tmp_path / "a" / "iter_0000003" / "__0_0.distcp", 0)
    with pytest.raises(CheckpointMismatch, match="__0_0.distcp: 0 bytes, 4096 when saved\\), and no older"):
        resume_iteration(actor, None)


def test_ckpt_step_parses_and_is_checked(tmp_path):
    """Accepted with --load (it was refused as unsupported); its own range and --load checked at parse time."""
    from slime_like.args import parse_args
    from slime_like.config.errors import ConfigError

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "config"))
    from cfg_helpers import write_hf_dir

    hf = write_hf_dir(tmp_path / "hf")
    (tmp_path / "p.jsonl").write_text('{"input": "1+1=", "label": "2"}\n')
    base = ["--hf-checkpoint", hf, "--prompt-data", str(tmp_path / "p.jsonl"), "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "2", "--num-rollout", "1", "--colocate", "--actor-num-gpus-per-node", "1",
            "--num-gpus-per-node", "1"]
    assert parse_args(base + ["--load", str(tmp_path / "ckpt"), "--ckpt-step", "3"],
                      exit_on_error=False).ckpt_step == 3
    for flags, match in ((["--ckpt-step", "-1", "--load", str(tmp_path)], "--ckpt-step -1: must be an iteration"),
                         (["--ckpt-step", "2"], "--ckpt-step 2 picks an iteration of --load; give --load DIR")):
        with pytest.raises(ConfigError, match=match):
            parse_args(base + flags, exit_on_error=False)


def megatron_rank(rank, world, port, hf_dir, save_dir):
    import warnings

    warnings.filterwarnings("ignore")
    from slime_like.args import make_args
    from slime_like.backends.megatron import checkpoint, model, parallel
    from slime_like.config.hf_config import fill_args_from_hf

    parallel.init_distributed(rank, world, master_port=port)
    args = fill_args_from_hf(make_args("--hf-checkpoint", hf_dir), hf_dir)
    chunks = model.build_model(args)
    for it in (1, 2):
        checkpoint.save_checkpoint(save_dir, it, chunks)
    out = {"record": sorted(json.load(open(os.path.join(save_dir, "iter_0000002", manifest.MANIFEST)))["files"])}
    with open(os.path.join(save_dir, "iter_0000002", "metadata.json"), "wb") as f:   # the probe
        f.write(GARBAGE)
    out["latest"] = checkpoint.load_checkpoint(save_dir, chunks, load_optim=False)
    try:
        checkpoint.load_checkpoint(save_dir, chunks, load_optim=False, iteration=2)
    except FileNotFoundError as e:
        out["step2"] = str(e)
    out["step1"] = checkpoint.load_checkpoint(save_dir, chunks, load_optim=False, iteration=1)
    return out


@pytest.mark.slow
def test_megatron_checkpoint_records_its_files_and_falls_back(tiny_ckpt, tmp_path, caplog):
    from _dist import run_ranks

    save = str(tmp_path / "save")
    (r,) = run_ranks(megatron_rank, 1, tiny_ckpt, save)
    assert {".metadata", "common.pt", "metadata.json"} <= set(r["record"]) and "PUBLISHED" not in r["record"]
    assert r["latest"] == 1 and r["step1"] == 1
    assert r["step2"].startswith("--ckpt-step 2: ") and "iter_0000002/metadata.json" in r["step2"]
    with caplog.at_level(logging.WARNING):
        assert resume_iteration(save, None) == 1     # what train.py decides before Ray starts
    assert "iter_0000002/metadata.json" in caplog.text


def disk_full_rank(rank, world, port, hf_dir, scratch, mount_dir):
    import subprocess
    import warnings

    warnings.filterwarnings("ignore")
    from slime_like.args import make_args
    from slime_like.backends.megatron import checkpoint, model, parallel
    from slime_like.backends.training.publish import _iteration_bytes
    from slime_like.config.hf_config import fill_args_from_hf

    parallel.init_distributed(rank, world, master_port=port)
    args = fill_args_from_hf(make_args("--hf-checkpoint", hf_dir), hf_dir)
    chunks = model.build_model(args)
    size = _iteration_bytes(checkpoint.save_checkpoint(scratch, 1, chunks))
    # room for one iteration and a half: the second save runs out of space midway, through the real writers
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size * 3 // 2}", "tmpfs", mount_dir],
                             capture_output=True, text=True)
    if mounted.returncode:
        return {"skip": mounted.stderr.strip()}
    out = {"size": size}
    try:
        checkpoint.save_checkpoint(mount_dir, 1, chunks)
        try:
            checkpoint.save_checkpoint(mount_dir, 2, chunks)
        except OSError as e:
            out["error"] = str(e)
        out["left"] = sorted(os.listdir(mount_dir))
        out["loaded"] = checkpoint.load_checkpoint(mount_dir, chunks, load_optim=False)
    finally:
        subprocess.run(["umount", mount_dir])
    return out


@pytest.mark.slow
def test_disk_full_on_the_second_save_names_the_directory_and_the_bytes(tiny_ckpt, tmp_path):
    """The probe: the second save on a full disk failed with torch's 'PytorchStreamWriter failed writing file ...:
    file write failed'. A tmpfs sized for 1.5 checkpoints makes the real writers hit ENOSPC (root only)."""
    from _dist import run_ranks

    mount_dir = tmp_path / "small_disk"
    mount_dir.mkdir()
    (r,) = run_ranks(disk_full_rank, 1, tiny_ckpt, str(tmp_path / "scratch"), str(mount_dir))
    if "skip" in r:
        pytest.skip(f"cannot mount a tmpfs here ({r['skip']})")
    import re

    found = re.match(rf"\[Errno 28\] no space left on {mount_dir}: (\d+) bytes needed \(the size of iteration 1\), "
                     r"(\d+) free", r["error"])
    assert found and abs(int(found.group(1)) - r["size"]) < 4096 and int(found.group(2)) < r["size"], r["error"]
    assert "\n" not in r["error"] and "iteration 2 was not saved, the latest checkpoint is unchanged" in r["error"]
    assert "iter_0000002" not in r["left"] and r["loaded"] == 1
