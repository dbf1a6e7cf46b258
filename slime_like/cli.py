"""The `slime-like` command (also `python -m slime_like`): one entry point for what a user runs.

    slime-like train [FLAGS ...]            the synchronous loop; the same as `python train.py FLAGS ...`
    slime-like train-async [FLAGS ...]      one-step-off or fully async; `python train_async.py FLAGS ...`
    slime-like dry-run [FLAGS ...]          validate and print the plan, start nothing; `train.py --dry-run ...`
    slime-like convert hf-to-megatron [FLAGS ...]    an HF directory -> a Megatron torch_dist checkpoint
    slime-like convert megatron-to-hf [FLAGS ...]    a Megatron checkpoint -> an HF directory
    slime-like demo [RUN_DIR [FLAGS ...]]   the CPU demo end to end (default RUN_DIR runs/demo)
    slime-like demo-vlm [RUN_DIR [FLAGS ...]]    the visual CPU demo: a tiny VLM counts shapes (runs/demo_vlm)
    slime-like plot RUN_DIR                 RUN_DIR/learning_curve.png from RUN_DIR/metrics.jsonl
    slime-like --version

Each command imports only what it needs: `dry-run` runs on the light core (`pip install slime_like`: pyyaml,
omegaconf); `train` needs the extras its flags name (`pip install "slime_like[all]"` for a CPU run).
"""
from __future__ import annotations

import difflib
import sys

from slime_like import __version__


def _train(argv):
    from slime_like.loops.train import main

    return main(argv, prog="slime-like train")


def _train_async(argv):
    from slime_like.loops.train_async import main

    return main(argv, prog="slime-like train-async")


def _dry_run(argv):
    from slime_like.loops.train import main

    return main(["--dry-run", *[a for a in argv if a != "--dry-run"]], prog="slime-like dry-run")


def _convert(argv):
    from slime_like.tools import convert_hf_to_megatron, convert_megatron_to_hf

    tools = {"hf-to-megatron": convert_hf_to_megatron, "megatron-to-hf": convert_megatron_to_hf}
    if not argv or argv[0] not in tools:
        got = f"got {argv[0]!r}" if argv else "none given"
        print(f"slime-like convert: error: the direction is hf-to-megatron or megatron-to-hf ({got}); "
              "e.g. slime-like convert hf-to-megatron --hf-checkpoint HF_DIR --save OUT", file=sys.stderr)
        return 2
    return tools[argv[0]].main(argv[1:], prog=f"slime-like convert {argv[0]}")


def _demo(argv):
    from slime_like.demo.run import main

    return main(argv, prog="slime-like demo")


def _demo_vlm(argv):
    from slime_like.demo.vlm_run import main

    return main(argv, prog="slime-like demo-vlm")


def _plot(argv):
    from slime_like.utils.plot import main

    return main(argv)


COMMANDS = {"train": _train, "train-async": _train_async, "dry-run": _dry_run, "convert": _convert, "demo": _demo,
            "demo-vlm": _demo_vlm, "plot": _plot}


def usage() -> str:
    return __doc__.split("\n\n")[1].replace("    slime-like", "  slime-like")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(f"slime-like {__version__}: RL post-training of LLMs in the style of slime\n\n{usage()}\n\n"
              "`slime-like train --help` lists every flag. New here: `slime-like demo` (CPU, a few minutes).")
        return 0 if argv else 2
    if argv[0] in ("-V", "--version", "version"):
        print(f"slime_like {__version__}")
        return 0
    command = COMMANDS.get(argv[0])
    if command is None:
        close = difflib.get_close_matches(argv[0], COMMANDS, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        print(f"slime-like: error: unknown command {argv[0]!r}{hint}; the commands are {', '.join(COMMANDS)} "
              "(slime-like --help)", file=sys.stderr)
        return 2
    return command(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
