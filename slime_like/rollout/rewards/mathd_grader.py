"""The answer grader of the DeepScaleR reward (and of slime's ``math`` rule before math-verify).

Two checks, either one accepts (same order and rules as the published DeepScaleR grader, which
combines Hendrycks' MATH string normalisation with PRM800K's sympy grader):

* ``grade_mathd``: both strings normalised the Hendrycks-MATH way (strip ``\\left``/``\\right``,
  units after ``\\text{ ``, ``\\dfrac``->``\\frac``, ``\\frac12``->``\\frac{1}{2}``, ``a/b``->``\\frac{a}{b}``,
  ``0.5``->``\\frac{1}{2}``, a short ``x =`` prefix dropped, spaces removed) then compared as strings.
* ``grade_sympy``: both normalised more aggressively (LaTeX -> text with pylatexenc, units and
  ``%``/``$`` dropped, lower case, integers canonicalised), tuples/intervals split element-wise,
  and each pair compared with ``sympy.simplify(a - b) == 0``; except that unreduced fractions must
  match literally, and an integer answer must match an integer literally (no simplify).

Kept deliberately faithful, quirks included, so a DeepScaleR recipe gets the same rewards here.
"""
from __future__ import annotations

import logging
import re

# Expressions that make sympy slow or are not worth trying (same guards as the reference).
_BAD_SUBSTRINGS = ("^{", "^(")
_BAD_REGEXES = (re.compile(r"\^[0-9]+\^"), re.compile(r"\^[0-9][0-9]+"))
_TUPLE_CHARS = "()[]"
_UNIT_WORDS = ("degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week",
               "month", "year", "foot", "feet", "inch", "yard")
_TEXT_WRAP = re.compile(r"^\\text\{(?P<text>.+?)\}$")


# ---------------------------------------------------------------- Hendrycks MATH normalisation
def _expand_frac_shorthand(s: str) -> str:
    r"""\frac12 -> \frac{1}{2}, \frac1{7} -> \frac{1}{7}; a malformed one leaves the string unchanged."""
    head, *parts = s.split("\\frac")
    out = head
    for part in parts:
        out += "\\frac"
        if part[0] == "{":          # IndexError on an empty part is handled by the caller (returns input)
            out += part
            continue
        if len(part) < 2:
            return s
        a, b, rest = part[0], part[1], part[2:]
        out += "{" + a + "}" + (b + rest if b == "{" else "{" + b + "}" + rest)
    return out


def _slash_to_frac(s: str) -> str:
    pieces = s.split("/")
    if len(pieces) != 2:
        return s
    try:
        a, b = int(pieces[0]), int(pieces[1])
    except ValueError:
        return s
    return "\\frac{" + str(a) + "}{" + str(b) + "}" if s == f"{a}/{b}" else s


def _sqrt_shorthand(s: str) -> str:
    r"""\sqrt3 -> \sqrt{3}."""
    if "\\sqrt" not in s:
        return s
    head, *parts = s.split("\\sqrt")
    return head + "".join("\\sqrt" + (p if p[0] == "{" else "{" + p[0] + "}" + p[1:]) for p in parts)


