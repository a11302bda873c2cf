"""Evaluation job: ``python -m hybridrl.trainer.main_eval key=value ...`` (``hybridrl eval``).

Scores every response of a parquet written by ``hybridrl generate`` (a list of N responses per
row) with the scorer of its ``data_source`` (or ``custom_reward_function``), then prints and
writes as JSON, per data source: mean@N, pass@k, maj@N and best@N with bootstrap confidence
intervals (see :mod:`hybridrl.trainer.run.eval_metrics`). Keys: ``hybridrl/config/evaluation.yaml``.
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from typing import Any, Callable

from omegaconf import OmegaConf

from hybridrl.data.errors import DataError
from hybridrl.rewards import default_compute_score, get_scorer
from hybridrl.rewards.custom import load_custom_reward_fn
from hybridrl.rewards.manager import RewardFunctionError
from hybridrl.trainer.jobs.eval_config import eval_config
from hybridrl.trainer.run.eval_metrics import compute_eval_metrics

_GENERATE_HINT = "write one with `hybridrl generate` (or set data.response_key to the column that holds them)"


def read_eval_rows(data_files, response_key: str, data_source_key: str, reward_model_key: str) -> list[dict]:
    """The rows of the parquet file(s), each as ``{"file", "row", "data_source", "ground_truth",
    "extra_info", "responses": list[str]}``.

    Raises:
        DataError: a file is missing or unreadable, a column is missing, a response cell is not
            a non-empty list of strings, or a ``reward_model`` cell has no ``ground_truth``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = [data_files] if isinstance(data_files, str) else list(data_files)
    if not files:
        raise DataError("data.path is empty; set it to the parquet file written by `hybridrl generate`")
    rows = []
    for name in files:
        path = os.path.expanduser(name)
        try:
            table = pq.read_table(path)
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"data.path: cannot read {path} as parquet ({exc}); {_GENERATE_HINT}") from None
        for key, column in (
            ("response_key", response_key),
            ("data_source_key", data_source_key),
            ("reward_model_key", reward_model_key),
        ):
            if column not in table.column_names:
                hint = _GENERATE_HINT if key == "response_key" else f"set data.{key} to the right column"
                raise DataError(
                    f"data.{key}: {path} has no column '{column}' (its columns: "
                    f"{', '.join(table.column_names)}); {hint}"
                )
        for i, row in enumerate(table.to_pylist()):
            responses = row[response_key]
            if isinstance(responses, str):
                responses = [responses]
            if not isinstance(responses, list) or not responses or not all(isinstance(r, str) for r in responses):
                raise DataError(
                    f"data.response_key: row {i} of {path}: '{response_key}' holds {str(responses)[:60]!r}, "
                    "expected a non-empty list of response strings"
                )
            reward_model = row[reward_model_key]
            if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
                raise DataError(
                    f"data.reward_model_key: row {i} of {path}: '{reward_model_key}' holds "
                    f"{str(reward_model)[:60]!r}, expected a dict with a 'ground_truth' key"
                )
            rows.append(
                {
                    "file": path,
                    "row": i,
                    "data_source": str(row[data_source_key]),
                    "ground_truth": reward_model["ground_truth"],
                    "extra_info": row.get("extra_info"),
                    "responses": responses,
                }
            )
    return rows


def load_scorer(config, data_sources: list[str]) -> Callable[..., Any]:
    """``custom_reward_function`` when its ``path`` is set, else :func:`default_compute_score`
    after checking that every data source has a built-in or registered scorer. ``config`` is the
    typed ``evaluation`` config (:mod:`.eval_config`).

    Raises:
        RewardConfigError: a bad custom function.
        UnknownDataSourceError: a data source has no scorer (the message lists the known ones).
    """
    custom = config.custom_reward_function
    if custom.path:
        kwargs = custom.reward_kwargs
        kwargs = OmegaConf.to_container(kwargs) if OmegaConf.is_config(kwargs) else dict(kwargs)
        return load_custom_reward_fn(custom.path, custom.name, kwargs)
    for source in data_sources:
        get_scorer(source)
    return default_compute_score


def score_response(compute_score, row: dict, j: int) -> tuple[float, Any, Any, bool]:
    """``(score, acc or None, pred, has_pred)`` of response ``j`` of ``row``.

    Raises:
        RewardFunctionError: the scorer raised or returned something that is not a score.
    """
    where = f"row {row['row']} of {row['file']}, response {j} (data_source={row['data_source']!r})"
    try:
        result = compute_score(
            data_source=row["data_source"],
            solution_str=row["responses"][j],
            ground_truth=row["ground_truth"],
            extra_info=row["extra_info"],
        )
        if isinstance(result, dict):
            return float(result["score"]), result.get("acc"), result.get("pred"), "pred" in result
        return float(result), None, None, False
    except Exception as exc:
        raise RewardFunctionError(
            f"reward function failed on {where}: {type(exc).__name__}: "
            f"{' '.join(str(exc).split())}; it must return a float or a dict with "
            "'score'; fix the function"
        ) from exc


