"""Weight updates without restart: from disk, from tensors (colocated path), over a gloo group (disaggregated).

Each test syncs checkpoint B into an engine serving checkpoint A, checks the greedy outputs become exactly
transformers' greedy outputs of B, syncs A back and checks the original outputs return.
"""
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from safetensors.torch import load_file

from engine_helpers import hf_greedy, run, start
from slime_like.backends.engine_api import weight_sync
from slime_like.backends.engine_api.client import EngineClient, EngineError

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
    # nothing outlives a sync in /dev/shm (a kill between syncs must not leak a segment)
    import os
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(f"torch_{os.getpid()}_")]


def test_disk_sender_writes_a_checkpoint_per_sync_and_the_engines_load_it(engine_w, tiny_ckpt, tiny_ckpt_b, refs,
                                                                           tmp_path):
    """--update-weight-transport disk: one HF checkpoint per sync under the disk dir (weights + the model's config
    and tokenizer files), loaded by the engine via /update_weights_from_disk; the previous one is removed unless
    --update-weight-disk-keep-files."""
    import os

    from slime_like.backends.engine_api.disk_sync import DiskWeightSender

    ref_a, ref_b = refs
    sender = DiskWeightSender([engine_w.url], str(tmp_path / "sync"), hf_checkpoint=tiny_ckpt)
    sender.connect()
    assert sender.send(state(tiny_ckpt_b), weight_version="3") == sum(t.numel() * t.element_size()
                                                                      for _, t in state(tiny_ckpt_b))
    assert greedy(engine_w.url) == ref_b
    info = run(EngineClient(engine_w.url).get_model_info())
    assert info["weight_version"] == "3" and info["model_path"] == str(tmp_path / "sync" / "weights_v3")
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(os.listdir(tmp_path / "sync" / "weights_v3"))
    sender.send(state(tiny_ckpt), weight_version="4")
    assert greedy(engine_w.url) == ref_a
    assert sorted(os.listdir(tmp_path / "sync")) == ["weights_v4"]  # v3 removed once the engine moved on
    keep = DiskWeightSender([engine_w.url], str(tmp_path / "kept"), keep_files=True)
    keep.send(state(tiny_ckpt_b), weight_version="5")
    keep.send(state(tiny_ckpt), weight_version="6")
    assert sorted(os.listdir(tmp_path / "kept")) == ["weights_v5", "weights_v6"]
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
        # bf16 on the wire (the engine casts into its float32 parameters): received into a staging tensor
        sender.send([(n, t.bfloat16()) for n, t in state(tiny_ckpt)], bucket_bytes=1 << 30)
        assert greedy(engine_w.url) == ref_a
        # float32 (the engine's dtype): received straight into the parameters, there and back
        sender.send(state(tiny_ckpt_b), bucket_bytes=1 << 30)
        assert greedy(engine_w.url) == ref_b
        sender.send(state(tiny_ckpt), bucket_bytes=1 << 30)
        assert greedy(engine_w.url) == ref_a
    finally:
        sender.close()


def test_two_stages_join_one_engine_at_the_same_moment(engine_w):
    """PP > 1: each stage's sender asks the engine for a group of its own at once; the engine joins one group at a
    time (409 to the other meanwhile) and the sender asks again, so both groups form (a flake of
    test_pipeline_parallel_actor_syncs_every_stage before the retry)."""
    senders = [weight_sync.DistributedWeightSender([engine_w.url], backend="gloo", master_address="127.0.0.1",
                                                   group_name=f"stage_{i}") for i in range(2)]
    with ThreadPoolExecutor(2) as pool:
        for f in [pool.submit(s.connect) for s in senders]:
            f.result()
    try:
        assert all(s.group is not None for s in senders)
    finally:
        for s in senders:
            s.close()


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
    from slime_like.backends.engine_api import tensor_serializer

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
    """The colocated path sends one handle per bucket: the JSON payload stays tiny however large the tensors are,
    the sender's own tensors are never moved into shared memory, and the buckets of a sync share one segment."""
    from slime_like.backends.engine_api import tensor_serializer

    big = [("w", torch.randn(1024, 1024)), ("b", torch.randn(3, dtype=torch.bfloat16)), ("v", torch.randn(7))]
    sender = weight_sync.TensorWeightSender(["http://unused"], engine_tp_size=2)
    p = sender.payload(big)
    assert len(p["serialized_named_tensors"]) == 2 and p["load_format"] == "flattened_bucket"
    assert p["flush_cache"] is True and len(p["serialized_named_tensors"][0]) < 10_000
    assert not any(t.is_shared() for _, t in big)  # copied into the send buffer, not moved into /dev/shm

    def received(payload):  # as every engine TP rank does: each entry is rebuilt once (one reference each)
        d, *others = [tensor_serializer.deserialize(blob, 1 << 30) for blob in payload["serialized_named_tensors"]]
        flat = d["flattened_tensor"]
        assert all(torch.equal(o["flattened_tensor"], flat) for o in others)
        assert flat.dtype == torch.uint8 and flat.is_shared()
        return flat, {m.name: flat[m.start_idx:m.end_idx].view(m.dtype).reshape(m.shape) for m in d["metadata"]}

    flat, got = received(p)
    assert all(torch.equal(got[n], t) for n, t in big)
    segment = flat.untyped_storage().data_ptr()
    again = [(n, t * 2) for n, t in big]
    flat2, got2 = received(sender.payload(again))
    assert flat2.untyped_storage().data_ptr() == segment  # same shared segment, refilled
    assert all(torch.equal(got2[n], t) for n, t in again)


