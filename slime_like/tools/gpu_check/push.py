"""push: the colocated weight push as a run does it. The project's MegatronTrainer (built from the checkpoint) sends
its HF-named weights through TensorWeightSender (SGLang's flattened buckets: CUDA IPC handles on the GPU, shared
memory in the smoke) into the project's CPU engine started on the same checkpoint; the engine unpickles with the
project's deserializer and copies into its model. Bit-identical is the engine's own /weights_checker (SGLang's
protocol): snapshot of the weights it loaded from disk, reset to noise, push, compare bit for bit. The time of a
sync is set against one device-to-device copy of the same bytes."""
from __future__ import annotations

import secrets

import torch

from slime_like.tools.gpu_check.common import free_port, log, parsed, timed
from slime_like.tools.gpu_check.grpo import make_trainer


def run(ctx, partial):
    from slime_like.backends.engine_api.client import post
    from slime_like.backends.engine_api.launcher import start_engine
    from slime_like.backends.engine_api.weight_sync import TensorWeightSender

    t = make_trainer(ctx, "megatron")
    named = list(t.iter_hf_weights())
    total = sum(w.numel() * w.element_size() for _, w in named)
    details = dict(tensors=len(named), bytes=total, device=str(named[0][1].device), dtype=str(named[0][1].dtype))
    key = secrets.token_hex(16)
    engine_args = parsed(ctx, "--sglang-dtype", "bfloat16" if ctx.cuda else "float32")
    engine = start_engine(engine_args, "cpu", port=free_port(), log_dir=ctx.work, api_key=key,
                          health_timeout=300 if ctx.smoke else 120)
    try:
        def check(action):
            return post(engine.url, "/weights_checker", {"action": action}, timeout=300, api_key=key)["message"]

        check("snapshot")
        check("reset_tensors")
        sender = TensorWeightSender([engine.url], timeout_s=300, api_key=key)
        bucket = int(t.args.update_weight_buffer_size)
        times = []
        for i in range(ctx.syncs):
            sent, s = timed(ctx, lambda: sender.send(t.iter_hf_weights(), bucket_bytes=bucket, weight_version=str(i)))
            times.append(round(s, 4))
            log(f"  sync {i}: {sent / 2 ** 20:.0f} MiB in {s:.3f}s")
            if i == 0:
                try:
                    details["weights_checker"] = check("compare")
                    bit_identical = True
                except Exception as e:  # noqa: BLE001  (the engine's 400 names the tensors that differ)
                    details["weights_checker"] = str(e)[:600]
                    bit_identical = False
                partial.save(f"first sync done, bit-identical={bit_identical}", details)
        sender.close()
    finally:
        engine.stop()
    details.update(bucket_bytes=bucket, sync_s=times, bit_identical=bit_identical, **device_copy(ctx, named, total))
    steady = sorted(times[1:])[len(times[1:]) // 2] if len(times) > 1 else times[0]
    details.update(sync_s_steady=steady, sync_over_copy=round(steady / details["copy_s"], 1))
    line = (f"{len(named)} tensors, {total / 2 ** 20:.0f} MiB ({details['dtype']}) bit-identical={bit_identical} "
            f"(engine /weights_checker); a sync {steady * 1e3:.1f} ms = x{details['sync_over_copy']} one "
            f"{'device-to-device' if ctx.cuda else 'memory'} copy ({details['copy_s'] * 1e3:.2f} ms)")
    return ("pass" if bit_identical and len(times) == ctx.syncs else "fail"), line, details


def device_copy(ctx, named, total: int) -> dict:
    """The same bytes copied once, flat, on the weights' device (median of 5)."""
    device = named[0][1].device
    src = torch.empty(total, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copies = sorted(timed(ctx, lambda: dst.copy_(src))[1] for _ in range(5))
    return {"copy_s": round(copies[2], 6), "copy_GBps": round(total / copies[2] / 1e9, 1)}
