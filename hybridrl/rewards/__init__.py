"""Reward scorers: a registry from ``data_source`` to a rule-based scoring function.

Light on purpose (no torch, no transformers): built-in scorers are named as
``"module:function"`` strings and imported on first use.

A scorer is called as ``fn(solution_str, ground_truth, **kwargs)``, plus ``extra_info=...`` when
it accepts an ``extra_info`` parameter (or ``**kwargs``). It returns a float, or a dict with a
``"score"`` key and any other per-sample values to log.

Extending::

    from hybridrl.rewards import register_scorer

    @register_scorer("my_dataset")
    def compute_score(solution_str, ground_truth, extra_info=None):
        return float(solution_str.strip() == ground_truth)
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from hybridrl.errors import UserError
from hybridrl.registry import Registry, RegistryError

__all__ = [
    "SCORERS",
    "UnknownDataSourceError",
    "ScorerRegistrationError",
    "register_scorer",
    "get_scorer",
    "known_data_sources",
    "default_compute_score",
    "compute_score_details",
]

# data_source -> "module:function", imported lazily so that `import hybridrl.rewards` stays light.
_BUILTIN_SCORERS: dict[str, str] = {
    "openai/gsm8k": "hybridrl.rewards.gsm8k:compute_score",
    "gsm8k": "hybridrl.rewards.gsm8k:compute_score",
    "arithmetic": "hybridrl.rewards.arithmetic:compute_score",
    # MATH-style \boxed{} answers, compared with math-verify (verl's names for these sets)
    "lighteval/MATH": "hybridrl.rewards.math:compute_score",
    "DigitalLearningGmbH/MATH-lighteval": "hybridrl.rewards.math:compute_score",
    "HuggingFaceH4/MATH-500": "hybridrl.rewards.math:compute_score",
    # open-domain QA, exact match on the last <answer> (Search-R1's names, and verl's searchR1_ ones)
    **{
        f"{prefix}{name}": "hybridrl.rewards.qa_em:compute_score_em"
        for name in ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
        for prefix in ("", "searchR1_")
    },
    # code run in the sandbox: verl's code sets score the fraction of test cases passed (as verl
    # does), HumanEval all or nothing; code_tasks is the generated CPU demo (partial credit)
    "code_tasks": "hybridrl.rewards.code:compute_score_continuous",
    **dict.fromkeys(
        ("humaneval", "openai_humaneval", "openai/openai_humaneval"), "hybridrl.rewards.code:compute_score"
    ),
}


class UnknownDataSourceError(RegistryError):
    """No scorer is registered for a data_source (a ValueError)."""


class ScorerRegistrationError(UserError, ValueError):
    """register_scorer was called without valid data_source names."""


# Registered scorers take precedence over the built-in table; a later registration of a
# data_source replaces the earlier one (documented, hence replace=True).
SCORERS = Registry(
    "data_source with a reward scorer",
    "data_source",
    error=UnknownDataSourceError,
    replace=True,
    builtins=_BUILTIN_SCORERS,
    hint="set custom_reward_function.path/name to your own compute_score file, or register one with "
    "@hybridrl.rewards.register_scorer",
)


# verl's code sets (its prime_code scorer, continuous): default_compute_score returns the score
# alone, a float, as verl does; the details (passed, total, reason) reach the reward manager's
# logs through compute_score_details. The capability belongs to the built-in entry: a scorer a
# user registers for one of these names is returned as it answers.
for _source in ("codecontests", "apps", "codeforces", "taco"):
    SCORERS.register_lazy(_source, "hybridrl.rewards.code:compute_score_continuous", score_only=True)


def register_scorer(*data_sources: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: use the decorated function to score rows of the given ``data_source`` values.

    A later registration of the same data_source replaces the earlier one (and the built-in).

    Raises:
        ScorerRegistrationError: no data_source was given, or one is not a non-empty string.
    """
    if not data_sources or not all(isinstance(s, str) and s for s in data_sources):
        raise ScorerRegistrationError(
            f"register_scorer{data_sources!r}: give one or more non-empty data_source strings, "
            "e.g. @register_scorer('my_dataset')"
        )

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        for source in data_sources:
            SCORERS.register(source, fn)
        return fn

    return decorator


def known_data_sources() -> list[str]:
    """Sorted list of every data_source that has a scorer (built-in or registered)."""
    return SCORERS.names()


def get_scorer(data_source: str) -> Callable[..., Any]:
    """Return the scoring function for ``data_source``, importing a built-in one on first use.

    Raises:
        UnknownDataSourceError: no scorer is known for ``data_source``.
    """
    return SCORERS.get(data_source)


def _accepts_extra_info(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: pass it and let them say
        return True
    return any(p.name == "extra_info" or p.kind is p.VAR_KEYWORD for p in params)


def compute_score_details(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    **kwargs: Any,
) -> float | dict:
    """Score one response with the scorer registered for its ``data_source``, keeping its details.

    The arguments are :func:`default_compute_score`'s. Returns the scorer's result as it answered:
    a dict with ``"score"`` and other per-sample values (e.g. ``passed``, ``total``, ``reason`` of
    the code scorers) as is, any other result as a ``float``. The reward manager calls this, so
    its logs keep the details where :func:`default_compute_score` gives verl's float.

    Raises:
        UnknownDataSourceError: no scorer is known for ``data_source``.
    """
    fn = get_scorer(data_source)
    if extra_info is not None and _accepts_extra_info(fn):
        kwargs["extra_info"] = extra_info
    result = fn(solution_str, ground_truth, **kwargs)
    if isinstance(result, dict):
        return result
    return float(result)


def default_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    **kwargs: Any,
) -> float | dict:
    """Score one response with the scorer registered for its ``data_source`` (verl's function).

    Args:
        data_source: the row's ``data_source`` column (e.g. ``"openai/gsm8k"``).
        solution_str: the decoded response text.
        ground_truth: ``reward_model["ground_truth"]`` of the row.
        extra_info: the row's ``extra_info`` dict; passed on only to scorers that accept it.
        **kwargs: passed on to the scorer (e.g. ``method="flexible"`` for GSM8K).

    Returns:
        A float, or a dict with a ``"score"`` key (as the scorer returned it; numbers are
        converted to ``float``). verl's code sets (``codecontests``, ``apps``, ``codeforces``,
        ``taco``: verl's ``prime_code``) give the score alone, a float, as verl does; their
        details are in :func:`compute_score_details`.

    Raises:
        UnknownDataSourceError: no scorer is known for ``data_source``.
    """
    result = compute_score_details(data_source, solution_str, ground_truth, extra_info, **kwargs)
    if isinstance(result, dict) and SCORERS.capabilities(data_source).get("score_only"):
        return float(result["score"])
    return result
