"""Trainer-side weight senders: push HF-named tensors from trainer rank 0 into running engines.

Two paths, both speaking SGLang's endpoints, so they work with real SGLang and with the CPU engine:

* ``DistributedWeightSender`` (disaggregated): a dedicated process group {trainer rank 0, every engine rank}
  (``/init_weights_update_group``; rank 0 = the trainer). Per bucket of at most ``bucket_bytes`` the engines
  get ``/update_weights_from_distributed {names, dtypes, shapes}`` and then one broadcast per tensor from
  rank 0, in the same order, straight from the trainer's tensors (the CPU engine receives them straight into
  its parameters); or, with ``load_format="flattened_bucket"``, one broadcast of the bucket's bytes back to
  back. NCCL on GPU, gloo on CPU.
* ``TensorWeightSender`` (colocated): ``/update_weights_from_tensor`` with ``serialized_named_tensors`` in
  SGLang's MultiprocessingSerializer format, one flattened bucket per request: a CUDA IPC handle on GPU, a
  torch shared-memory segment (``file_system`` strategy) on CPU, reused across syncs -- the engine maps it and
  copies the weights out; no bytes of the weights go through HTTP.

Around a sync, ``paused(urls)`` pauses generation and continues afterwards (the update requests themselves carry
``flush_cache``).
All calls are synchronous (the Ray trainer actor calls them); HTTP fan-out runs in threads.
"""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from datetime import timedelta
from types import SimpleNamespace
from typing import Iterable, Iterator
from urllib.parse import urlsplit

import torch

from slime_like.backends.engine_api import node_handles, tensor_serializer
from slime_like.backends.engine_api.client import EngineError, EngineUnreachable, post
from slime_like.utils.net import free_port


# ------------------------------------------------------------------------------------------- HTTP fan-out
def post_all(urls: list[str], path: str, payload: dict | None = None, timeout: float = 600.0,
             api_key: str | None = None) -> list:
    """POST the same payload to every engine concurrently; raise the first error (naming its URL)."""
    return post_each(urls, path, [payload] * len(urls), timeout, api_key)


def post_each(urls: list[str], path: str, payloads: list, timeout: float = 600.0, api_key: str | None = None) -> list:
    """POST payloads[i] to urls[i], concurrently; raise the first error (naming its URL)."""
    with ThreadPoolExecutor(max_workers=max(1, len(urls))) as pool:
        futs = [pool.submit(post, u, path, p, timeout, api_key) for u, p in zip(urls, payloads)]
        return [f.result() for f in futs]


def pause_generation(urls: list[str], mode: str = "abort", api_key: str | None = None) -> None:
    """SGLang's /pause_generation (mode 'abort' is SGLang's default: in-flight requests return as aborted)."""
    post_all(urls, "/pause_generation", {"mode": mode}, api_key=api_key)


def flush_cache(urls: list[str], api_key: str | None = None) -> None:
    post_all(urls, "/flush_cache", api_key=api_key)


def continue_generation(urls: list[str], api_key: str | None = None) -> None:
    post_all(urls, "/continue_generation", api_key=api_key)


@contextlib.contextmanager
def paused(urls: list[str], mode: str = "abort", api_key: str | None = None):
    """Pause generation for the duration of a weight sync; always continue afterwards.

    No separate /flush_cache: every update request of both senders carries SGLang's ``flush_cache: true``, so
    the engine drops its cache after loading the new weights (one HTTP round trip fewer per engine)."""
    pause_generation(urls, mode, api_key)
    try:
        yield
    finally:
        continue_generation(urls, api_key)


