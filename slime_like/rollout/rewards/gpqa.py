"""Multiple-choice letter matching (``--rm-type gpqa``), following slime's ``rm_hub/gpqa.py``.

Semantics:
  * the chain of thought (everything up to the last ``</think>``) is ignored;
  * valid letters: ``metadata["valid_letters"]``, else A.. for ``metadata["choices"]``, else A-J;
  * the correct letter: ``metadata["correct_letter"]``, else a one-letter label, else an integer
    label as an index, else the choice whose normalised text equals the label;
  * the chosen letter is the first match of "answer/option/choice (is|:) X", "X is (the) correct",
    "final answer (is|:) X" (case-insensitive), else the last standalone valid capital letter;
  * letter found and correct letter known -> 1.0 / 0.0 by equality; otherwise the normalised text
    of the correct choice (or ``correct_answer`` / ``answer_text`` / a long label) appearing as
    whole words in the response -> 1.0; else 0.0.
"""
from __future__ import annotations

import re
import string

DEFAULT_LETTERS = list(string.ascii_uppercase[:10])
_LETTER_PATTERNS = (
    r"(?:answer|option|choice)\s*(?:is|:)?\s*([A-Z])",
    r"([A-Z])\s*(?:is\s*(?:the)?\s*correct)",
    r"final\s*(?:answer|option)\s*(?:is|:)?\s*([A-Z])",
)


def _after_thinking(text: str) -> str:
    return text.rsplit("</think>", 1)[-1] if "</think>" in text else text


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()


def extract_letter(response: str, valid_letters) -> str | None:
    text = _after_thinking(response or "")
    if not text:
        return None
    valid = {v.upper() for v in valid_letters}
    for pattern in _LETTER_PATTERNS:
        m = re.search(pattern, text, flags=re.IGNORECASE)
        if m and m.group(1).upper() in valid:
            return m.group(1).upper()
    for letter in reversed(re.findall(r"\b([A-Z])\b", text)):
        if letter in valid:
            return letter
    return None


def gpqa_reward(response: str, label, metadata: dict | None = None) -> float:
    if response is None:
        return 0.0
    metadata = metadata or {}
    choices = metadata.get("choices")
    choices = list(choices.values()) if isinstance(choices, dict) else (list(choices) if choices is not None else None)
    if metadata.get("valid_letters"):
        letters = [str(v).upper() for v in metadata["valid_letters"]]
    elif choices:
        letters = list(string.ascii_uppercase[:len(choices)])
    else:
        letters = DEFAULT_LETTERS

    correct = metadata.get("correct_letter")
    correct = correct.strip().upper() if isinstance(correct, str) else None
    label_text = None
    if isinstance(label, str):
        label_text = label.strip()
        if len(label_text) == 1 and label_text.upper() in letters and not correct:
            correct = label_text.upper()
    elif isinstance(label, (int, float)) and 0 <= int(label) < len(letters):
        correct = letters[int(label)]
    if not correct and choices and label_text:
        for i, choice in enumerate(choices):
            if _norm(str(choice)) == _norm(label_text):
                correct = letters[i]
                break

    chosen = extract_letter(response, letters)
    if chosen and correct:
        return 1.0 if chosen == correct else 0.0

    # No letter to compare: accept the correct answer's text written out in the response.
    targets = []
    if correct and choices and correct in letters and letters.index(correct) < len(choices):
        targets.append(str(choices[letters.index(correct)]))
    targets += [str(metadata[k]) for k in ("correct_answer", "answer_text") if metadata.get(k)]
    if label_text and not (len(label_text) == 1 and label_text.upper() in letters):
        targets.append(label_text)
    haystack = f" {_norm(_after_thinking(response))} "
    if any(_norm(t) and f" {_norm(t)} " in haystack for t in targets):
        return 1.0
    if chosen and not correct and label_text:
        return 1.0 if chosen == label_text.upper() else 0.0
    return 0.0
