"""Weight updates without restart: from disk, from tensors (colocated path), over a gloo group (disaggregated).

Each test syncs checkpoint B into an engine serving checkpoint A, checks the greedy outputs become exactly
transformers' greedy outputs of B, syncs A back and checks the original outputs return.
"""
import pytest
import torch
from safetensors.torch import load_file

from engine_helpers import hf_greedy, run, start
from slime_like.backends.sglang import weight_sync
from slime_like.backends.sglang.client import EngineClient, EngineError

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [30, 31, 32, 33]]
N = 10


@pytest.fixture(scope="module")
def engine_w(tiny_ckpt, tmp_path_factory):
    import os

    proc = start(tiny_ckpt, tmp_path_factory, index=1)
    yield proc
    proc.stop()  # a graceful stop (SIGTERM to its process group) leaves nothing behind
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.popen.pid, 0)


def greedy(url):
    async def go():
        c = EngineClient(url)
        return [(await c.generate(p, {"temperature": 0, "max_new_tokens": N, "ignore_eos": True}))["output_ids"]
                for p in PROMPTS]
    return run(go())


def reference(hf_models, ckpt):
    return [hf_greedy(hf_models[ckpt], p, N) for p in PROMPTS]


def state(ckpt) -> list:
    return sorted(load_file(f"{ckpt}/model.safetensors").items())


@pytest.fixture(scope="module")
def refs(hf_models, tiny_ckpt, tiny_ckpt_b):
    a, b = reference(hf_models, tiny_ckpt), reference(hf_models, tiny_ckpt_b)
    assert a != b, "the two checkpoints must generate differently for these tests to mean anything"
    return a, b


def test_update_from_disk_and_back(engine_w, tiny_ckpt, tiny_ckpt_b, refs):
    ref_a, ref_b = refs
    assert greedy(engine_w.url) == ref_a
    run(EngineClient(engine_w.url).update_weights_from_disk(tiny_ckpt_b))
    assert greedy(engine_w.url) == ref_b
    info = run(EngineClient(engine_w.url).get_model_info())
    assert info["model_path"] == tiny_ckpt_b
    run(EngineClient(engine_w.url).update_weights_from_disk(tiny_ckpt))
    assert greedy(engine_w.url) == ref_a
    with pytest.raises(EngineError, match="no \\*.safetensors"):
        run(EngineClient(engine_w.url).update_weights_from_disk("/nonexistent/dir"))


def test_tensor_sender_colocated_path(engine_w, tiny_ckpt, tiny_ckpt_b, refs):
    ref_a, ref_b = refs
    sender = weight_sync.TensorWeightSender([engine_w.url])
    sent = sender.send(state(tiny_ckpt_b), bucket_bytes=64 * 1024, weight_version="b")
    assert sent == sum(t.numel() * t.element_size() for _, t in state(tiny_ckpt_b))
    assert greedy(engine_w.url) == ref_b
    assert run(EngineClient(engine_w.url).get_model_info())["weight_version"] == "b"
    sender.send(state(tiny_ckpt), bucket_bytes=1 << 30)
    assert greedy(engine_w.url) == ref_a


def test_tensor_sender_rejects_unknown_names(engine_w):
    sender = weight_sync.TensorWeightSender([engine_w.url])
    with pytest.raises(EngineError, match="did you mean 'model.norm.weight'") as e:
        sender.send([("model.nrom.weight", torch.ones(64))])
    assert engine_w.url in str(e.value)


