"""The parent process: runs each check in a process of its own with its own time budget, keeps the summary JSON
current, prints the table. It imports no torch (a check that crashes or hangs cannot take it down)."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

SUMMARY = "gpu_summary.json"
SMOKE_SLOWDOWN = 4.0  # budgets x this on CPU (a shared 2-core machine is 3-5x slower than an idle one)


@dataclass(frozen=True)
class Check:
    name: str
    target: str           # "module:function" under slime_like.tools.gpu_check
    budget_s: float       # on the GPU
    needs: tuple = ()     # checks whose pass (or output) this one reads
    requires: str = ""    # a package that must be importable on the GPU, else skipped
    min_start_s: float = 20  # with less of the total budget left it is skipped, not started to time out


CHECKS = (Check("prep", "prep:run", 60),
          Check("parity", "parity:run", 75, ("prep",)),
          Check("megatron_grpo", "grpo:run_megatron", 120, ("prep",)),
          Check("fsdp_grpo", "grpo:run_fsdp", 90, ("prep",)),
          Check("push", "push:run", 75, ("prep",)),
          Check("export", "export:run", 45, ("prep", "megatron_grpo")),
          Check("sglang", "sglang_engine:run", 120, ("prep", "megatron_grpo"), requires="sglang", min_start_s=90))


def env_info() -> dict:
    out = {"python": sys.version.split()[0], "executable": sys.executable}
    for dist in ("torch", "transformers", "megatron-core", "transformer-engine", "apex", "flash-attn", "triton",
                 "sglang", "vllm"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _kill_group(p: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def run_child(check: Check, smoke: bool, work: str, budget: float) -> dict:
    """The check in its own session; killed with its process group (engines, receivers) past its budget."""
    result = os.path.join(work, f"result_{check.name}.json")
    if os.path.exists(result):
        os.remove(result)
    cmd = [sys.executable, "-m", "slime_like.tools.gpu_check", "--child", check.name, "--work", work,
           "--result", result, "--child-budget", str(budget)] + (["--cpu-smoke"] if smoke else [])
    env = dict(os.environ, PYTHONUNBUFFERED="1", MASTER_ADDR="127.0.0.1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false", HF_HUB_DISABLE_PROGRESS_BARS="1")
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                         text=True, bufsize=1, errors="replace")

    def pump():
        for line in p.stdout:
            sys.stdout.write(f"[{check.name}] {line}")
            sys.stdout.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        p.wait(timeout=budget)
    except subprocess.TimeoutExpired:
        timed_out = True
        print(f"[{check.name}] TIMEOUT after {budget:.0f}s: killing its process group", flush=True)
    _kill_group(p)  # also what it started and left behind (an engine, a profiler thread's child)
    reader.join(timeout=5)
    res = {"status": "fail", "summary": "", "details": {}}
    if os.path.exists(result):
        with open(result) as f:
            res = json.load(f)
    if timed_out:
        res.update(status="fail", summary=f"timed out after {budget:.0f}s; so far: {res.get('summary', '')}")
    elif not os.path.exists(result):
        res["summary"] = f"exited with rc={p.returncode} without a result (see its log lines above)"
    res.update(seconds=round(time.time() - t0, 1), timed_out=timed_out)
    res.pop("partial", None)
    return res


OUTPUTS = {"prep": ("qwen2_tiny/config.json", "qwen2_0p5b_random/config.json"),  # smoke, GPU
           "megatron_grpo": ("export_megatron/megatron_logits.pt",) * 2}


def _blocked(check: Check, summary: dict, work: str, smoke: bool) -> str:
    """Why this check cannot run: a need that failed in this run, or (not run now, e.g. --only) left no output in
    the work directory; a package it requires that is missing."""
    for need in check.needs:
        r = summary["checks"].get(need)
        have = os.path.isfile(os.path.join(work, OUTPUTS[need][0 if smoke else 1])) if need in OUTPUTS else False
        if r is None and not have:
            return f"needs {need} (not run here, and no output of an earlier run in {work})"
        if r is not None and r["status"] != "pass" and not (need == "megatron_grpo" and have):
            return f"needs {need} ({r['status']})"  # megatron_grpo's export may exist though another part failed
    if check.requires and not smoke and importlib.util.find_spec(check.requires) is None:  # smoke: a stand-in
        return f"{check.requires} is not importable here"
    return ""


def write_summary(out_dir: str, summary: dict) -> None:
    path = os.path.join(out_dir, SUMMARY)
    with open(path + ".tmp", "w") as f:
        json.dump(summary, f, indent=1, default=str)
    os.replace(path + ".tmp", path)


def table(summary: dict) -> str:
    rows = [("check", "result", "s", "what")]
    rows += [(n, r["status"].upper(), f"{r.get('seconds', 0):.0f}", r.get("summary", ""))
             for n, r in summary["checks"].items()]
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{a:<{w[0]}}  {b:<{w[1]}}  {c:>{w[2]}}  {d}" for a, b, c, d in rows)


def main(a) -> int:
    t_start = time.time()
    out_dir = os.path.abspath(a.out)
    os.makedirs(out_dir, exist_ok=True)
    work = os.path.abspath(a.work or os.path.join(out_dir, "work"))
    os.makedirs(work, exist_ok=True)
    slow = SMOKE_SLOWDOWN if a.cpu_smoke else 1.0
    total = a.total_budget or (400.0 if not a.cpu_smoke else 900.0)
    deadline = t_start + total
    only = set(a.only.split(",")) if a.only else None
    summary = {"mode": "cpu-smoke" if a.cpu_smoke else "gpu", "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ",
               time.gmtime()), "env": env_info(), "total_budget_s": total, "checks": {}}
    print(f"gpu_check: mode={summary['mode']} out={out_dir} budget={total:.0f}s", flush=True)
    for check in CHECKS:
        if only and check.name not in only:
            continue
        left = deadline - time.time()
        why = _blocked(check, summary, work, a.cpu_smoke)
        if why:
            res = {"status": "skip", "summary": why}
        elif left < check.min_start_s * slow:
            res = {"status": "skip", "summary": f"not enough of the total budget left ({left:.0f}s)"}
        else:
            budget = min(check.budget_s * slow, left)
            print(f"\n== {check.name} (budget {budget:.0f}s)", flush=True)
            res = run_child(check, a.cpu_smoke, work, budget)
        summary["checks"][check.name] = res
        if check.name == "prep" and "machine" in res.get("details", {}):
            summary["env"]["machine"] = res["details"]["machine"]
        print(f"== {check.name}: {res['status'].upper()} {res.get('summary', '')}", flush=True)
        write_summary(out_dir, summary)
    summary["total_s"] = round(time.time() - t_start, 1)
    write_summary(out_dir, summary)
    print("\n" + table(summary) + f"\n(total {summary['total_s']:.0f}s; {os.path.join(out_dir, SUMMARY)})", flush=True)
    return 1 if any(r["status"] == "fail" for r in summary["checks"].values()) else 0