def test_receive_distributed_lands_in_the_parameters(tiny_ckpt):
    """Per-tensor format: a matching parameter is the receive buffer itself (no staging, no second copy); a
    tensor of another dtype or an unknown name gets its own buffer, so the stream stays in step and
    load_named_tensors converts or refuses it afterwards."""
    from transformers import AutoModelForCausalLM

    from slime_like.backends.cpu_engine import weights
    from slime_like.backends.cpu_engine.sampling import BadRequest

    model = AutoModelForCausalLM.from_pretrained(tiny_ckpt, dtype=torch.float32).eval().requires_grad_(False)
    params = dict(model.named_parameters())
    names = ["model.norm.weight", "model.layers.0.mlp.up_proj.weight", "model.embed_tokens.weight"]
    new = {n: torch.randn(params[n].shape) for n in names}
    wire = [new[names[0]], new[names[1]].bfloat16(), new[names[2]]]
    stream = iter(wire)
    out = weights.receive_distributed(model, names, ["float32", "bfloat16", "float32"],
                                      [list(t.shape) for t in wire], None, lambda t: t.copy_(next(stream)))
    assert out[0][1].data_ptr() == params[names[0]].data_ptr()      # received in place
    assert out[1][1].data_ptr() != params[names[1]].data_ptr()      # bf16 on the wire: own buffer
    assert torch.equal(params[names[0]], new[names[0]])             # already there before any load
    assert weights.load_named_tensors(model, out) == 3
    assert torch.equal(params[names[1]], new[names[1]].bfloat16().float())
    assert torch.equal(params[names[2]], new[names[2]])

    stream = iter([torch.ones(3), torch.ones(params[names[0]].shape)])
    out = weights.receive_distributed(model, ["model.nrom.weight", names[0]], ["float32", "float32"],
                                      [[3], list(params[names[0]].shape)], None, lambda t: t.copy_(next(stream)))
    assert next(stream, None) is None                                # both broadcasts consumed
    with pytest.raises(BadRequest, match="did you mean 'model.norm.weight'"):
        weights.load_named_tensors(model, out)

    flat_src = torch.cat([new[names[0]].view(torch.uint8), new[names[1]].bfloat16().view(-1).view(torch.uint8)])
    out = weights.receive_distributed(model, names[:2], ["float32", "bfloat16"],
                                      [list(new[names[0]].shape), list(new[names[1]].shape)], "flattened_bucket",
                                      lambda t: t.copy_(flat_src))
    assert torch.equal(out[0][1], new[names[0]]) and torch.equal(out[1][1], new[names[1]].bfloat16())


def test_distributed_sender_flattened_bucket_and_a_refused_bucket(engine_w, tiny_ckpt, tiny_ckpt_b, refs):
    """One broadcast per bucket (SGLang's load_format='flattened_bucket') works; a bucket naming an unknown weight
    is refused after its broadcasts, naming the weight, and the group keeps working."""
    ref_a, ref_b = refs
    flat = weight_sync.DistributedWeightSender([engine_w.url], backend="gloo", master_address="127.0.0.1",
                                               group_name="flat", load_format="flattened_bucket")
    flat.connect()
    try:
        flat.send(state(tiny_ckpt_b), bucket_bytes=48 * 1024)
        assert greedy(engine_w.url) == ref_b
        with pytest.raises(EngineError, match="did you mean 'model.norm.weight'"):
            flat.send([("model.nrom.weight", torch.ones(64))] + state(tiny_ckpt)[:2])
        flat.load_format = None  # per tensor, over the same group: still in step
        flat.send(state(tiny_ckpt))
        assert greedy(engine_w.url) == ref_a
    finally:
        flat.close()


