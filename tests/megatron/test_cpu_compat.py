"""cpu_compat: each patch is needed (the exact error without it), apply() is idempotent, a model trains
with the patches, importing the backend never loads cpu_compat by itself, and no patch routes ordinary
torch ops through Python (the CUDA-device rewrite wraps only the entry points that take a device).

One child process walks the workload stage by stage with patches applied progressively: every stage
first fails with its patch missing, then passes once the patch is applied. (cuda_sync and moe_splits
need 2 ranks to show; the PP=2 and EP=2 parity tests run through them.)
"""
import json
import os
import subprocess
import sys

import pytest
from _dist import free_port, tiny_ckpts  # noqa: F401  (fixture)

CHILD = r"""
import json, sys, warnings
warnings.filterwarnings("ignore")
import torch, torch.distributed as dist
from slime_like.backends.megatron import checkpoint, hf_weights, model, parallel  # noqa: F401
from slime_like.args import make_args
from slime_like.config.hf_config import fill_args_from_hf
report = {"compat_loaded_by_imports": "slime_like.backends.megatron.cpu_compat" in sys.modules}
from slime_like.backends.megatron import cpu_compat
ALL = list(cpu_compat.PATCHES)
cpu_compat.apply(skip=ALL)  # nothing yet
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[3]}", rank=0, world_size=1)
from megatron.core import parallel_state as ps
ps.initialize_model_parallel()
applied, box = set(), {}
args = fill_args_from_hf(make_args("--hf-checkpoint", sys.argv[1]), sys.argv[1])
moe_args = fill_args_from_hf(make_args("--hf-checkpoint", sys.argv[2]), sys.argv[2])
ids = torch.randint(2, 100, (2, 16), generator=torch.Generator().manual_seed(0))
pos = torch.arange(16).expand(2, 16)

def ddp():  # a fresh model each attempt, so a failed attempt leaves nothing half-wrapped
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    box["m"] = model.build_model(args)[0]
    box["ddp"] = DistributedDataParallel(config=box["m"].config, ddp_config=DistributedDataParallelConfig(),
                                         module=box["m"])

def optimizer():
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    box["opt"] = get_megatron_optimizer(OptimizerConfig(lr=3e-3, clip_grad=1.0, params_dtype=torch.float32),
                                        [box["ddp"]])

STAGES = [
    ("rng_tracker", lambda: parallel.set_seed(1)),
    ("current_device", ddp),
    ("cuda_device_calls", optimizer),
    ("cuda_stream", lambda: box.update(moe=model.build_model(moe_args)[0])),
    ("moe_te_gemm", lambda: box["moe"](ids, pos, None)),
]
for patch, stage in STAGES:
    try:
        stage()
        report[patch] = {"error": None}
    except Exception as e:
        report[patch] = {"error": f"{type(e).__name__}: {e}"}
    applied.add(patch)
    cpu_compat.apply(skip=[p for p in ALL if p not in applied])
    stage()  # passes now

# the model trains with the patches (mcore DDP + optimizer with clip-grad)
losses = []
for _ in range(5):
    box["ddp"].zero_grad_buffer(); box["opt"].zero_grad()
    loss = box["ddp"](ids, pos, None, labels=torch.roll(ids, -1, 1)).mean()
    loss.backward(); box["ddp"].finish_grad_sync(); box["opt"].step()
    losses.append(loss.item())
report["losses"] = losses
cur, stack = torch.cuda.current_device, torch._C._len_torch_function_stack()
report["all"] = cpu_compat.apply()
report["idempotent"] = cpu_compat.apply() == report["all"] and torch.cuda.current_device is cur \
    and torch._C._len_torch_function_stack() == stack
# what cuda_device_calls does, and only there: ordinary ops never pass through Python (no TorchFunctionMode),
# torch's own factories stay the originals (torch.device(...) contexts find them by identity)
import megatron.core.transformer.utils as mcore_utils
report["mode_stack"] = stack
report["torch_untouched"] = torch.matmul is torch._C._VariableFunctions.matmul \
    and torch.zeros is torch._C._VariableFunctions.zeros and torch.Tensor.add is torch._C.TensorBase.add
with torch.device("meta"):
    report["meta_context"] = str(torch.tensor([1.0]).device)
report["devices"] = [str(t.device) for t in (mcore_utils.torch.zeros(2, device="cuda"), torch.ones(1).cuda(),
                     mcore_utils.torch.empty(2, pin_memory=True), mcore_utils.get_default_causal_mask(3))]
report["type_names"] = [torch.ones(1).type(), torch.ones(1).type(torch.float16).dtype == torch.float16]
print("REPORT" + json.dumps(report))
"""

EXPECTED = {
    "rng_tracker": "Torch not compiled with CUDA enabled",
    "current_device": "Torch not compiled with CUDA enabled",
    "cuda_device_calls": "Torch not compiled with CUDA enabled",
    "cuda_stream": "torch.cuda.Stream requires CUDA support",
    "moe_te_gemm": "name 'te_general_gemm' is not defined",
}


@pytest.mark.slow
def test_each_patch_is_needed_and_a_model_trains(tiny_ckpts):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", CHILD, tiny_ckpts["qwen2"], tiny_ckpts["qwen3_moe"], str(free_port())],
                          capture_output=True, text=True, timeout=300, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    report = json.loads(lines[-1][len("REPORT"):])
    assert report["compat_loaded_by_imports"] is False
    for patch, message in EXPECTED.items():
        assert report[patch]["error"] and message in report[patch]["error"], (patch, report[patch])
    assert report["losses"][-1] < report["losses"][0] - 0.05, report["losses"]
    assert report["mode_stack"] == 0 and report["torch_untouched"] and report["meta_context"] == "meta"
    assert report["devices"] == ["cpu"] * 4
    assert report["type_names"] == ["torch.cuda.FloatTensor", True]
    assert report["idempotent"] and sorted(report["all"]) == sorted(
        ["current_device", "rng_tracker", "cuda_device_calls", "cuda_sync", "cuda_stream", "moe_te_gemm", "moe_splits"])


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="cpu_compat refuses to run with CUDA")
def test_unknown_patch_name_is_rejected():
    from slime_like.backends.megatron import cpu_compat

    with pytest.raises(ValueError, match="did you mean 'current_device'"):
        cpu_compat.apply(skip=("current_devcie",))  # raises before applying anything
