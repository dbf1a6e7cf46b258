"""One check's process: runs it, writes its result JSON, and ends without tearing anything down (a teardown that
hangs, e.g. a process group's, would eat the rest of its budget)."""
from __future__ import annotations

import faulthandler
import importlib
import json
import os
import sys
import time
import traceback
import warnings


def main(name: str, smoke: bool, work: str, result: str, budget: float) -> int:
    faulthandler.enable()
    if budget > 15:  # a hang: every thread's stack in the log before the parent kills us
        faulthandler.dump_traceback_later(budget - 8, exit=False)
    warnings.filterwarnings("ignore", module=r"megatron(\.|$)")  # TE / Apex absent, deprecations: known
    warnings.filterwarnings("ignore", category=FutureWarning)
    from slime_like.tools.gpu_check.common import Ctx, Partial, log, short_error
    from slime_like.tools.gpu_check.runner import CHECKS

    check = next(c for c in CHECKS if c.name == name)
    module, _, fn = check.target.partition(":")
    t0 = time.time()
    res = {"status": "fail", "summary": "", "details": {}}
    try:
        ctx = Ctx(smoke, work)
        if not smoke and not ctx.cuda:
            raise RuntimeError("CUDA is not available (use --cpu-smoke on a machine without a GPU)")
        run = getattr(importlib.import_module(f"slime_like.tools.gpu_check.{module}"), fn)
        status, summary, details = run(ctx, Partial(result))
        res.update(status=status, summary=summary, details=details)
    except BaseException as e:  # noqa: BLE001  (the verdict is "fail" with the reason, whatever happened)
        log(f"check {name} raised:\n{traceback.format_exc()}")
        res.update(summary=short_error(e), error=traceback.format_exc()[-4000:])
        if os.path.exists(result):  # what it had found before it raised
            with open(result) as f:
                part = json.load(f)
            res.update(details=part.get("details", {}), summary=f"{short_error(e)} (after: {part.get('summary')})")
    res["check_s"] = round(time.time() - t0, 1)
    with open(result + ".tmp", "w") as f:
        json.dump(res, f, indent=1, default=str)
    os.replace(result + ".tmp", result)
    sys.stdout.flush()
    os._exit(0)
