"""One generated response and everything the later stages attach to it.

This is the contract between rollout (which fills it) and training (which reads it).
It lives at the bottom of the package and imports nothing of ours.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Status(str, enum.Enum):
    PENDING = "pending"
    COMPLETED = "completed"    # the engine stopped on eos / a stop string or token
    TRUNCATED = "truncated"    # hit max_new_tokens
    ABORTED = "aborted"        # cut off by /abort_request (over-sampling, partial rollout)
    FAILED = "failed"          # the engine or a custom function raised


@dataclass
class Sample:
    """One response to one prompt. Token lists are plain Python ints / floats so a Sample pickles cheaply."""

    index: int = 0                       # global sample id, unique within a run
    group_index: int = 0                 # the prompt's id; the n samples of a prompt share it
    prompt: Any = ""                     # the raw prompt (text or OpenAI message list)
    label: Any = None                    # ground truth for the reward function
    metadata: dict = field(default_factory=dict)
    tokens: list[int] = field(default_factory=list)          # prompt tokens + response tokens
    response: str = ""
    response_length: int = 0             # the last `response_length` entries of `tokens` are the response
    loss_mask: list[int] = field(default_factory=list)       # len == response_length; 0 for tool/env tokens
    rollout_log_probs: list[float] = field(default_factory=list)  # len == response_length, from the engine
    reward: Any = None                   # float, or dict (select with --reward-key)
    status: Status = Status.PENDING
    remove_sample: bool = False          # set by --rollout-sample-filter-path: kept for group statistics, not trained

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length
