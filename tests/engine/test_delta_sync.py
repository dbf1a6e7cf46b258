"""Delta weight sync (slime's --update-weight-mode delta) against a real CPU engine over HTTP.

A transformers copy of the tiny checkpoint is trained for real (Adam, a language-model loss) with every layer but one
frozen, and each step's weights go to the engine as a delta: the engine's local checkpoint copy is patched and
reloaded. After the steps, the engine's weights equal a full push of the trainer's bit for bit, it generates what
transformers generates with the trained weights, and each push wrote a fraction of the full weights' bytes. Corrupt
or mismatched versions are refused and change nothing.
"""
import json
import os
import shutil

import numpy as np
import pytest
import torch

from engine_helpers import free_port, hf_greedy, run
from slime_like.args import make_args
from slime_like.backends.engine_api import disk_delta
from slime_like.backends.engine_api.client import EngineClient, EngineError
from slime_like.backends.engine_api.delta_sync import DeltaWeightSender
from slime_like.backends.engine_api.disk_sync import DiskWeightSender
from slime_like.backends.engine_api.weight_sync import post

STEPS = 3
PROMPTS = [[5, 6, 7, 8, 9], [10, 11]]


@pytest.fixture(scope="module")
def delta_engine(tiny_ckpt, tmp_path_factory):
    from slime_like.backends.engine_api.launcher import start_engine

    root = tmp_path_factory.mktemp("delta_sync")
    dirs = {"disk": str(root / "shared"), "local": str(root / "engine_local")}
    args = make_args(hf_checkpoint=tiny_ckpt, seed=0, update_weight_disk_dir=dirs["disk"],
                     update_weight_local_checkpoint_dir=dirs["local"])
    proc = start_engine(args, kind="cpu", engine_index=7, port=free_port(), log_dir=str(root / "logs"),
                        env={"OMP_NUM_THREADS": "1"})
    yield proc, dirs
    proc.stop()


def trainer_model(ckpt):
    """The 'trainer': the checkpoint in transformers, only layer 1's MLP trainable (frozen layers, as with LoRA
    few weights change per step)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith("model.layers.1.mlp."))
    return model


def hf_named(model, ckpt):
    """The tensors a trainer pushes: the checkpoint's names (a tied lm_head is not its own tensor)."""
    names = set(disk_delta.read_checkpoint(ckpt))
    return [(n, t.detach()) for n, t in model.state_dict().items() if n in names]


def train_step(model, opt, step):
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12 + step]])
    loss = model(input_ids=ids, labels=ids).loss
    opt.zero_grad()
    loss.backward()
    opt.step()


def test_delta_pushes_match_a_full_push(delta_engine, tiny_ckpt):
    proc, dirs = delta_engine
    model = trainer_model(tiny_ckpt)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    sender = DeltaWeightSender([proc.url], dirs["disk"], dirs["local"], tiny_ckpt)
    sender.connect()
    full_bytes = sum(t.numel() * t.element_size() for _, t in hf_named(model, tiny_ckpt))
    trained = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    wires = []
    for step in range(STEPS):
        train_step(model, opt, step)
        wires.append(sender.send(hf_named(model, tiny_ckpt), weight_version=f"d{step + 1}"))
        assert sender.last["changed_bytes"] > 0
    print(f"\nfull push {full_bytes} bytes ({trained} trainable); delta pushes wrote {wires} bytes "
          f"({', '.join(f'{w / full_bytes:.1%}' for w in wires)})")
    assert trained < full_bytes / 3
    assert all(0 < w < trained for w in wires)   # only layer 1's MLP changed; the rest costs nothing
    assert run(EngineClient(proc.url).get_model_info())["weight_version"] == f"d{STEPS}"

    # the local copy holds the trainer's bytes, and the engine generates what transformers does with them
    local = disk_delta.read_checkpoint(dirs["local"])
    for name, t in hf_named(model, tiny_ckpt):
        assert np.array_equal(local[name][2], t.contiguous().reshape(-1).view(torch.uint8).numpy()), name
    model.eval()
    out = run(_greedy(proc.url))
    assert out == [hf_greedy(model, p, 8) for p in PROMPTS]

    # bit-identical to a full push of the same weights: snapshot, noise, full push, compare
    post(proc.url, "/weights_checker", {"action": "snapshot"})
    post(proc.url, "/weights_checker", {"action": "reset_tensors"})
    DiskWeightSender([proc.url], dirs["disk"], hf_checkpoint=tiny_ckpt).send(hf_named(model, tiny_ckpt))
    assert "equal the snapshot" in post(proc.url, "/weights_checker", {"action": "compare"})["message"]


async def _greedy(url):
    c = EngineClient(url)
    return [(await c.generate(p, {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}))["output_ids"]
            for p in PROMPTS]


def _pull(proc, dirs, version):
    return post(proc.url, "/pull_weights", {"local_checkpoint_dir": dirs["local"], "source_dir": dirs["disk"],
                                            "target_version": version})


def _version_of(dirs):
    with open(os.path.join(dirs["local"], disk_delta.STATE)) as f:
        return json.load(f)["version"]


