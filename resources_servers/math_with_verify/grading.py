"""Symbolic answer checking with math-verify, meant to run in a worker process (``CpuPool``).

Kept apart from ``app.py`` so that a worker imports only this module and math-verify, and imported
lazily so that the server process itself never loads sympy: it only ships text to the workers.
Everything a worker returns is plain data (strings, booleans), never sympy objects, so results
pickle cheaply and the server never has to unpickle arbitrary expressions.

math-verify's own per-step time limits use ``SIGALRM``; a pebble worker runs tasks on its main
thread, where that works. They turn a slow parse into "no answer" (reward 0) while the worker lives
on; the pool's hard limit in ``app.py`` is the backstop for anything they miss.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

FRACTION = re.compile(r"^(-?)(\d+)/(\d+)$")
MAX_ANSWER_REPORT_CHARS = 500


@lru_cache(maxsize=2)
def _prediction_config(allow_unanchored: bool) -> tuple[Any, ...]:
    """``\\boxed{}`` first (priority 0), then "answer: ..." style anchors, then bare expressions."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    return (
        LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=allow_unanchored),
        ExprExtractionConfig(try_extract_without_anchor=allow_unanchored),
    )


@lru_cache(maxsize=4096)
def _parse_gold(expected: str, step_timeout_s: int) -> tuple[Any, ...]:
    """The reference answer, parsed as LaTeX math or a plain expression (cached per worker)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    text = expected if "\\boxed" in expected or "$" in expected else f"${expected}$"
    return tuple(
        parse(text, [LatexExtractionConfig(), ExprExtractionConfig()], parsing_timeout=step_timeout_s)
    )


def canonical(value: Any) -> str:
    """A stable string for an extracted answer, so equal numbers vote together in majority@k.

    Numbers become exact rationals (``0.75`` and ``\\frac{6}{8}`` both give ``3/4``); ``x = 5``
    becomes ``5``; anything else is sympy's own string form.
    """
    import sympy

    if isinstance(value, str):
        return value[:MAX_ANSWER_REPORT_CHARS]
    try:
        if isinstance(value, sympy.Eq) and isinstance(value.lhs, sympy.Symbol):
            value = value.rhs
        if isinstance(value, sympy.Basic):
            value = value.doit()  # 12*(1/100) -> 3/25
            if value.is_Float:
                value = sympy.nsimplify(value, rational=True)  # 0.75 -> 3/4
    except Exception:  # a canonical form is a convenience: fall back to the plain string
        pass
    return str(value)[:MAX_ANSWER_REPORT_CHARS]


def grade(text: str, expected: str, allow_unanchored: bool, step_timeout_s: int) -> dict[str, Any]:
    """Extract the final answer from ``text`` and compare it with ``expected``.

    Returns ``gold_ok`` (the reference parsed), ``correct``, ``extracted_answer`` (canonical) and
    ``extracted_text`` (the answer as written). Never raises for any input text.
    """
    from math_verify import parse, verify

    gold = _parse_gold(expected, step_timeout_s)
    result: dict[str, Any] = {
        # Only a string match (math-verify's fallback) means the reference is not math at all.
        "gold_ok": any(not isinstance(g, str) for g in gold),
        "correct": False,
        "extracted_answer": None,
        "extracted_text": None,
    }
    if not result["gold_ok"]:
        return result
    try:
        predicted = parse(text, _prediction_config(allow_unanchored), parsing_timeout=step_timeout_s)
    except Exception:
        predicted = []
    if not predicted:
        return result
    result["extracted_answer"] = canonical(predicted[0])
    written = predicted[-1] if isinstance(predicted[-1], str) else str(predicted[0])
    result["extracted_text"] = written[:MAX_ANSWER_REPORT_CHARS]
    try:
        result["correct"] = bool(verify(list(gold), predicted, timeout_seconds=step_timeout_s))
    except Exception:
        result["correct"] = False
    return result


def warm_up() -> None:
    """A worker's first grade, before any rollout's time limit starts: imports sympy and
    math-verify and builds their LaTeX parser (seconds on a busy machine), so that a worker started
    to replace a killed one grades the next answer within the limit (``cpu_worker_initializer``)."""
    grade("\\boxed{1}", "1", allow_unanchored=False, step_timeout_s=60)


def answer_latex(answer: str) -> str:
    """``3/4`` as ``\\frac{3}{4}`` (and ``-3/4`` as ``-\\frac{3}{4}``); other answers unchanged."""
    match = FRACTION.match(answer.strip())
    if match is None:
        return answer
    sign, numerator, denominator = match.groups()
    return f"{sign}\\frac{{{numerator}}}{{{denominator}}}"
