"""slime.rollout.rm_hub.math_utils: the boxed answer and the MATH (mathd + sympy) comparison
(slime_like/rollout/rewards/boxed.py, mathd_grader.py)."""
from slime_like.rollout.rewards.boxed import last_boxed_content as extract_answer
from slime_like.rollout.rewards.mathd_grader import grade_answer_verl

__all__ = ["extract_answer", "grade_answer_verl"]
