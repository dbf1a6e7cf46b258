"""Token-level F1 (``--rm-type f1``): SQuAD's metric with HotpotQA's yes/no rule, as in slime's rm_hub.

Both strings are lower-cased, stripped of punctuation and of the articles a/an/the, and split on
whitespace; F1 = 2PR/(P+R) over the multiset of shared tokens. When either side normalises to
``yes``/``no``/``noanswer`` the two must be identical, else 0. A list of labels scores the best one.
"""
from __future__ import annotations

import re
import string
from collections import Counter

_PUNCT = set(string.punctuation)
_SPECIAL = ("yes", "no", "noanswer")


def normalize_answer(text: str) -> str:
    text = "".join(ch for ch in str(text).lower() if ch not in _PUNCT)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def f1_with_pr(prediction: str, truth: str) -> tuple[float, float, float]:
    """(f1, precision, recall)."""
    pred_n, truth_n = normalize_answer(prediction), normalize_answer(truth)
    if (pred_n in _SPECIAL or truth_n in _SPECIAL) and pred_n != truth_n:
        return 0.0, 0.0, 0.0
    pred_toks, truth_toks = pred_n.split(), truth_n.split()
    same = sum((Counter(pred_toks) & Counter(truth_toks)).values())
    if same == 0:
        return 0.0, 0.0, 0.0
    precision, recall = same / len(pred_toks), same / len(truth_toks)
    return 2 * precision * recall / (precision + recall), precision, recall


def f1_reward(response: str, label) -> float:
    labels = label if isinstance(label, (list, tuple)) else [label]
    if not labels:
        raise ValueError("f1 reward: empty label list; check --label-key")
    return max(f1_with_pr(response or "", str(t))[0] for t in labels)
