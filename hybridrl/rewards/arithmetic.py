"""Rule-based scorer for the generated arithmetic task (``data_source == "arithmetic"``).

Answer extraction rule (documented because the reward depends on it):

1. A *marked* answer wins: the last ``\\boxed{...}`` or the last occurrence of the word
   "answer" (``Answer: 7``, ``**Answer:** 7``, ``the answer is 7``), whichever comes later
   in the text. For an "answer" marker the rest of that line is read; if it holds an ``=``
   (``Answer: 3 + 4 = 7``) only the text after the last ``=`` counts. The first number in
   that span is the answer.
2. Otherwise the LAST number anywhere in the response is the answer.

Numbers may be negative (``-5``, ``−5``), decimal (``2.5``) or use thousands separators
(``1,000``). A minus directly after a digit is subtraction, not a sign (``10-3`` → 3).
Only one number is ever read, so listing many candidates earns nothing beyond the one chosen.
"""

from __future__ import annotations

import math
import re

__all__ = ["compute_score", "extract_answer", "parse_number"]

_NUMBER = re.compile(r"[-−]?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_ANSWER = re.compile(r"answer", re.IGNORECASE)


def parse_number(text: str) -> float | None:
    """Parse one number written as the task expects (``"-12"``, ``"1,000"``, ``"2.5"``).

    Args:
        text: a string holding exactly one number, surrounding whitespace allowed.

    Returns:
        The value as a float, or ``None`` when ``text`` is not a single number.
    """
    text = text.strip().replace("−", "-").replace(",", "")
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _numbers(text: str) -> list[str]:
    """All numbers in ``text``, in order; a minus right after a digit, letter or ")" is an
    operator, not a sign ("10-3" gives "10", "3")."""
    out = []
    for m in _NUMBER.finditer(text):
        s, start = m.group(), m.start()
        if s[0] in "-−" and start > 0 and (text[start - 1].isalnum() or text[start - 1] == ")"):
            s = s[1:]
        out.append(s)
    return out


def extract_answer(solution_str: str) -> str | None:
    """Return the model's final answer as written (e.g. ``"-1,000"``), or ``None``.

    See the module docstring for the rule: a marked answer (``\\boxed{}`` or "Answer:")
    first, else the last number in the text.

    Args:
        solution_str: the decoded response (prompt not included).
    """
    marked_pos, marked_span = -1, None
    for m in _BOXED.finditer(solution_str):
        marked_pos, marked_span = m.start(), m.group(1)
    for m in _ANSWER.finditer(solution_str):
        if m.start() > marked_pos:
            line = solution_str[m.end() :].split("\n", 1)[0]
            marked_pos, marked_span = m.start(), line.rsplit("=", 1)[-1]
    if marked_span is not None:
        found = _numbers(marked_span)
        if found:
            return found[0]
    found = _numbers(solution_str)
    return found[-1] if found else None


def compute_score(
    solution_str: str, ground_truth: str, extra_info: dict | None = None, format_score: float = 0.0
) -> float:
    """Score one arithmetic response: 1.0 if its final answer equals ``ground_truth``.

    Args:
        solution_str: the decoded response text.
        ground_truth: the exact answer as a string (``reward_model.ground_truth``), e.g. ``"-42"``.
        extra_info: the row's ``extra_info``; unused, accepted for the scorer signature.
        format_score: reward for a response whose extracted answer is wrong.

    Returns:
        1.0 when the extracted answer equals the ground truth (relative tolerance 1e-6),
        ``format_score`` when an answer was found but is wrong, 0.0 when no number was found.

    Raises:
        ValueError: ``ground_truth`` is not a number.
    """
    target = parse_number(str(ground_truth))
    if target is None:
        raise ValueError(
            f"arithmetic compute_score: ground_truth {ground_truth!r} is not a number; "
            "regenerate the data with hybridrl.data.preprocess.arithmetic"
        )
    answer = extract_answer(solution_str)
    if answer is None:
        return 0.0
    value = parse_number(answer)
    if value is not None and math.isclose(value, target, rel_tol=1e-6, abs_tol=1e-9):
        return 1.0
    return format_score