def test_tensor_sender_keep_buffer_reuses_one_segment_until_close(engine_w, tiny_ckpt, tiny_ckpt_b, refs):
    import os

    def mine():
        return sorted(f for f in os.listdir("/dev/shm") if f.startswith(f"torch_{os.getpid()}_"))

    ref_a, ref_b = refs
    sender = weight_sync.TensorWeightSender([engine_w.url], keep_buffer=True)
    try:
        sender.send(state(tiny_ckpt_b))
        kept = mine()
        assert len(kept) == 1 and greedy(engine_w.url) == ref_b
        sender.send(state(tiny_ckpt))
        assert mine() == kept and greedy(engine_w.url) == ref_a  # refilled, not reallocated
    finally:
        sender.close()
    assert mine() == []


def test_tensor_sender_keeps_one_buffer_for_two_engines(engine_w, tiny_ckpt, tiny_ckpt_b, refs, tmp_path_factory):
    """Colocated engines on two slots map the same segment: each must get its own reference to it, or the second
    engine to drop its mapping unlinks the segment under the sender (seen in the 2-node Slurm job: the next sync
    could not open it and freeing the buffer aborted the trainer)."""
    import os

    ref_a, ref_b = refs
    other = start(tiny_ckpt, tmp_path_factory, index=2)
    sender = weight_sync.TensorWeightSender([engine_w.url, other.url], keep_buffer=True)
    try:
        for ckpt, ref in ((tiny_ckpt_b, ref_b), (tiny_ckpt, ref_a), (tiny_ckpt_b, ref_b), (tiny_ckpt, ref_a)):
            sender.send(state(ckpt))
            assert greedy(engine_w.url) == ref and greedy(other.url) == ref
    finally:
        sender.close()
        other.stop()
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(f"torch_{os.getpid()}_")]


def test_router_correction_bias_is_a_weight_the_engine_takes(tmp_path):
    """GLM-4.5 / DeepSeek-V3 routers keep e_score_correction_bias in a buffer; the trainer exports it (and may
    update it), so the CPU engine loads it like a parameter. Non-persistent buffers (RoPE tables) are not weights."""
    from transformers import AutoModelForCausalLM

    from slime_like.backends.cpu_engine import weights
    from slime_like.backends.cpu_engine.sampling import BadRequest
    from slime_like.tools.tiny_model import build_tiny_checkpoint

    ckpt = build_tiny_checkpoint(str(tmp_path / "glm"), arch="glm4_moe", num_experts=4)
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    name = "model.layers.1.mlp.gate.e_score_correction_bias"
    new = torch.arange(4, dtype=torch.float32)
    assert weights.load_named_tensors(model, [(name, new)]) == 1
    assert torch.equal(dict(model.named_buffers())[name], new)
    with pytest.raises(BadRequest, match="is not a parameter"):
        weights.load_named_tensors(model, [("model.rotary_emb.inv_freq", torch.zeros(4))])


def test_weights_checker_catches_a_tensor_the_push_missed(engine_w, tiny_ckpt, refs):
    """SGLang's /weights_checker (slime's --check-weight-update-equal): snapshot, noise, push, compare."""
    c = lambda: EngineClient(engine_w.url)  # noqa: E731
    assert run(c().check_weights("snapshot"))["success"]
    run(c().check_weights("reset_tensors"))
    assert greedy(engine_w.url) != refs[0]  # the engine really forgot its weights
    with pytest.raises(EngineError, match=r"HTTP 400: \d+ of \d+ parameters differ from the snapshot: .*max \|diff\|"):
        run(c().check_weights("compare"))
    full = state(tiny_ckpt)
    sender = weight_sync.TensorWeightSender([engine_w.url])
    sender.send([(n, t) for n, t in full if not n.endswith("mlp.down_proj.weight")], bucket_bytes=1 << 20)
    with pytest.raises(EngineError, match=r"2 of \d+ parameters differ from the snapshot: "
                                          r"model.layers.0.mlp.down_proj.weight .*model.layers.1.mlp.down_proj.weight"):
        run(c().check_weights("compare"))  # the two tensors a sync left out are named
    sender.send(full, bucket_bytes=1 << 20)
    sender.close()
    assert run(c().check_weights("compare"))["message"].startswith("All ")
    assert greedy(engine_w.url) == refs[0]
    with pytest.raises(EngineError, match=r"action 'bogus'; expected 'snapshot', 'reset_tensors' or 'compare'"):
        run(c().check_weights("bogus"))


def test_weight_sync_rendezvous_binds_loopback_when_every_engine_is_local():
    """A one-node run's weight-sync group listens on 127.0.0.1 only; a remote engine needs the node's address."""
    from slime_like.backends.engine_api.weight_sync import _local_ip, rendezvous_host

    assert rendezvous_host(["http://127.0.0.1:3000", "http://localhost:3001"]) == "127.0.0.1"
    assert rendezvous_host(["http://127.0.0.1:3000", "http://10.1.2.3:3001"]) == _local_ip()
