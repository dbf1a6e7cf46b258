"""A console a user can act on: the known library notices that say nothing actionable are filtered, and one line
says instead what is not available on this machine and why it does not matter.

Filtered (each trainer printed 7 of them on a CPU, a PPO run twice, with Ray's de-duplication notice after):
- megatron-core's import-time UserWarnings "Transformer Engine and Apex are not installed. Falling back to ..." and
  "Apex is not installed. Falling back to Torch Norm": on a CPU there is nothing to install; on a GPU the
  `unavailable_on_this_machine` line names the packages;
- megatron-core's "Implicit initialization of Rerun State Machine!" and "RerunStateMachine initialized in mode
  RerunMode.DISABLED": Megatron-LM's training loop initialises it explicitly; we never use it (disabled is the
  default either way).
Every other warning still prints. (megatron-core's "full scope is deprecated. Use empty cuda_graph_scope" is not
filtered: backends/megatron/transformer_config.py passes the non-deprecated spelling of its own default instead.)
"""
from __future__ import annotations

import importlib.util
import logging
import os
import warnings

# message prefixes of the UserWarnings filtered (warnings matches a message from its start)
KNOWN_WARNINGS = ("Transformer Engine and Apex are not installed", "Apex is not installed")
# (logger, message prefixes) of the logging records filtered
KNOWN_LOG_RECORDS = (("megatron.core.rerun_state_machine",
                      ("Implicit initialization of Rerun State Machine", "RerunStateMachine initialized in mode")),)


class _DropKnown(logging.Filter):
    def __init__(self, prefixes):
        super().__init__()
        self.prefixes = tuple(prefixes)

    def filter(self, record):
        return not str(record.msg).startswith(self.prefixes)


def quiet_known_notices() -> None:
    """Filter the known notices in this process (a trainer actor calls it before megatron-core is imported)."""
    for prefix in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=prefix, category=UserWarning)
    for name, prefixes in KNOWN_LOG_RECORDS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropKnown) for f in logger.filters):
            logger.addFilter(_DropKnown(prefixes))


def python_warnings_env() -> str:
    """PYTHONWARNINGS for the run's Ray workers: the user's own setting, then the known warnings ignored (a
    worker process may import megatron-core before any of our code runs in it)."""
    ours = [f"ignore:{prefix}:UserWarning" for prefix in KNOWN_WARNINGS]
    return ",".join(filter(None, [os.environ.get("PYTHONWARNINGS", ""), *ours]))


def unavailable_on_this_machine(args) -> list[str]:
    """One line per missing optional accelerator library the run would use, saying why it does not matter."""
    if args.train_backend != "megatron":
        return []
    missing = [name for name, module in (("TransformerEngine", "transformer_engine"), ("Apex", "apex"))
               if importlib.util.find_spec(module) is None]
    if not missing:
        return []
    return [f"{' and '.join(missing)} not installed: megatron-core uses its PyTorch layers, optimizer and norms "
            "(the same training; they are GPU speed-ups, worth installing on GPU machines only)"]