def test_corrupt_or_mismatched_deltas_are_refused(delta_engine, tiny_ckpt):
    proc, dirs = delta_engine
    _pull(proc, dirs, 0)                       # version 0: the served checkpoint again
    base = disk_delta.read_checkpoint(dirs["local"])
    name = "model.layers.0.mlp.up_proj.weight"
    old = base[name][2]
    new = old.copy()
    new[:64] ^= 0x5A

    def publish(version, deltas, sums, base_version=None):
        disk_delta.write_version(dirs["disk"], version, deltas, sums, "xor", "xxh3-128")
        if base_version is not None:           # an index claiming another base
            path = os.path.join(disk_delta.version_dir(dirs["disk"], version), disk_delta.INDEX)
            index = json.load(open(path))
            index["metadata"]["base_version"] = f"{base_version:06d}"
            json.dump(index, open(path, "w"))

    good, _ = disk_delta.encode(new, old, "xor")
    publish(1, {name: good}, {name: disk_delta.checksum("xxh3-128", new)})
    _pull(proc, dirs, 1)
    assert _version_of(dirs) == 1
    assert np.array_equal(disk_delta.read_checkpoint(dirs["local"])[name][2], new)

    # made against another base (version 0's bytes, but the local copy is at version 1): the checksum says so
    newer = old.copy()
    newer[100:120] ^= 0x11
    stale, _ = disk_delta.encode(newer, old, "xor")
    publish(2, {name: stale}, {name: disk_delta.checksum("xxh3-128", newer)})
    with pytest.raises(EngineError, match="checksum xxh3-128 of the result .* made against another base"):
        _pull(proc, dirs, 2)
    assert _version_of(dirs) == 1 and np.array_equal(disk_delta.read_checkpoint(dirs["local"])[name][2], new)

    # an index whose base is not the local version
    publish(2, {name: good}, {name: "0"}, base_version=0)
    with pytest.raises(EngineError, match="on base 0; the local checkpoint is at version 1"):
        _pull(proc, dirs, 2)
    # bytes that are no zstd stream, a version never published, a version behind the local one
    publish(2, {name: b"not zstd"}, {name: "0"})
    with pytest.raises(EngineError, match="does not decompress"):
        _pull(proc, dirs, 2)
    shutil.rmtree(disk_delta.version_dir(dirs["disk"], 2))
    with pytest.raises(EngineError, match="version 2 was not published"):   # a gap on the way to 5
        _pull(proc, dirs, 5)
    assert _version_of(dirs) == 1 and np.array_equal(disk_delta.read_checkpoint(dirs["local"])[name][2], new)
    # a good version 2 applies; versions only move forward; version 0 rebuilds the base
    on_new, _ = disk_delta.encode(newer ^ old ^ new, new, "xor")
    publish(2, {name: on_new}, {name: disk_delta.checksum("xxh3-128", newer ^ old ^ new)})
    _pull(proc, dirs, 2)
    with pytest.raises(EngineError, match="already at version 2"):
        _pull(proc, dirs, 1)
    _pull(proc, dirs, 0)
    assert _version_of(dirs) == 0 and np.array_equal(disk_delta.read_checkpoint(dirs["local"])[name][2], old)
    # the local copy may not be the served checkpoint (version 0 replaces its files) nor the shared directory
    with pytest.raises(EngineError, match="must be a directory of its own"):
        post(proc.url, "/pull_weights", {"local_checkpoint_dir": dirs["disk"], "source_dir": dirs["disk"],
                                         "target_version": 0})
    # outside the engine's --weight-dirs
    with pytest.raises(EngineError, match="outside the directories"):
        post(proc.url, "/pull_weights", {"local_checkpoint_dir": "/tmp", "source_dir": dirs["disk"],
                                         "target_version": 0})


@pytest.mark.parametrize("encoding", ["xor", "overwrite"])
@pytest.mark.parametrize("algorithm", ["xxh3-128", "adler32"])
def test_encodings_round_trip(encoding, algorithm):
    rng = np.random.default_rng(0)
    old = rng.integers(0, 256, 4096, dtype=np.uint8)
    new = old.copy()
    new[rng.choice(4096, 40, replace=False)] += 1
    payload, changed = disk_delta.encode(new, old, encoding)
    assert changed == 40 and len(payload) < 4096 // 4
    assert np.array_equal(disk_delta.apply(old, np.frombuffer(payload, np.uint8), encoding, "t"), new)
    assert disk_delta.checksum(algorithm, new) != disk_delta.checksum(algorithm, old)
    assert disk_delta.encode(old, old, encoding) == (None, 0)


@pytest.mark.parametrize("encoding", ["xor", "overwrite"])
def test_a_delta_decompressing_past_its_base_is_refused_unallocated(encoding):
    """A zstd frame may declare any size: 10 MB of zeros for a 4 kB tensor is refused after reading one byte past
    what the base allows (every byte changed), never decompressed whole."""
    import zstandard

    from slime_like.backends.engine_api.protocol import BadRequest

    old = np.zeros(4096, dtype=np.uint8)
    bomb = np.frombuffer(zstandard.ZstdCompressor().compress(bytes(10_000_000)), np.uint8)
    with pytest.raises(BadRequest, match="decompresses to more than"):
        disk_delta.apply(old, bomb, encoding, "model.embed_tokens.weight")