def summarize(rows: list[dict], compute_score, metrics_cfg) -> tuple[dict, list[str]]:
    """Score all rows; per data source, the metrics of :func:`compute_eval_metrics` (``metrics_cfg``:
    the typed ``metrics`` section).

    Rows of one data source with more responses than the fewest are cut to that number (a note
    says so), so that N means the same for every prompt.

    Returns:
        ``({data_source: {"num_prompts", "num_responses", "metrics"}}, notes)``.
    """
    import numpy as np

    by_source: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_source[row["data_source"]].append(row)
    threshold = metrics_cfg.pass_threshold
    report, notes = {}, []
    for source in sorted(by_source):
        group = by_source[source]
        n = min(len(r["responses"]) for r in group)
        if any(len(r["responses"]) != n for r in group):
            notes.append(
                f"{source}: rows have {n} to {max(len(r['responses']) for r in group)} responses; "
                f"only the first {n} of each are scored"
            )
        results = [[score_response(compute_score, r, j) for j in range(n)] for r in group]
        scores = np.array([[res[0] for res in rr] for rr in results])
        correct = np.array(
            [[bool(res[1]) if res[1] is not None else res[0] >= threshold for res in rr] for rr in results]
        )
        too_large = [k for k in (metrics_cfg.pass_k or []) if k > n]  # null: powers of two up to n
        if too_large:
            notes.append(f"{source}: pass@k left out for k={too_large}: only {n} responses per prompt")
        preds = None
        if all(res[3] for rr in results for res in rr):
            preds = [[None if res[2] is None else str(res[2]) for res in rr] for rr in results]
        elif n > 1:
            notes.append(
                f"{source}: maj@{n} left out: the scorer returns no 'pred' (the extracted answer); "
                "return a dict with 'score' and 'pred' to get it"
            )
        metrics = compute_eval_metrics(
            scores,
            correct,
            preds,
            k_list=metrics_cfg.pass_k,
            n_resamples=metrics_cfg.bootstrap_samples,
            confidence=metrics_cfg.confidence,
            seed=metrics_cfg.seed,
        )
        report[source] = {"num_prompts": len(group), "num_responses": n, "metrics": metrics}
    return report, notes


def format_report(report: dict, confidence: float) -> str:
    """The report as a table: one line per data source and metric."""
    ci = f"{round(confidence * 100)}% CI"
    width = max([len("data_source")] + [len(s) for s in report])
    lines = [f"{'data_source':<{width}}  {'prompts':>7}  {'metric':<9} {'value':>7}  {ci}"]
    for source, entry in report.items():
        for name, m in entry["metrics"].items():
            lines.append(
                f"{source:<{width}}  {entry['num_prompts']:>7}  {name:<9} {m['value']:>7.4f}  "
                f"[{m['ci_low']:.4f}, {m['ci_high']:.4f}]"
            )
    return "\n".join(lines)


def default_output_path(data_files) -> str:
    """``<first data file without .parquet>.eval.json``."""
    first = data_files if isinstance(data_files, str) else list(data_files)[0]
    first = os.path.expanduser(first)
    return (first[: -len(".parquet")] if first.endswith(".parquet") else first) + ".eval.json"


def run_eval(config) -> dict:
    """Runs the evaluation with a resolved ``evaluation`` config; prints the table, writes the
    JSON report and returns it.

    Raises:
        ConfigError (a bad key or value, see :class:`~hybridrl.trainer.jobs.eval_config.EvalConfig`),
        DataError, RewardConfigError, UnknownDataSourceError, RewardFunctionError.
    """
    config = OmegaConf.structured(eval_config(config))
    data, metrics_cfg = config.data, config.metrics
    rows = read_eval_rows(data.path, data.response_key, data.data_source_key, data.reward_model_key)
    compute_score = load_scorer(config, sorted({r["data_source"] for r in rows}))
    per_source, notes = summarize(rows, compute_score, metrics_cfg)
    files = [data.path] if isinstance(data.path, str) else list(data.path)
    report = {
        "data_path": [os.path.abspath(os.path.expanduser(f)) for f in files],
        "custom_reward_function": config.custom_reward_function.path,
        "bootstrap_samples": metrics_cfg.bootstrap_samples,
        "confidence": metrics_cfg.confidence,
        "seed": metrics_cfg.seed,
        "data_sources": per_source,
        "notes": notes,
    }
    for note in notes:
        print(f"hybridrl eval: note: {note}", flush=True)
    print(format_report(per_source, report["confidence"]), flush=True)
    path = os.path.expanduser(config.output_path or default_output_path(data.path))  # null: next to the data
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    os.replace(tmp, path)
    print(f"hybridrl eval: wrote {path}", flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    """``hybridrl eval key=value ...`` (see :func:`hybridrl.cli.run_cli`)."""
    from hybridrl.cli import run_cli  # the entry point hands over to the command line (see .importlinter)

    return run_cli(run_eval, "evaluation", argv)


if __name__ == "__main__":
    sys.exit(main())
