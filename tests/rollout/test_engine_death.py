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
        rows = [{"q": f"{i}-{i}=", "a": "0"} for i in range(8)]
        args = make_args(prompt_file(rows), "--rollout-batch-size", 4, "--n-samples-per-prompt", 2,
                         "--rollout-max-response-len", 200, "--custom-rm-path", "rollout.hooks_for_tests.reward_length",
                         # eos ignored: every response is 200 tokens long, so the kill lands mid-generation
                         "--custom-generate-function-path", "rollout.hooks_for_tests.generate_ignore_eos")
        ctl = RolloutController(args, [doomed, engine_url])
        result = {}
        worker = threading.Thread(target=lambda: result.update(out=ctl.generate(0)))
        worker.start()
        time.sleep(0.4)                       # both engines are busy with their half of the 8 requests
        os.kill(proc.pid, signal.SIGKILL)
        worker.join(timeout=240)
        samples, metrics = result["out"]
        assert sorted(s.index for s in samples) == list(range(8))        # none dropped, none doubled
        assert all(s.response_length == len(s.rollout_log_probs) == 200 for s in samples)
        # the next rollout runs on the survivor alone (the dead engine was found in rollout 0 or is now)
        samples1, metrics1 = ctl.generate(1)
        assert sorted(s.index for s in samples1) == list(range(8, 16))
        assert list(ctl.dead_engines) == [doomed] and metrics1["rollout/dead_engines"] == 1
    finally:
        proc.kill()