def _strip_math_string(s: str) -> str:
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac").replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "")
    if "\\text{ " in s:                 # "\text{ " only ever introduces units on the right
        left, *rest = s.split("\\text{ ")
        if len(rest) != 1:
            raise ValueError("more than one unit block")
        s = left
    s = s.replace("\\%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    lhs_rhs = s.split("=")
    if len(lhs_rhs) == 2 and len(lhs_rhs[0]) <= 2:  # "x = 5" -> "5"
        s = lhs_rhs[1]
    s = _sqrt_shorthand(s).replace(" ", "")
    s = _expand_frac_shorthand(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _slash_to_frac(s)


def mathd_normalize(answer: str | None) -> str | None:
    if answer is None:
        return None
    answer = answer.strip()
    try:
        m = _TEXT_WRAP.search(answer)
        if m is not None:
            answer = m.group("text").strip()
        return _strip_math_string(answer)
    except Exception:  # the reference falls back to the lightly cleaned answer on any failure
        return answer


def grade_mathd(given: str, truth: str) -> bool:
    return mathd_normalize(truth) == mathd_normalize(given)


# ---------------------------------------------------------------- sympy grader (PRM800K style)
def _is_float(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _is_int_value(x: float) -> bool:
    try:
        return abs(x - int(round(x))) <= 1e-7
    except (OverflowError, ValueError):
        return False


def _drop_thousands_commas(s: str) -> str:
    pattern = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
    while True:
        nxt = pattern.sub(r"\1\3\4", s)
        if nxt == s:
            return s
        s = nxt


def _str_is_int(s: str) -> bool:
    try:
        return _is_int_value(float(_drop_thousands_commas(s)))
    except ValueError:
        return False


def _is_plain_fraction(s: str) -> bool:
    return bool(re.search(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$", s))


def _pylatexenc():
    try:
        from pylatexenc import latex2text
    except ImportError as exc:  # without it the grader would silently grade differently
        raise ImportError("--rm-type deepscaler needs pylatexenc (pip install pylatexenc==2.10), the LaTeX "
                          "converter of the reference grader") from exc
    # It logs a warning for every malformed macro in model output (e.g. a bare "\\frac"): noise in training logs.
    logging.getLogger("pylatexenc").setLevel(logging.ERROR)
    return latex2text


def _latex_to_text(s: str, latex2text) -> str:
    s = s.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac").replace("\\frac", " \\frac")
    s = latex2text.LatexNodes2Text().latex_to_text(s)
    for uni, ascii_ in (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*"), ("×", "*")):
        s = s.replace(uni, ascii_)
    return s.strip()


def sympy_normalize(expr: str | None) -> str | None:
    if expr is None:
        return None
    m = _TEXT_WRAP.search(expr)
    if m is not None:
        expr = m.group("text")
    expr = expr.replace("\\%", "%").replace("\\$", "$").replace("$", "").replace("%", "")
    expr = expr.replace(" or ", " , ").replace(" and ", " , ")
    expr = expr.replace("million", "*10^6").replace("billion", "*10^9").replace("trillion", "*10^12")
    for unit in _UNIT_WORDS:
        expr = re.sub(f"{unit}(es)?(s)? *(\\^[0-9]+)?", "", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if expr and expr[0] == "{" and expr[-1] == "}":
        expr = expr[1:-1]
    expr = re.sub(r",\\! *", "", expr)
    if _is_float(expr) and _is_int_value(float(expr)):
        expr = str(int(round(float(expr))))
    if "\\" in expr:
        latex2text = _pylatexenc()
        try:
            expr = _latex_to_text(expr, latex2text)
        except Exception:
            pass
    expr = re.sub("- *", "-", expr)
    expr = re.sub("([0-9]) +([0-9])", r"\1+\2", expr)   # mixed number "7 3/4" -> "7+3/4"
    expr = expr.replace(" ", "").replace("{", "").replace("}", "").lower()
    if _str_is_int(expr):
        expr = str(int(float(expr.replace(",", ""))))
    return expr


def _may_try_sympy(expr: str) -> bool:
    letters = {c for c in expr.replace("sqrt", "").replace("frac", "") if c.isalpha()}
    if len(letters) > 2:
        return False
    if any(bad in expr for bad in _BAD_SUBSTRINGS):
        return False
    return not any(rx.search(expr) for rx in _BAD_REGEXES)


def _sympy_equal(truth: str, given: str) -> bool:
    import sympy
    from sympy.parsing import sympy_parser

    expr = f"({truth})-({given})"
    try:
        if not _may_try_sympy(expr):
            return False
        transformations = sympy_parser.standard_transformations + (
            sympy_parser.implicit_multiplication_application,)
        diff = sympy_parser.parse_expr(expr.replace("^", "**"), transformations=transformations)
        return sympy.simplify(diff) == 0
    except Exception:
        return False


def _split_tuple(expr: str) -> list[str]:
    expr = _drop_thousands_commas(expr)
    if not expr:
        return []
    if (len(expr) > 2 and expr[0] in _TUPLE_CHARS and expr[-1] in _TUPLE_CHARS
            and all(ch not in expr[1:-1] for ch in _TUPLE_CHARS)):
        return [e.strip() for e in expr[1:-1].split(",")]
    return [expr]


def grade_sympy(given: str, truth: str) -> bool:
    truth_n, given_n = sympy_normalize(truth), sympy_normalize(given)
    if truth_n is None or given_n is None:
        return False
    if truth_n == given_n:
        return True
    if not given_n:
        return False
    truth_elems, given_elems = _split_tuple(truth_n), _split_tuple(given_n)
    # A tuple must keep its bracket kinds ("(1,2)" is not "[1,2]") and its length.
    if len(truth_elems) > 1 and (truth_n[0] != given_n[0] or truth_n[-1] != given_n[-1]):
        return False
    if len(truth_elems) != len(given_elems):
        return False
    for t, g in zip(truth_elems, given_elems):
        if _is_plain_fraction(t) and _is_plain_fraction(g):
            ok = t == g                      # unreduced fractions are not accepted
        elif _str_is_int(t) != _str_is_int(g):
            ok = False                       # an integer answer must be given as an integer
        else:
            ok = _sympy_equal(t, g)
        if not ok:
            return False
    return True


def grade(given: str, truth: str) -> bool:
    return grade_mathd(given, truth) or grade_sympy(given, truth)


def grade_answer_verl(solution_str: str, ground_truth) -> bool:
    """verl / slime's ``grade_answer_verl``: the response's last ``\\boxed{}`` against the label (itself unboxed
    when it holds a box), by the mathd then the sympy comparison."""
    from .boxed import last_boxed_content

    if not ground_truth:
        return False
    truth = str(ground_truth)
    if "\\boxed" in truth:
        truth = last_boxed_content(truth)
    given = last_boxed_content(solution_str or "")
    if given is None or truth is None:
        return False
    return grade(given, truth)
