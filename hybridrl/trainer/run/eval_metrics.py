"""Offline evaluation metrics over N scored responses per prompt (pure numpy).

Every metric is a mean over prompts of a per-prompt value, so one percentile bootstrap over
prompts gives a confidence interval for each of them:

* ``mean@N``: the mean score of the N responses;
* ``best@N``: the best score of the N responses (an oracle picks);
* ``maj@N``: the score of the majority answer (self-consistency, Wang et al., "Self-Consistency
  Improves Chain of Thought Reasoning in Language Models", arXiv:2203.11171);
* ``pass@k``: the probability that at least one of k responses drawn without replacement from
  the N is correct, with the unbiased estimator of Chen et al., "Evaluating Large Language
  Models Trained on Code", arXiv:2107.03374.
"""

from __future__ import annotations

from collections import Counter
from typing import Hashable, Sequence

import numpy as np

__all__ = ["pass_at_k", "majority_vote", "default_k_list", "bootstrap_ci", "compute_eval_metrics"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one prompt: ``1 - C(n - c, k) / C(n, k)``.

    Computed as ``1 - prod_{i = n - c + 1}^{n} (1 - k / i)``, which never forms the (huge)
    binomial coefficients (Chen et al., arXiv:2107.03374, Fig. 3).

    Args:
        n: responses sampled for the prompt.
        c: how many of them are correct, ``0 <= c <= n``.
        k: responses drawn, ``1 <= k <= n``.

    Returns:
        The probability, in [0, 1], that a uniformly drawn k-subset holds a correct response.

    Raises:
        ValueError: ``k`` or ``c`` is out of range.
    """
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n; got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n correct responses; got c={c}, n={n}")
    if n - c < k:  # every k-subset contains a correct response
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def majority_vote(preds: Sequence[Hashable | None], scores: Sequence[float]) -> float:
    """The score of the most frequent answer among one prompt's responses (maj@N).

    Responses whose answer is ``None`` (none could be extracted) do not vote. A tie goes to the
    answer seen first; the result is the score of the first response giving the winning answer.
    With no votes at all it is the score of the first response.

    Args:
        preds: the extracted answer of each response (hashable, e.g. a string), length N.
        scores: the score of each response, length N.

    Raises:
        ValueError: ``preds`` and ``scores`` differ in length or are empty.
    """
    if len(preds) != len(scores) or not len(preds):
        raise ValueError(f"majority_vote needs equal, non-empty preds and scores; got {len(preds)} and {len(scores)}")
    votes = Counter(p for p in preds if p is not None)
    if not votes:
        return float(scores[0])
    winner = votes.most_common(1)[0][0]  # Counter keeps insertion order among equal counts
    return float(scores[list(preds).index(winner)])


def default_k_list(n: int) -> list[int]:
    """``[1, 2, 4, ..., n]``: the powers of two below ``n``, then ``n`` itself."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n]


def bootstrap_ci(values: np.ndarray, n_resamples: int = 1000, confidence: float = 0.95, seed: int = 0) -> np.ndarray:
    """Percentile-bootstrap confidence intervals of the means of per-prompt values.

    Prompts are resampled with replacement (the same resamples for every row of ``values``, so
    the intervals of different metrics are computed from the same draws).

    Args:
        values: ``(num_metrics, num_prompts)`` or ``(num_prompts,)`` per-prompt values.
        n_resamples: bootstrap resamples (B).
        confidence: the interval's coverage, in (0, 1).
        seed: seed of the numpy generator.

    Returns:
        ``(num_metrics, 2)`` (or ``(2,)`` for 1-D input): the low and high ends.

    Raises:
        ValueError: no prompts, ``n_resamples < 1`` or ``confidence`` not in (0, 1).
    """
    values = np.asarray(values, dtype=np.float64)
    flat = values.ndim == 1
    values = np.atleast_2d(values)
    num_prompts = values.shape[1]
    if num_prompts == 0 or n_resamples < 1 or not 0.0 < confidence < 1.0:
        raise ValueError(
            f"bootstrap_ci: got {num_prompts} prompts, n_resamples={n_resamples}, "
            f"confidence={confidence}; need >= 1 prompt, >= 1 resample, 0 < confidence < 1"
        )
    rng = np.random.default_rng(seed)
    means = np.empty((values.shape[0], n_resamples))
    chunk = max(1, 2**22 // (num_prompts * values.shape[0]))  # bounds the gathered (M, b, P) block
    for start in range(0, n_resamples, chunk):
        size = min(chunk, n_resamples - start)
        idx = rng.integers(0, num_prompts, size=(size, num_prompts))
        means[:, start : start + size] = values[:, idx].mean(axis=-1)
    alpha = (1.0 - confidence) / 2.0
    ci = np.quantile(means, [alpha, 1.0 - alpha], axis=1).T
    return ci[0] if flat else ci


def compute_eval_metrics(
    scores: np.ndarray,
    correct: np.ndarray,
    preds: list[list[Hashable | None]] | None = None,
    k_list: Sequence[int] | None = None,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """mean@N, pass@k, maj@N and best@N, each with a bootstrap confidence interval.

    Args:
        scores: ``(num_prompts, N)`` float scores of N responses per prompt.
        correct: ``(num_prompts, N)`` bool, whether each response counts as correct (pass@k).
        preds: ``num_prompts`` lists of N extracted answers for maj@N; ``None``: no maj@N.
        k_list: the k of pass@k; ``None``: :func:`default_k_list` (N); k > N are left out.
        n_resamples, confidence, seed: see :func:`bootstrap_ci`.

    Returns:
        ``{"mean@N": {"value", "ci_low", "ci_high"}, "pass@1": ..., "maj@N": ..., "best@N": ...}``
        in that order; values are means over prompts.

    Raises:
        ValueError: shapes differ, there are no prompts or no responses, or a k is < 1.
    """
    scores = np.asarray(scores, dtype=np.float64)
    correct = np.asarray(correct, dtype=bool)
    if scores.ndim != 2 or scores.shape != correct.shape or 0 in scores.shape:
        raise ValueError(f"scores {scores.shape} and correct {correct.shape} must be the same (prompts, N), non-empty")
    num_prompts, n = scores.shape
    ks = default_k_list(n) if k_list is None else sorted({int(k) for k in k_list})
    if ks and ks[0] < 1:
        raise ValueError(f"pass@k: k must be >= 1; got {ks}")
    per_prompt: dict[str, np.ndarray] = {f"mean@{n}": scores.mean(axis=1)}
    num_correct = correct.sum(axis=1)
    for k in (k for k in ks if k <= n):
        per_prompt[f"pass@{k}"] = np.array([pass_at_k(n, int(c), k) for c in num_correct])
    if preds is not None:
        if len(preds) != num_prompts:
            raise ValueError(f"preds has {len(preds)} prompts, scores {num_prompts}")
        per_prompt[f"maj@{n}"] = np.array([majority_vote(p, s) for p, s in zip(preds, scores)])
    per_prompt[f"best@{n}"] = scores.max(axis=1)
    names = list(per_prompt)
    stacked = np.stack([per_prompt[name] for name in names])
    ci = bootstrap_ci(stacked, n_resamples=n_resamples, confidence=confidence, seed=seed)
    return {
        name: {"value": float(stacked[i].mean()), "ci_low": float(ci[i, 0]), "ci_high": float(ci[i, 1])}
        for i, name in enumerate(names)
    }