def buckets(named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[list]:
    """Group (name, tensor) pairs into lists of at most `bucket_bytes` (a larger tensor gets its own bucket)."""
    if bucket_bytes <= 0:
        raise ValueError(f"--update-weight-buffer-size must be > 0, got {bucket_bytes}")
    cur, size = [], 0
    for name, t in named_tensors:
        n = t.numel() * t.element_size()
        if cur and size + n > bucket_bytes:
            yield cur
            cur, size = [], 0
        cur.append((name, t))
        size += n
    if cur:
        yield cur


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


class WeightPushError(RuntimeError):
    """A weight push that stopped part-way because engines stopped answering; `unreachable`: their URLs (those
    seen by this sender; the driver health-checks every engine to decide which are dead)."""

    def __init__(self, unreachable: list, message: str):
        super().__init__(message)
        self.unreachable = list(unreachable)

    def __reduce__(self):   # crosses Ray (trainer -> driver) with its fields
        return type(self), (self.unreachable, str(self))


# ------------------------------------------------------------------------------------------- senders
class DistributedWeightSender:
    """Broadcast weights from trainer rank 0 to engines over a dedicated process group.

    engine_urls: one URL per engine; engine_tp_size: ranks per engine (an engine with TP=t joins as t ranks,
    engine i taking ranks 1 + i*t .. (i+1)*t). World size = 1 + len(engine_urls) * engine_tp_size.
    """

    def __init__(self, engine_urls: list[str], backend: str = "gloo", group_name: str = "slime_like_weight_sync",
                 master_address: str | None = None, master_port: int | None = None, engine_tp_size: int = 1,
                 timeout_s: float = 600.0, load_format: str | None = None, api_key: str | None = None):
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"weight sync backend {backend!r}; choose 'gloo' (CPU) or 'nccl' (GPU)")
        if load_format not in (None, "flattened_bucket"):
            raise ValueError(f"load_format {load_format!r}; choose None (one broadcast per tensor) or "
                             "'flattened_bucket' (one per bucket)")
        if backend == "nccl" and not torch.cuda.is_available():
            raise RuntimeError("weight sync backend 'nccl' needs CUDA on the trainer; use backend='gloo' on CPU")
        self.engine_urls = list(engine_urls)
        self.backend, self.group_name, self.engine_tp_size = backend, group_name, engine_tp_size
        self.master_address = master_address or rendezvous_host(self.engine_urls)
        self.master_port = master_port
        self.timeout_s = timeout_s
        self.load_format = load_format
        self.api_key = api_key
        self.group = None
        self._joined = False   # the engines hold a group of this name (to leave even after this side dropped it)
        self._flat: torch.Tensor | None = None  # flattened_bucket: send buffer, reused, grown to the largest bucket

    @property
    def world_size(self) -> int:
        return 1 + len(self.engine_urls) * self.engine_tp_size

    def init_payloads(self) -> list[dict]:
        """The /init_weights_update_group body for each engine (exposed for tests and logs)."""
        return [dict(master_address=self.master_address, master_port=self.master_port,
                     rank_offset=1 + i * self.engine_tp_size, world_size=self.world_size,
                     group_name=self.group_name, backend=self.backend) for i in range(len(self.engine_urls))]

    def connect(self) -> None:
        """Join as rank 0 while every engine joins through /init_weights_update_group (concurrently)."""
        from slime_like.backends.engine_api.process_group import init_custom_process_group

        if self.master_port is None:
            self.master_port = free_port(self.master_address)
        result: dict = {}

        def rendezvous():  # rank 0 blocks until every engine rank joined; a daemon thread so a refusal can't hang us
            try:
                result["pg"] = init_custom_process_group(
                    self.backend, f"tcp://{self.master_address}:{self.master_port}", self.world_size, 0,
                    self.group_name, timeout=timedelta(seconds=self.timeout_s))
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                result["error"] = e

        joiner = threading.Thread(target=rendezvous, name="weight-sync-rendezvous", daemon=True)
        joiner.start()
        with ThreadPoolExecutor(max_workers=len(self.engine_urls)) as pool:
            futs = [pool.submit(self._join, u, p) for u, p in zip(self.engine_urls, self.init_payloads())]
            for f in as_completed(futs):
                f.result()  # an engine's refusal surfaces now, naming its URL, not after a rendezvous timeout
        joiner.join(self.timeout_s)
        if "error" in result:
            raise result["error"]
        if "pg" not in result:
            raise TimeoutError(f"weight-sync group rendezvous on {self.master_address}:{self.master_port} did not "
                               f"complete within {self.timeout_s}s")
        self.group, self._joined = result["pg"], True

    def _join(self, url: str, payload: dict) -> dict:
        """POST /init_weights_update_group, again while the engine answers 409: our engines join one group at a
        time (a master that never answers must not hold their workers), and with PP > 1 every stage's sender
        asks the same engine for a group of its own at the same moment."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                return post(url, "/init_weights_update_group", payload, self.timeout_s, self.api_key)
            except EngineError as e:
                if e.status != 409 or time.monotonic() > deadline:
                    raise
            time.sleep(0.2)

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = 512 << 20,
             weight_version: str | None = None) -> int:
        """Send every tensor, bucket by bucket; returns the number of bytes broadcast. An engine that dies during
        the push breaks the group: this side leaves it at once (so the other engines' receives fail instead of
        waiting out the group timeout) and raises an error naming the engines that no longer answer."""
        if self.group is None:
            raise RuntimeError("DistributedWeightSender.send() before connect()")
        sent, futs = 0, []
        device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")
        pool = ThreadPoolExecutor(max_workers=len(self.engine_urls))
        try:
            for bucket in buckets(named_tensors, bucket_bytes):
                futs = [pool.submit(post, u, "/update_weights_from_distributed", self._bucket_payload(bucket,
                                    weight_version), self.timeout_s, self.api_key) for u in self.engine_urls]
                sent += self._broadcast(bucket, device)
                for f in futs:
                    f.result()
        except BaseException as e:
            if isinstance(e, EngineError) and not isinstance(e, EngineUnreachable):
                pool.shutdown(wait=True)   # an engine refused the bucket after its broadcasts: the group is in step
                raise
            self._leave_broken_group()
            pool.shutdown(wait=True)   # the engines' requests end now that the group is gone on this side
            gone = [u for u, f in zip(self.engine_urls, futs) if isinstance(f.exception(), EngineUnreachable)]
            if not gone or not isinstance(e, Exception):
                raise
            raise WeightPushError(gone, f"weight push broken (no answer from {', '.join(gone)}): "
                                        f"{type(e).__name__}: {e}") from e
        pool.shutdown(wait=True)
        return sent

    def _bucket_payload(self, bucket: list, weight_version: str | None) -> dict:
        payload = dict(names=[n for n, _ in bucket], dtypes=[_dtype_name(t.dtype) for _, t in bucket],
                       shapes=[list(t.shape) for _, t in bucket], group_name=self.group_name, flush_cache=True)
        if weight_version is not None:
            payload["weight_version"] = weight_version
        if self.load_format is not None:
            payload["load_format"] = self.load_format
        return payload

    def _broadcast(self, bucket: list, device: torch.device) -> int:
        if self.load_format == "flattened_bucket":
            flat = self._flatten(bucket, device)
            torch.distributed.broadcast(flat, src=0, group=self.group)
            return flat.numel()
        sent = 0
        for _, t in bucket:
            t = t.detach().to(device).contiguous()  # no copy for a contiguous tensor already there
            torch.distributed.broadcast(t, src=0, group=self.group)
            sent += t.numel() * t.element_size()
        return sent

    def _leave_broken_group(self) -> None:
        from slime_like.backends.engine_api.process_group import destroy_process_group

        if self.group is not None:
            try:
                destroy_process_group(self.group)
            except Exception as e:  # noqa: BLE001 - the group is unusable either way
                print(f"weight sync: leaving the broken group: {e}")
            self.group = None

    def _flatten(self, bucket: list, device: torch.device) -> torch.Tensor:
        """The bucket's bytes back to back, in order (SGLang's FlattenedTensorBucket layout: no padding)."""
        total = sum(t.numel() * t.element_size() for _, t in bucket)
        if self._flat is None or self._flat.numel() < total or self._flat.device != device:
            self._flat = None
            self._flat = torch.empty(total, dtype=torch.uint8, device=device)
        start = 0
        for _, t in bucket:
            n = t.numel() * t.element_size()
            piece = self._flat[start:start + n]
            if start % t.element_size():
                piece.copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
            else:
                piece.view(t.dtype).view(t.shape).copy_(t.detach())
            start += n
        return self._flat[:total]

    def close(self, leaving: list[str] | None = None) -> None:
        """Leave the group: the engines in `leaving` (default: all) are told to, then this side destroys it (a
        push that failed left it already; the engines still hold theirs)."""
        self._flat = None
        if not self._joined:
            return
        self._joined = False
        try:
            post_all(self.engine_urls if leaving is None else list(leaving), "/destroy_weights_update_group",
                     {"group_name": self.group_name}, 60, self.api_key)
        finally:
            self._leave_broken_group()


class TensorWeightSender:
    """Colocated path: hand tensors to engines on the same machine through /update_weights_from_tensor.

    Each bucket goes as one flat byte buffer (SGLang's ``load_format="flattened_bucket"``: ``{"flattened_tensor":
    uint8 tensor, "metadata": [name, shape, dtype, start_idx, end_idx, numel per tensor]}``, byte offsets), so
    one handle travels per bucket. On CPU that buffer is one shared-memory segment per sync, reused by every bucket
    of it (``tensor_serializer.shared_buffer``): a sync costs one copy into it here and one copy out of it in the
    engine. Handing the trainer's own tensors over instead moved each of them into a new shared-memory segment
    (measured: 2-4 s for 453 MB, 10x the copy). By default the segment is freed when send() returns: Ray kills a
    trainer with its child processes (torch's shm manager among them), and a segment alive at that moment stays
    in /dev/shm until reboot (seen: one bucket per train.py run). But a fresh segment costs its page faults on
    every sync (100M: ~1.3 s, 15x a copy). keep_buffer=True keeps it for the next sync (100M: ~2.3x a copy);
    its owner must then call close() before the process can be killed. On GPU the buffer is a fresh CUDA
    tensor per bucket (CUDA IPC).
    """

    ALIGN = 64  # start of each tensor in the buffer, in bytes (any dtype's view of a slice is then aligned)

    def __init__(self, engine_urls: list[str], engine_tp_size: int = 1, timeout_s: float = 600.0,
                 keep_buffer: bool = False, api_key: str | None = None, own_node=None,
                 engine_rank_nodes: list | None = None, relays=None):
        """Engine ranks on other nodes (`engine_rank_nodes`: per engine, the node of each rank; `own_node`: this
        process's) get their entries from `relays` on their nodes (engine_api/node_handles.py)."""
        self.engine_urls, self.engine_tp_size, self.timeout_s = list(engine_urls), engine_tp_size, timeout_s
        self.api_key = api_key
        self.own_node, self.relays = own_node, relays
        self.engine_rank_nodes = engine_rank_nodes or [[own_node] * engine_tp_size for _ in self.engine_urls]
        self.relay_counts = node_handles.relay_counts(self.engine_rank_nodes, own_node) if relays else {}
        self.last_entries: list = []   # the last bucket's serialized_named_tensors per engine (logs, tests)
        self.keep_buffer = keep_buffer
        self._staging: torch.Tensor | None = None  # CPU shared-memory buffer of the sync in progress

    def _buffer(self, nbytes: int, device: torch.device) -> torch.Tensor:
        if device.type != "cpu":
            return torch.empty(nbytes, dtype=torch.uint8, device=device)
        if self._staging is None or self._staging.numel() < nbytes:
            self._staging = None  # free the old segment before mapping a bigger one
            self._staging = tensor_serializer.shared_buffer(nbytes)
        return self._staging

    def flatten(self, bucket: list) -> dict:
        """Copy a bucket's tensors into the (reused) buffer; SGLang's flattened-bucket dict pointing into it."""
        devices = {t.device for _, t in bucket}
        if len(devices) != 1:
            raise ValueError(f"a weight bucket mixes devices {sorted(map(str, devices))}; move the tensors first")
        metadata, end = [], 0
        for name, t in bucket:
            start = -(-end // self.ALIGN) * self.ALIGN
            end = start + t.numel() * t.element_size()
            # SimpleNamespace: any SGLang reads the fields as attributes and can unpickle it without our package
            metadata.append(SimpleNamespace(name=name, shape=t.shape, dtype=t.dtype, start_idx=start, end_idx=end,
                                            numel=end - start))
        buf = self._buffer(end, devices.pop())
        for m, (_, t) in zip(metadata, bucket):
            buf[m.start_idx:m.end_idx].view(t.dtype).view(t.shape).copy_(t.detach())
        return {"flattened_tensor": buf[:end], "metadata": metadata}

    def payload(self, bucket: list, weight_version: str | None = None) -> dict:
        """One engine's request: the bucket flattened into the buffer, one entry per engine TP rank."""
        return self._payload_of(self.flatten(bucket), weight_version)

    def _payload_of(self, flat: dict, weight_version: str | None, blobs: list | None = None) -> dict:
        # One serialization per receiving rank: on CPU each one takes a reference on the shared segment that
        # exactly one rebuild gives back, so a blob mapped by two receivers would let the segment's count
        # reach 0 and be unlinked under the sender (the next sync then fails to open it).
        if blobs is None:
            blobs = [tensor_serializer.serialize(flat, output_str=True) for _ in range(self.engine_tp_size)]
        p = {"serialized_named_tensors": blobs, "load_format": "flattened_bucket", "flush_cache": True}
        if weight_version is not None:
            p["weight_version"] = weight_version
        return p

    def connect(self) -> None:  # symmetric with DistributedWeightSender; nothing to set up
        pass

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = 512 << 20,
             weight_version: str | None = None) -> int:
        sent = 0
        try:
            for bucket in buckets(named_tensors, bucket_bytes):
                # The buffer is only overwritten by the next bucket, after every engine has answered (copied it).
                flat = self.flatten(bucket)
                payloads = self._payloads(flat, weight_version)
                try:
                    post_each(self.engine_urls, "/update_weights_from_tensor", payloads, self.timeout_s, self.api_key)
                except EngineUnreachable as e:   # the others loaded this bucket; the push stops here
                    raise WeightPushError([e.url], f"weight push: {e}") from e
                sent += sum(t.numel() * t.element_size() for _, t in bucket)
        finally:
            if not self.keep_buffer:
                self._staging = None  # unlinked once the engines drop it too (see the class docstring)
        return sent

    def _payloads(self, flat: dict, weight_version: str | None) -> list:
        """Every engine's request for one bucket; engine ranks on other nodes get their relay's entries."""
        if not self.relay_counts:   # every engine rank on this node: one buffer, handles made here
            payloads = [self._payload_of(flat, weight_version) for _ in self.engine_urls]
        else:
            remote = self.relays.start(flat, self.relay_counts)()   # the relays copy the bucket meanwhile
            entries = node_handles.order_entries(self.engine_rank_nodes, self.own_node,
                                                 lambda: tensor_serializer.serialize(flat, output_str=True), remote)
            payloads = [self._payload_of(flat, weight_version, blobs) for blobs in entries]
        self.last_entries = [p["serialized_named_tensors"] for p in payloads]
        return payloads

    def close(self, leaving: list[str] | None = None) -> None:   # no group to leave
        self._staging = None
        if self.relays is not None:
            self.relays.close()


def rendezvous_host(engine_urls: list[str]) -> str:
    """Where the trainer hosts the group's rendezvous: loopback when every engine is on this machine (nothing
    listens on a network interface for a one-node run), else the address other nodes reach this one by."""
    hosts = {urlsplit(u).hostname for u in engine_urls}
    if hosts and all(h == "localhost" or h == "::1" or (h or "").startswith("127.") for h in hosts):
        return "127.0.0.1"
    return _local_ip()


def _local_ip() -> str:
    """This node's address as other nodes see it (falls back to loopback on an isolated machine)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"
