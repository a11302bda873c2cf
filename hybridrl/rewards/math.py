"""Rule-based scorer for MATH-style answers: the last ``\\boxed{...}`` of the response, compared
with the reference answer for mathematical equivalence by the ``math-verify`` library.

MATH: Hendrycks et al., "Measuring Mathematical Problem Solving With the MATH Dataset",
arXiv:2103.03874 (MATH-500 is the subset of Lightman et al., arXiv:2305.20050). The prompts of
the MATH preprocessing ask for "the final answer within \\boxed{}", as verl's math examples do.
``math-verify`` (Hugging Face) parses both sides to sympy and compares them as numbers, sets,
intervals, tuples, equations, ... so ``\\frac12``, ``0.5`` and ``\\dfrac{1}{2}`` are all equal.
"""

from __future__ import annotations

import functools
import threading

__all__ = ["last_boxed_only_string", "remove_boxed", "extract_boxed_answer", "is_equiv", "compute_score"]

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed_only_string(text: str) -> str | None:
    """The last ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed x``) in ``text``, braces matched.

    Returns:
        The whole box command with its argument, e.g. ``"\\boxed{\\frac{1}{2}}"``; ``None`` when
        ``text`` has no box or the last one is never closed.
    """
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    cmd = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    rest = text[start + len(cmd) :]
    if rest.startswith(" "):  # "\boxed 5": the argument runs to the next "$" or the end
        return cmd + " " + rest[1:].split("$")[0].strip()
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, ch in enumerate(rest):
        depth += ch == "{"
        depth -= ch == "}"
        if depth == 0:
            return text[start : start + len(cmd) + i + 1]
    return None


def remove_boxed(boxed: str) -> str:
    """``"\\boxed{x}"`` -> ``"x"`` (also ``\\fbox{x}`` and ``\\boxed x``).

    Raises:
        ValueError: ``boxed`` is not a box command as returned by :func:`last_boxed_only_string`.
    """
    for cmd in _BOX_COMMANDS:
        if boxed.startswith(cmd + " "):
            return boxed[len(cmd) + 1 :]
        if boxed.startswith(cmd + "{") and boxed.endswith("}"):
            return boxed[len(cmd) + 1 : -1]
    raise ValueError(f"not a \\boxed{{...}} expression: {boxed[:60]!r}")


def extract_boxed_answer(solution_str: str) -> str | None:
    """The content of the last ``\\boxed{}`` in a response, stripped; ``None`` if there is none."""
    boxed = last_boxed_only_string(solution_str)
    if boxed is None:
        return None
    answer = remove_boxed(boxed).strip()
    return answer or None


def _timeout() -> int | None:
    # math-verify bounds parsing/comparison with signal.alarm, which only works on the main
    # thread; elsewhere (threaded reward managers) it must be switched off.
    return 5 if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=4096)
def _parse_boxed(latex: str, timeout: int | None) -> tuple:
    """``latex`` (a box's content) parsed by math-verify; cached, since each reference answer
    is parsed once per response."""
    from math_verify import LatexExtractionConfig, parse

    return tuple(parse("\\boxed{" + latex + "}", extraction_config=[LatexExtractionConfig()], parsing_timeout=timeout))


def is_equiv(answer: str, ground_truth: str) -> bool:
    """Whether two LaTeX answers are mathematically equal (math-verify), or equal as strings
    once spaces are removed. Never raises: a parse failure or time-out means "not equal"."""
    if "".join(answer.split()) == "".join(ground_truth.split()):
        return True
    from math_verify import verify

    timeout = _timeout()
    try:
        gold = _parse_boxed(ground_truth, timeout)
        pred = _parse_boxed(answer, timeout)
        return bool(gold and pred and verify(list(gold), list(pred), timeout_seconds=timeout))
    except Exception:  # noqa: BLE001 - sympy/latex2sympy raise anything on odd input
        return False


def compute_score(
    solution_str: str, ground_truth: str, correct_score: float = 1.0, incorrect_score: float = 0.0
) -> dict:
    """Score one response to a MATH-style problem.

    Args:
        solution_str: the decoded response; its last ``\\boxed{...}`` is the answer.
        ground_truth: the reference answer in LaTeX without the box (MATH-500's ``answer``,
            e.g. ``"\\frac{14}{3}"``); numbers are accepted too.
        correct_score: the score of a correct answer.
        incorrect_score: the score of a wrong or missing answer.

    Returns:
        ``{"score": float, "acc": bool, "pred": str | None}``: ``pred`` is the boxed answer
        (``None`` when the response has none; it then scores ``incorrect_score``), used for
        majority voting by the evaluation.
    """
    pred = extract_boxed_answer(solution_str)
    acc = pred is not None and is_equiv(pred, str(ground_truth))
    return {"score": float(correct_score if acc else incorrect_score), "acc": acc, "pred": pred}
