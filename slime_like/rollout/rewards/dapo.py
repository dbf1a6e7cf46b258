"""DAPO's reward (``--rm-type dapo``): the math_dapo scorer of verl, used by slime's DAPO recipes.

Semantics (verl ``utils/reward_score/math_dapo.py``, default ``strict_box_verify=False``):
  * only the last 300 characters of the response are read;
  * the prediction is the text after the last ``Answer:`` (case-insensitive, to the end of that line),
    ``[INVALID]`` when there is none;
  * prediction and label go through the Minerva answer normalisation (``normalize_final_answer``);
  * the label is an integer in DAPO-Math-17k, compared as ``str(int(float(label)))``;
  * reward +1.0 when equal, -1.0 otherwise, returned as ``{"score", "acc", "pred"}``
    (train on it with ``--reward-key score``; ``acc`` is the 0/1 correctness).
"""
from __future__ import annotations

import re

from .boxed import last_boxed_content_dapo

_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")

# Minerva (Lewkowycz et al. 2022, appendix) answer normalisation tables.
_REPLACE = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
            (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"))
_DROP = ("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
         "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
         "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
         "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;",
         r",\!", "{,}", '"', "\\dots", "<|im_end|>", "<|endoftext|>")


def normalize_final_answer(answer: str) -> str:
    s = str(answer).split("=")[-1]
    for old, new in _REPLACE:
        s = s.replace(old, new)
    for junk in _DROP:
        s = s.replace(junk, "")
    s = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", s)           # keep the first $...$ only
    for cmd in ("text", "textbf", "overline"):
        s = re.sub(r"(\\" + cmd + r"\{)(.*?)(\})", "\\2", s)
    s = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", s)
    s = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", s)          # \fracab -> \frac{a}{b}
    s = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", s)                  # \sqrta -> \sqrt{a}
    s = s.replace("$", "")
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


def dapo_reward(response: str, label) -> dict:
    tail = (response or "")[-300:]
    matches = _ANSWER.findall(tail)
    return dapo_score_prediction(matches[-1] if matches else "[INVALID]", label)


def dapo_score_prediction(prediction: str, label) -> dict:
    """Score an extracted prediction against the integer label (``boxed_dapo`` passes the box content)."""
    pred = normalize_final_answer(prediction)
    try:
        truth = str(int(float(normalize_final_answer(label))))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"dapo reward: the label must be an integer (DAPO-Math-17k style), got {label!r}; "
                         f"use --rm-type math for other answers") from exc
    correct = pred == truth
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}


def dapo_compute_score(solution_str: str, ground_truth, strict_box_verify: bool = False,
                       pause_tokens_index: list[int] | None = None) -> dict:
    """verl / slime's ``math_dapo.compute_score`` signature. ``strict_box_verify``: the last ``\\boxed{}`` of the
    response's last 100 characters (after the last pause token when given) must equal the label as written."""
    if not strict_box_verify:
        return dapo_reward(solution_str, ground_truth)
    if pause_tokens_index is not None:
        if len(pause_tokens_index) != 4:
            raise ValueError(f"pause_tokens_index: expected 4 positions, got {pause_tokens_index!r}")
        tail = (solution_str or "")[pause_tokens_index[-1] - 100:]
    else:
        tail = (solution_str or "")[-100:]
    pred = last_boxed_content_dapo(tail)
    correct = pred == ground_truth
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}
