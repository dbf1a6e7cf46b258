"""Finding the last ``\\boxed{...}`` in a model response.

Two published graders disagree on small details of this, so both variants are kept, each named
after the grader it belongs to:

* ``last_boxed_content`` (Hendrycks MATH / DeepScaleR / slime's ``boxed_`` prefix): the last
  ``\\boxed`` (or, when there is none, the last ``\\fbox``) up to its balanced closing brace; the
  content is returned only when the match really has the ``\\boxed{...}`` shape, else None.
* ``last_boxed_content_dapo`` (DAPO / verl ``math_dapo``): only ``\\boxed{`` is searched.
"""
from __future__ import annotations


def _balanced_span(text: str, start: int) -> str | None:
    """text[start:] up to (and including) the brace that closes the first '{' after start."""
    depth = 0
    for pos in range(start, len(text)):
        ch = text[pos]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start:pos + 1]
    return None


def _unbox(span: str | None) -> str | None:
    prefix = "\\boxed{"
    if span is None or not span.startswith(prefix) or not span.endswith("}"):
        return None
    return span[len(prefix):-1]


def last_boxed_span(text: str) -> str | None:
    """The whole last ``\\boxed{...}`` (falls back to ``\\fbox``) including the command, or None."""
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    return _balanced_span(text, start)


def last_boxed_content(text: str) -> str | None:
    """Content of the last ``\\boxed{}``; None when the response has no (well-formed) box.

    Like the DeepScaleR reference, a response that has no ``\\boxed`` at all gives None even if
    it has an ``\\fbox`` (their extractor only looks when the string contains ``\\boxed``).
    """
    if text is None or "\\boxed" not in text:
        return None
    return _unbox(last_boxed_span(text))


def last_boxed_content_dapo(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    return _unbox(_balanced_span(text, start))
