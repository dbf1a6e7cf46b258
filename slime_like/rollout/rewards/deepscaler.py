"""DeepScaleR's rule-based reward (``--rm-type deepscaler``), as used by slime's DeepScaleR recipes.

Semantics (DeepScaleR ``rewards/math_reward.py`` and slime ``rm_hub/deepscaler.py``):
  1. Only the text after the thinking marker counts: the part after the last ``</think>``
     (slime also accepts a ``###Response`` marker: the text after its first occurrence).
     No marker -> reward 0 (a format failure).
  2. The answer is the content of the last ``\\boxed{}`` of that text; none -> 0.
  3. A label that itself contains ``\\boxed``/``\\fbox`` is unboxed the same way; an empty label -> 0.
  4. Correct (1) when the Hendrycks string normalisation or the sympy grader accepts it
     (``mathd_grader.grade``), else 0.
"""
from __future__ import annotations

from .boxed import last_boxed_content
from .mathd_grader import grade

THINK_END = "</think>"
RESPONSE_MARKER = "###Response"


def solution_after_thinking(response: str) -> str | None:
    if THINK_END in response:
        return response.split(THINK_END)[-1]
    if RESPONSE_MARKER in response:
        return response.split(RESPONSE_MARKER)[1]
    return None


def deepscaler_reward(response: str, label) -> int:
    solution = solution_after_thinking(response or "")
    if solution is None:
        return 0
    answer = last_boxed_content(solution)
    if answer is None:
        return 0
    return grade_answer(answer, label)


def grade_answer(answer: str, label) -> int:
    """Steps 3-4: compare an extracted answer with the label (1 / 0)."""
    if label == "":
        return 0
    if not isinstance(label, (str, int, float)):
        raise TypeError(f"deepscaler reward: the label must be a string or a number, got {type(label).__name__} "
                        f"({label!r}); check --label-key")
    truth = str(label)
    if "\\boxed" in truth or "\\fbox" in truth:
        truth = last_boxed_content(truth)
        if truth is None:
            return 0
    return 1 if grade(answer, truth) else 0
