"""``--rm-type math``: answer equivalence checked by math-verify (HuggingFace's maintained grader).

math-verify parses the gold answer and the response into sympy objects (it finds the final
answer itself: the last ``\\boxed{}`` first, else the last LaTeX / plain expression) and compares
them symbolically (fractions, decimals to 6 places, sets, intervals, equations, units dropped).
This replaces slime's older hand-written ``grade_answer_verl`` on purpose (the issue asks for a
maintained grader); ``--rm-type deepscaler`` keeps that older grader for recipes that need it.

Reward: 1.0 when equivalent, else 0.0 (also 0.0 when nothing parses).
"""
from __future__ import annotations

import threading


def _wrap_gold(label: str) -> str:
    # A bare label like "1/2" or "\frac{1}{2}" parses best as LaTeX math.
    if "\\boxed" in label or "$" in label:
        return label
    return f"${label}$"


def math_reward(response: str, label) -> float:
    from math_verify import parse, verify

    if label is None or str(label).strip() == "":
        return 0.0
    # math-verify's timeouts use SIGALRM, which only works on the main thread (Ray actors and
    # executor threads are not): there we run without its timeout.
    on_main = threading.current_thread() is threading.main_thread()
    timeout = {} if on_main else {"parsing_timeout": None}
    gold = parse(_wrap_gold(str(label)), **timeout)
    pred = parse(response or "", **timeout)
    if not gold or not pred:
        return 0.0
    ok = verify(gold, pred, **({} if on_main else {"timeout_seconds": None}))
    return 1.0 if ok else 0.0
