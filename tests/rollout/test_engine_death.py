"""An engine killed in the middle of a rollout: its requests finish on the other engine."""
import os
import signal
import threading
import time

import pytest

from slime_like.rollout.controller import RolloutController

from .conftest import start_cpu_engine


@pytest.mark.slow
def test_engine_killed_mid_rollout(engine_url, tiny_ckpt, prompt_file, make_args, tmp_path):
    proc, doomed = start_cpu_engine(tiny_ckpt, str(tmp_path / "doomed.log"))
    try:
        rows = [{"q": f"{i}-{i}=", "a": "0"} for i in range(4)]
        args = make_args(prompt_file(rows), "--rollout-batch-size", 4, "--n-samples-per-prompt", 2,
                         "--rollout-max-response-len", 200, "--custom-rm-path", "rollout.hooks_for_tests.reward_length")
        ctl = RolloutController(args, [doomed, engine_url])
        result = {}
        worker = threading.Thread(target=lambda: result.update(out=ctl.generate(0)))
        worker.start()
        time.sleep(0.4)                       # both engines are busy with their half of the 8 requests
        os.kill(proc.pid, signal.SIGKILL)
        worker.join(timeout=240)
        samples, metrics = result["out"]
        assert sorted(s.index for s in samples) == list(range(8))        # none dropped, none doubled
        assert all(s.response_length == len(s.rollout_log_probs) > 0 for s in samples)
        assert doomed in ctl.dead_engines and metrics["rollout/dead_engines"] == 1
    finally:
        proc.kill()
