"""The package's stdlib logging setup: one handler, level from SLIME_LIKE_LOG_LEVEL, clear error on a typo."""
import logging
import subprocess
import sys

import pytest

from slime_like.utils.log import get_logger, setup_logging


def test_level_from_env_and_one_handler(monkeypatch):
    monkeypatch.setenv("SLIME_LIKE_LOG_LEVEL", "debug")
    root = setup_logging()
    setup_logging()
    assert root.level == logging.DEBUG
    assert sum(h.get_name() == "slime_like_stream" for h in root.handlers) == 1
    assert get_logger("rollout.x").name == "slime_like.rollout.x"
    monkeypatch.setenv("SLIME_LIKE_LOG_LEVEL", "WARNIGN")
    with pytest.raises(ValueError, match="did you mean 'WARNING'"):
        setup_logging()
    setup_logging("INFO")


def test_format_in_a_fresh_process():
    code = "from slime_like.utils.log import get_logger; get_logger('demo').info('hello %d', 3)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={"SLIME_LIKE_LOG_LEVEL": "INFO", "PATH": ""})
    line = out.stderr.strip()
    assert line.endswith(" I slime_like.demo: hello 3"), out.stderr
