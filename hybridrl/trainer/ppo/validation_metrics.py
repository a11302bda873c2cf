"""Validation metrics over several responses per prompt, with verl's API and metric names.

:func:`process_validation_metrics` groups per-response values by data source and prompt and
reports ``mean@N``, ``std@N`` and, from bootstrap subsets of n responses, ``best@n``,
``worst@n`` and ``maj@n`` (majority vote) means and standard deviations. It is what verl's
trainer logs after validation; :mod:`hybridrl.trainer.run.eval_metrics` is hybridrl's offline
evaluation (pass@k and confidence intervals over prompts) and is not the same computation.

Pure numpy; the functions are re-exported by :mod:`hybridrl.trainer.ppo.metrics`.
"""

from __future__ import annotations

from collections import defaultdict
from functools import partial
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["ValidationMetricsError", "bootstrap_metric", "calc_maj_val", "process_validation_metrics"]

_N_BOOTSTRAP = 1000


class ValidationMetricsError(ValueError):
    """Inputs of a validation metric are empty, of different lengths or lack a key."""


def bootstrap_metric(
    data: Sequence[Any],
    subset_size: int,
    reduce_fns: Sequence[Callable[[np.ndarray], float]],
    n_bootstrap: int = 1000,
    seed: int = 42,
) -> list[tuple[float, float]]:
    """Mean and standard deviation of each ``reduce_fn`` over random subsets of ``data``.

    Draws ``n_bootstrap`` subsets of ``subset_size`` items with replacement (the same subsets
    for every function; numpy's legacy ``RandomState(seed)``, so the draws equal verl's, without
    touching the global numpy seed) and applies each function to each subset (an object array).

    Returns:
        ``[(mean, std), ...]``, one pair of floats per function, std the population std (ddof 0).

    Raises:
        ValidationMetricsError: ``data`` is empty, or ``subset_size`` / ``n_bootstrap`` < 1.
    """
    if len(data) == 0:
        raise ValidationMetricsError("bootstrap_metric: data is empty; give at least one value")
    if subset_size < 1 or n_bootstrap < 1:
        raise ValidationMetricsError(
            f"bootstrap_metric: subset_size={subset_size}, n_bootstrap={n_bootstrap}; both must be >= 1"
        )
    items = np.empty(len(data), dtype=object)
    items[:] = list(data)
    indices = np.random.RandomState(seed).choice(len(items), size=(n_bootstrap, subset_size), replace=True)
    results = []
    for reduce_fn in reduce_fns:
        values = np.array([reduce_fn(items[row]) for row in indices], dtype=np.float64)
        results.append((float(values.mean()), float(values.std())))
    return results


def calc_maj_val(data: Sequence[dict[str, Any]], vote_key: str, val_key: str) -> Any:
    """The ``val_key`` value of the first item whose ``vote_key`` answer is the most common.

    A tie goes to the answer seen first. Every answer votes, ``None`` included (unlike
    :func:`hybridrl.trainer.run.eval_metrics.majority_vote`, which skips ``None``).

    Raises:
        ValidationMetricsError: ``data`` is empty or an item lacks ``vote_key`` / ``val_key``.
    """
    if len(data) == 0:
        raise ValidationMetricsError("calc_maj_val: data is empty; give at least one item")
    first_val: dict[Any, Any] = {}
    counts: dict[Any, int] = {}
    for i, item in enumerate(data):
        if vote_key not in item or val_key not in item:
            raise ValidationMetricsError(
                f"calc_maj_val: item {i} has keys {sorted(item)}; each needs {vote_key!r} and {val_key!r}"
            )
        vote = item[vote_key]
        first_val.setdefault(vote, item[val_key])
        counts[vote] = counts.get(vote, 0) + 1
    winner = max(counts, key=counts.get)  # max keeps the first of equal counts
    return first_val[winner]


def _subset_sizes(n_resps: int) -> list[int]:
    """``[2, 4, 8, ..., n_resps]``: powers of two below ``n_resps``, then ``n_resps``; [] for 1."""
    if n_resps <= 1:
        return []
    sizes, n = [], 2
    while n < n_resps:
        sizes.append(n)
        n *= 2
    return sizes + [n_resps]


