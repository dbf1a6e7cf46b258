"""The GPU check suite's CPU smoke: `bash scripts/gpu-check.sh --cpu-smoke --out DIR` runs every check of the GPU
run on a 2-layer model with gloo (the same code; the SGLang check against the project's CPU engine), exits 0 and
writes its JSON summary; a check past its time budget is killed with its process group and reported as failed,
without stopping the run."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAINING_CHECKS = ("megatron_grpo", "fsdp_grpo")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    proc = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu-check.sh"), "--cpu-smoke", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, PYTHONPATH=ROOT, PYTHON=sys.executable))
    with open(out / "gpu_summary.json") as f:
        return proc, json.load(f), out


def test_smoke_exits_0_and_every_check_passes_or_says_why_it_skipped(smoke):
    proc, summary, _ = smoke
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    checks = summary["checks"]
    assert summary["mode"] == "cpu-smoke" and list(checks) == ["prep", "parity", "megatron_grpo", "fsdp_grpo", "push",
                                                               "export", "sglang"]
    for name in checks:
        assert checks[name]["status"] == "pass", (name, checks[name]["summary"])
    # the SGLang check's code against the project's CPU engine (the same protocol): push, generate, compare
    assert checks["sglang"]["details"]["engine"] == "cpu" and checks["sglang"]["details"]["output_changed_by_push"]
    assert "check" in proc.stdout and "megatron_grpo  PASS" in proc.stdout  # the printed table


def test_smoke_numbers_are_the_ones_the_gpu_run_reports(smoke):
    checks = smoke[1]["checks"]
    assert checks["parity"]["details"]["megatron_fp32_vs_hf_fp32"]["logp_max"] < 2e-5
    for name in TRAINING_CHECKS:
        d = checks[name]["details"]
        s = d["logprob_sums"]
        assert s["pos_after"] > s["pos_before"] and s["neg_after"] < s["neg_before"]  # learning
        assert all(step["kl_loss"] is not None for step in d["steps"])  # the KL reference is in the loss
        assert d["throughput"]["tokens_per_s"] > 0 and d["hf_baseline"]["throughput"]["tokens_per_s"] > 0
        assert d["speed_ratio_vs_hf"] > 0 and "profiled_wall_s" in d["profile"]
        assert d["offload"]["log_probs_max_diff_after_onload"] < 1e-5
    assert checks["push"]["details"]["bit_identical"] and checks["push"]["details"]["sync_s"]
    assert checks["export"]["details"]["trained_megatron_vs_hf_export"]["logp_max"] < 2e-5


def test_a_check_past_its_budget_is_killed_and_reported(tmp_path):
    from slime_like.tools.gpu_check.runner import CHECKS, run_child

    prep = next(c for c in CHECKS if c.name == "prep")
    res = run_child(prep, smoke=True, work=str(tmp_path), budget=0.5)  # importing torch alone takes longer
    assert res["timed_out"] and res["status"] == "fail" and "timed out after" in res["summary"]
    assert res["seconds"] < 15


def test_only_reruns_a_check_on_an_earlier_runs_outputs(smoke, tmp_path):
    """--only export --work <the smoke's work dir>: prep's checkpoint and megatron_grpo's export are read from there."""
    work = smoke[2] / "work"
    proc = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu-check.sh"), "--cpu-smoke", "--out",
                           str(tmp_path), "--work", str(work), "--only", "export"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, PYTHONPATH=ROOT, PYTHON=sys.executable))
    with open(tmp_path / "gpu_summary.json") as f:
        checks = json.load(f)["checks"]
    assert proc.returncode == 0 and list(checks) == ["export"] and checks["export"]["status"] == "pass", proc.stdout
    missing = subprocess.run([sys.executable, "-m", "slime_like.tools.gpu_check", "--cpu-smoke", "--out",
                              str(tmp_path / "b"), "--only", "parity"], cwd=ROOT, capture_output=True, text=True,
                             timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    with open(tmp_path / "b" / "gpu_summary.json") as f:
        parity = json.load(f)["checks"]["parity"]
    assert missing.returncode == 0 and parity["status"] == "skip" and parity["summary"].startswith("needs prep")
