"""slime features slime_like does not implement, recognised by the parser: a recipe that passes one still
parses (and --dry-run prints its plan), and the launch refuses it naming the feature (support.py's
check_flag_support collects it into the launch refusals). Hidden from --help.

Its own module, not support.py, because the parser builds its group while support.py reads the built parser.
"""
from __future__ import annotations

import argparse

# slime features slime_like does not implement: recognised, so --dry-run plans the run and the launch refuses it
# naming the feature (never silently ignored).
SLIME_ONLY_FLAGS = {
    "--megatron-to-hf-mode": "Megatron-Bridge weight conversion", "--use-slime-router": "slime's own router",
    "--release-train": "releasing trainer actors between steps",
    "--only-train-params-name-list": "partial-parameter training", "--freeze-params-name-list": "parameter freezing",
    "--pg-loss-type": "REINFORCE score centering", "--use-score-centering": "REINFORCE score centering",
    "--flush-cache-interval": "PipelineRL-style in-flight weight updates",
}


class _Unsupported(argparse.Action):
    """Keeps the value: a recipe that passes one of these still parses (and --dry-run prints its plan); the run is
    refused at launch with the feature's name (support.check_flag_support)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values if values else True)


def add_unsupported_group(parser):
    g = parser.add_argument_group("unsupported slime flags")
    for flag in SLIME_ONLY_FLAGS:
        g.add_argument(flag, action=_Unsupported, nargs="*", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser
