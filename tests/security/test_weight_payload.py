"""Issue 31 item 2 / issue 25 item 2: the weight-upload route's deserializer admits only shared-memory / CUDA IPC
rebuilds, each bounded by the engine's model.

The probe: a 70-byte body whose pickle calls `torch.UntypedStorage(3000000)` (or `torch.Tensor(N)`) grew the engine
by 1.7 GB. Now it is a 400 and the engine's memory does not move. A CUDA tensor pickled the way torch's
ForkingPickler writes it (`rebuild_cuda_tensor` and its 15 arguments) passes the allow-list: on this CPU-only torch
it then fails inside torch's CUDA initialisation, which is as far as a CPU can go.
"""
import base64
import json
import os
import pickle
import urllib.error
import urllib.request

import psutil
import pytest
import torch
from multiprocessing.reduction import ForkingPickler

from slime_like.backends.engine_api import tensor_serializer as ts


class _Call:
    """Pickles as `fn(*args)`: how a crafted body names a callable."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def probe_payload(cls=torch.UntypedStorage, n=3_000_000) -> bytes:
    return pickle.dumps([("weight", _Call(cls, n))], protocol=4)


def cuda_stand_in(storage_bytes=64, size=(4, 4), handle=b"\x01" * 64) -> bytes:
    """rebuild_cuda_tensor's reduce tuple exactly as torch.multiprocessing.reductions.reduce_tensor builds it for a
    CUDA tensor (tensor class, size, stride, offset, storage class, dtype, device, IPC handle, storage bytes,
    storage offset, requires_grad, ref-counter handle and offset, event handle, event sync), through ForkingPickler."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    stride = (size[1], 1)
    args = (torch.Tensor, torch.Size(size), stride, 0, torch.storage.TypedStorage, torch.float32, 0, handle,
            storage_bytes, 0, False, b"\x02" * 16, 0, b"\x03" * 64, True)
    buf = __import__("io").BytesIO()
    ForkingPickler(buf).dump([("w", _Call(rebuild_cuda_tensor, *args))])
    return buf.getvalue()


def test_the_70_byte_probe_is_refused_before_it_allocates():
    blob = probe_payload()
    assert len(blob) == 70
    for payload in (blob, probe_payload(torch.Tensor), probe_payload(torch.nn.Parameter)):
        with pytest.raises(ts.PayloadRefused, match="not a tensor payload"):
            ts.deserialize(payload, 1 << 40)


def test_code_is_refused_naming_the_global(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(ts.PayloadRefused, match="refusing posix.system|refusing os.system"):
        ts.deserialize(pickle.dumps(_Call(os.system, f"touch {marker}")), 1 << 20)
    assert not marker.exists()


def test_shared_memory_payload_round_trips_within_the_bound():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    blob = ts.serialize([("a", x), ("b", x[1:])])
    (_, a), (_, b) = ts.deserialize(blob, 48)
    assert a.equal(x) and b.equal(x[1:]) and a.is_shared()
    with pytest.raises(ts.PayloadRefused, match="48 bytes .* exceeds the engine model's 47 bytes"):
        ts.deserialize(blob, 47)


def test_cuda_ipc_payload_passes_the_allow_list():
    with pytest.raises((AssertionError, RuntimeError)) as info:
        ts.deserialize(cuda_stand_in(), 1 << 20)
    assert not isinstance(info.value, ts.PayloadRefused)
    assert "CUDA" in str(info.value)        # torch.cuda._lazy_init on a CPU-only torch: past our checks


@pytest.mark.parametrize("kw, match", [
    (dict(storage_bytes=10 ** 12), "CUDA IPC storage of 1000000000000 bytes"),
    (dict(size=(64, 64)), "reaches beyond its storage of 64 bytes"),
    (dict(handle="not-bytes"), "IPC handle must be bytes"),
])
def test_cuda_ipc_payload_sizes_are_bounded(kw, match):
    with pytest.raises(ts.PayloadRefused, match=match):
        ts.deserialize(cuda_stand_in(**kw), 1 << 20)


def _post(url, path, body, key):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.mark.slow
def test_engine_answers_400_and_keeps_its_memory(tiny_ckpt, tmp_path):
    from slime_like.args import make_args
    from slime_like.backends.engine_api.launcher import start_engine
    from slime_like.utils.net import free_port

    key = os.environ["SLIME_LIKE_ENGINE_API_KEY"]
    proc = start_engine(make_args(hf_checkpoint=tiny_ckpt, seed=0), kind="cpu", engine_index=0, port=free_port(),
                        log_dir=str(tmp_path), env={"OMP_NUM_THREADS": "1"})
    try:
        rss = psutil.Process(proc.popen.pid).memory_info().rss
        for payload, refusal in ((probe_payload(), "not a tensor payload"),
                                 (probe_payload(torch.Tensor, 300_000_000), "not a tensor payload"),
                                 (cuda_stand_in(10 ** 12), "exceeds the engine model's")):
            status, text = _post(proc.url, "/update_weights_from_tensor",
                                 {"serialized_named_tensors": [base64.b64encode(payload).decode()]}, key)
            assert status == 400 and refusal in text, text
        assert psutil.Process(proc.popen.pid).memory_info().rss - rss < 20 * 2 ** 20
        status, _ = _post(proc.url, "/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}},
                          key)
        assert status == 200
    finally:
        proc.stop()