def test_distributed_sender_gloo_group(engine_w, tiny_ckpt, tiny_ckpt_b, refs):
    ref_a, ref_b = refs
    sender = weight_sync.DistributedWeightSender([engine_w.url], backend="gloo", master_address="127.0.0.1")
    sender.connect()
    try:
        assert sender.world_size == 2
        # small buckets: several /update_weights_from_distributed calls, each followed by its broadcasts
        with weight_sync.paused([engine_w.url], mode="in_place"):
            sent = sender.send(state(tiny_ckpt_b), bucket_bytes=32 * 1024)
        assert sent == sum(t.numel() * t.element_size() for _, t in state(tiny_ckpt_b))
        assert greedy(engine_w.url) == ref_b
        # bf16 on the wire (the engine casts into its float32 parameters): still a working sync path
        sender.send([(n, t) for n, t in state(tiny_ckpt)], bucket_bytes=1 << 30)
        assert greedy(engine_w.url) == ref_a
    finally:
        sender.close()


def test_buckets_respect_size():
    ts = [(f"w{i}", torch.zeros(100)) for i in range(10)]  # 400 bytes each
    bs = list(weight_sync.buckets(ts, 1000))
    assert [len(b) for b in bs] == [2, 2, 2, 2, 2]
    assert [len(b) for b in weight_sync.buckets(ts, 100)] == [1] * 10
    with pytest.raises(ValueError, match="update-weight-buffer-size"):
        list(weight_sync.buckets(ts, 0))


def test_distributed_payloads():
    s = weight_sync.DistributedWeightSender(["http://a:1", "http://b:2"], backend="gloo", master_address="10.0.0.5",
                                            master_port=29999, engine_tp_size=2, group_name="g")
    assert s.world_size == 5
    assert s.init_payloads() == [
        dict(master_address="10.0.0.5", master_port=29999, rank_offset=1, world_size=5, group_name="g", backend="gloo"),
        dict(master_address="10.0.0.5", master_port=29999, rank_offset=3, world_size=5, group_name="g", backend="gloo")]


def test_flattened_bucket_format(engine_w, tiny_ckpt, tiny_ckpt_b, refs):
    """load_format='flattened_bucket': one flat tensor + (name, shape, dtype, start_idx, end_idx) metadata."""
    from slime_like.backends.sglang import tensor_serializer

    ref_a, ref_b = refs
    named = state(tiny_ckpt_b)
    flat = torch.cat([t.flatten() for _, t in named])
    meta, start_idx = [], 0
    for n, t in named:
        meta.append(dict(name=n, shape=list(t.shape), dtype=t.dtype, start_idx=start_idx,
                         end_idx=start_idx + t.numel(), numel=t.numel()))
        start_idx += t.numel()
    blob = tensor_serializer.serialize({"flattened_tensor": flat, "metadata": meta})
    run(EngineClient(engine_w.url).update_weights_from_tensor([blob], load_format="flattened_bucket"))
    assert greedy(engine_w.url) == ref_b
    weight_sync.TensorWeightSender([engine_w.url]).send(state(tiny_ckpt))
    assert greedy(engine_w.url) == ref_a


def test_distributed_sender_fails_fast_when_an_engine_refuses(engine_w):
    import time

    sender = weight_sync.DistributedWeightSender([engine_w.url], backend="gloo", master_address="127.0.0.1",
                                                 group_name="refused", timeout_s=120)
    sender.backend = "nccl"  # what a GPU trainer would ask for: the CPU engine refuses it with the fix
    t = time.time()
    with pytest.raises(EngineError, match="needs CUDA") as e:
        sender.connect()
    assert engine_w.url in str(e.value) and time.time() - t < 30


def test_tensor_payload_carries_shared_memory_handles_not_bytes():
    """The colocated path sends handles: the JSON payload stays tiny however large the tensors are."""
    from slime_like.backends.sglang import tensor_serializer

    big = [("w", torch.randn(1024, 1024))]  # 4 MiB
    p = weight_sync.TensorWeightSender(["http://unused"], engine_tp_size=2).payload(big)
    assert len(p["serialized_named_tensors"]) == 2 and p["load_format"] is None and p["flush_cache"] is True
    assert len(p["serialized_named_tensors"][0]) < 10_000
    (name, t), = tensor_serializer.deserialize(p["serialized_named_tensors"][0])
    assert name == "w" and torch.equal(t, big[0][1]) and t.is_shared()
