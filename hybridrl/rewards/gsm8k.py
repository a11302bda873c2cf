"""Rule-based GSM8K scorer: compare the model's final number with the reference answer.

GSM8K: "Training Verifiers to Solve Math Word Problems", Cobbe et al., arXiv:2110.14168.
The reference solutions end with ``#### <number>``; the prompts built by the GSM8K
preprocessing ask the model to do the same, which is what the "strict" method checks.
"""

from __future__ import annotations

import re

from hybridrl.errors import UserError

__all__ = ["extract_solution", "compute_score"]

# verl's patterns: a number after the last "#### " (strict), or any number (flexible).
_STRICT_RE = re.compile(r"#### (\-?[0-9\.\,]+)")
_NUMBER_RE = re.compile(r"(\-?[0-9\.\,]+)")
_METHODS = ("strict", "flexible")


class GSM8KMethodError(UserError, ValueError):
    """An unknown extraction method was asked for."""


def _normalize(number: str) -> str:
    # "1,000" and "$18" mean the same as "1000" and "18"; "18." is a number ending a sentence.
    number = number.replace(",", "").replace("$", "").strip()
    if number.endswith(".") and number not in (".", "-."):
        number = number.rstrip(".")
    return number


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """Extract the final numeric answer from a model response.

    Args:
        solution_str: the decoded response text.
        method: ``"strict"`` takes the number after the last ``"#### "`` (verl's regex
            ``#### (\\-?[0-9\\.\\,]+)``); ``"flexible"`` takes the last number anywhere in the
            text, skipping matches that are just ``"."``.

    Returns:
        The number as a string with commas and ``$`` removed (and a sentence-ending ``"."``
        dropped, so ``"#### 18."`` gives ``"18"``), or ``None`` when nothing was found.

    Raises:
        GSM8KMethodError: ``method`` is not ``"strict"`` or ``"flexible"``.
    """
    if method == "strict":
        matches = _STRICT_RE.findall(solution_str)
    elif method == "flexible":
        matches = [m for m in _NUMBER_RE.findall(solution_str) if _normalize(m) not in ("", ".", "-", "-.")]
    else:
        raise GSM8KMethodError(
            f"gsm8k method={method!r} is unknown; use one of {list(_METHODS)} "
            "(strict reads the number after the last '#### ', flexible the last number)"
        )
    if not matches:
        return None
    answer = _normalize(matches[-1])
    return answer or None


def _same_number(answer: str, ground_truth: str) -> bool:
    if answer == ground_truth:
        return True
    try:  # "18.0" vs "18": equal as numbers
        return float(answer) == float(ground_truth)
    except ValueError:
        return False


def compute_score(
    solution_str: str,
    ground_truth: str,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """Score one GSM8K response.

    Args:
        solution_str: the decoded response text.
        ground_truth: the reference final answer (e.g. ``"18"``; commas are ignored, so the raw
            ``"1,450,000"`` of the data set also works). Numbers are also accepted.
        method: ``"strict"`` or ``"flexible"``, see :func:`extract_solution`.
        format_score: returned when an answer was extracted but is wrong.
        score: returned when the extracted answer equals ``ground_truth``.

    Returns:
        ``score`` if the extracted answer equals ``ground_truth`` (as a string, or as a number:
        ``"18.0"`` equals ``"18"``), ``format_score`` if an answer was extracted but differs,
        ``0.0`` if no answer was found.

    Raises:
        GSM8KMethodError: ``method`` is not ``"strict"`` or ``"flexible"``.
    """
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    if _same_number(answer, _normalize(str(ground_truth))):
        return float(score)
    return float(format_score)