def _prompt_metrics(values: list, preds: list | None, seed: int) -> dict[str, float]:
    """mean@N, std@N and bootstrap best / worst / maj of one prompt's values of one variable."""
    n_resps = len(values)
    metric = {f"mean@{n_resps}": float(np.mean(values))}
    if n_resps == 1:
        return metric
    metric[f"std@{n_resps}"] = float(np.std(values))
    votes = None
    if preds is not None and len(preds) == len(values) and all(p is not None for p in preds):
        votes = [{"val": v, "pred": p} for v, p in zip(values, preds)]
    for n in _subset_sizes(n_resps):
        (best, best_std), (worst, worst_std) = bootstrap_metric(
            values, n, [np.max, np.min], n_bootstrap=_N_BOOTSTRAP, seed=seed
        )
        metric.update(
            {f"best@{n}/mean": best, f"best@{n}/std": best_std, f"worst@{n}/mean": worst, f"worst@{n}/std": worst_std}
        )
        if votes is not None:
            [(maj, maj_std)] = bootstrap_metric(
                votes, n, [partial(calc_maj_val, vote_key="pred", val_key="val")], n_bootstrap=_N_BOOTSTRAP, seed=seed
            )
            metric.update({f"maj@{n}/mean": maj, f"maj@{n}/std": maj_std})
    return metric


def _count_missing_sessions(grouped: dict, expected_acc_counts: dict) -> None:
    """Pads each prompt's ``acc`` with zeros up to its expected count (sources that report acc only)."""
    with_acc = {
        source
        for source, prompts in grouped.items()
        if any(v is not None for var2vals in prompts.values() for v in var2vals.get("acc", []))
    }
    for (source, uid), expected in expected_acc_counts.items():
        if source not in with_acc:
            continue
        var2vals = grouped[source][uid]
        observed = [v for v in var2vals.get("acc", []) if v is not None]
        var2vals["acc_success_only"] = observed
        var2vals["acc"] = observed + [0.0] * max(int(expected) - len(observed), 0)


def process_validation_metrics(
    data_sources: Sequence[str],
    sample_uids: Sequence[str],
    infos_dict: dict[str, Sequence[Any]],
    seed: int = 42,
    expected_acc_counts: dict[tuple[str, str], int] | None = None,
) -> dict[str, dict[str, dict[str, float]]]:
    """Per data source and variable, validation metrics averaged over prompts (verl 0.9's).

    Args:
        data_sources: data source of each response, length B.
        sample_uids: prompt id of each response (responses of one prompt share it), length B.
        infos_dict: variable name -> B values (e.g. ``score``, ``acc``); a ``pred`` variable
            (the extracted answers) adds majority-vote metrics. Variables whose first value
            for a prompt is a str (like ``pred``) get no metrics.
        seed: seed of every bootstrap draw.
        expected_acc_counts: ``{(data_source, uid): sessions}`` expected per prompt. For a source
            that reports ``acc``, sessions that never produced a value (a failed agent session)
            count as ``acc = 0``, and ``acc_success_only`` keeps the metric over those that did.
            ``None`` values are left out of every variable.

    Returns:
        ``{data_source: {variable: {metric: value}}}`` where, per prompt with N responses,
        ``mean@N``, ``std@N`` (N > 1) and for each subset size n in 2, 4, 8, ..., N:
        ``best@n/mean``, ``best@n/std``, ``worst@n/mean``, ``worst@n/std`` and, with ``pred``,
        ``maj@n/mean``, ``maj@n/std``; each value is the mean over the source's prompts that
        have that metric.

    Raises:
        ValidationMetricsError: ``sample_uids`` or an ``infos_dict`` list is not as long as
            ``data_sources``.
    """
    n = len(data_sources)
    lengths = {"sample_uids": len(sample_uids), **{f"infos_dict[{k!r}]": len(v) for k, v in infos_dict.items()}}
    wrong = {name: size for name, size in lengths.items() if size != n}
    if wrong:
        name, size = next(iter(wrong.items()))
        raise ValidationMetricsError(
            f"process_validation_metrics: {name} has {size} values but data_sources has {n}; "
            "give one value per response"
        )
    grouped: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for i, (source, uid) in enumerate(zip(data_sources, sample_uids)):
        for var_name, values in infos_dict.items():
            grouped[source][uid][var_name].append(values[i])

    if expected_acc_counts:
        _count_missing_sessions(grouped, expected_acc_counts)
    per_prompt: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for source, prompts in grouped.items():
        for var2vals in prompts.values():
            preds = var2vals.get("pred")
            for var_name, values in var2vals.items():
                values = [v for v in values if v is not None]
                if not values or isinstance(values[0], str):
                    continue
                for metric_name, value in _prompt_metrics(values, preds, seed).items():
                    per_prompt[source][var_name][metric_name].append(value)
    return {
        source: {
            var_name: {metric_name: float(np.mean(vals)) for metric_name, vals in metrics.items()}
            for var_name, metrics in variables.items()
        }
        for source, variables in per_prompt.items()
    }
