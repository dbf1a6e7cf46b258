"""Issue 19, finding 4 and 5: user files and flag values are data, never code.

A pickled debug dump does not run code when loaded; a tokenizer shipping Python code is refused unless
--trust-remote-code; --moe-layer-freq is parsed by a grammar (a huge expression is refused at once).
"""
import argparse
import json
import os
import time

import pytest
import torch

from slime_like.args import make_args
from slime_like.config.types import moe_layer_freq
from slime_like.rollout.controller import RolloutController, load_tokenizer


class _Payload:
    """Unpickling this writes a marker file: proof that code ran."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.makedirs, (self.marker,))


def test_moe_layer_freq_grammar_refuses_code_and_huge_expressions():
    assert moe_layer_freq("([0]*3+[1]*5)") == [0, 0, 0, 1, 1, 1, 1, 1]
    assert moe_layer_freq("[1,0]*2") == [1, 0, 1, 0] and moe_layer_freq("4") == 4
    t = time.perf_counter()
    for bad in ("[0]*9**9**9", "__import__('os').system('true')", "[0]*10000000", "[0]*3+", "[2]*4"):
        with pytest.raises(argparse.ArgumentTypeError):
            moe_layer_freq(bad)
    assert time.perf_counter() - t < 1.0


def test_debug_rollout_dump_with_code_is_refused_and_nothing_runs(tmp_path):
    marker = str(tmp_path / "code_ran")
    path = str(tmp_path / "rollout_{rollout_id}.pt")
    torch.save({"rollout_id": 0, "samples": [_Payload(marker)]}, path.format(rollout_id=0))
    args = make_args(load_debug_rollout_data=path, load_debug_rollout_data_subsample=None)
    ctl = RolloutController(args, [])
    with pytest.raises(ValueError, match="not loaded"):
        ctl.generate(0)
    assert not os.path.exists(marker)


def test_tokenizer_code_runs_only_with_trust_remote_code(tiny_ckpt, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for name in os.listdir(tiny_ckpt):
        os.symlink(os.path.join(tiny_ckpt, name), ckpt / name)
    os.remove(ckpt / "tokenizer_config.json")
    cfg = json.load(open(os.path.join(tiny_ckpt, "tokenizer_config.json")))
    cfg["auto_map"] = {"AutoTokenizer": ["evil_tok.EvilTokenizer", None]}
    json.dump(cfg, open(ckpt / "tokenizer_config.json", "w"))
    marker = tmp_path / "code_ran"
    (ckpt / "evil_tok.py").write_text(
        f"import os\nos.makedirs({str(marker)!r}, exist_ok=True)\n"
        "from transformers import PreTrainedTokenizerFast\n"
        "class EvilTokenizer(PreTrainedTokenizerFast):\n    pass\n")
    load_tokenizer(make_args(hf_checkpoint=str(ckpt), trust_remote_code=False))  # the built-in class
    assert not marker.exists()
    load_tokenizer(make_args(hf_checkpoint=str(ckpt), trust_remote_code=True))   # asked for: it runs
    assert marker.exists()
