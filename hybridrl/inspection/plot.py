"""`hybridrl plot <run dir or metrics.jsonl> [more runs] -o curves.png`: a run's training curves.

Reads the JSON lines of the `file` logger (`<trainer.default_local_dir>/metrics.jsonl`) and
draws one PNG with a panel each for reward, KL, entropy, response length and throughput over
steps; validation scores appear as markers in the reward panel. A panel whose metrics were
not logged (e.g. KL in a run without KL) says so instead of a curve. Several runs are drawn
over each other, one colour per run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field

from hybridrl.errors import UserError


class PlotError(UserError, ValueError):
    """A metrics file is missing, empty or not JSON lines."""


@dataclass(frozen=True)
class Panel:
    title: str
    ylabel: str
    keys: tuple[str, ...]  # metric names from hybridrl.trainer.ppo.metrics / the actor, drawn as lines
    band: tuple[str, str] | None = None  # (min, max) metrics shaded around the first line
    labels: dict[str, str] = field(default_factory=dict)


PANELS: tuple[Panel, ...] = (
    Panel(
        "reward",
        "score per response",
        ("critic/score/mean", "critic/rewards/mean"),
        labels={"critic/score/mean": "score", "critic/rewards/mean": "reward (score - KL penalty)"},
    ),
    Panel(
        "KL",
        "KL to the reference",
        ("actor/reward_kl_penalty", "actor/kl_loss"),
        labels={"actor/reward_kl_penalty": "KL in reward", "actor/kl_loss": "KL loss"},
    ),
    Panel("entropy", "nats per token", ("actor/entropy",)),
    Panel(
        "response length",
        "tokens",
        ("response_length/mean",),
        band=("response_length/min", "response_length/max"),
        labels={"response_length/mean": "mean"},
    ),
    Panel("throughput", "tokens / s / device", ("perf/throughput",)),
)
# Validation scores, drawn as markers in the reward panel: val-core/<data_source>/reward/mean@<n>.
_VAL_KEY = re.compile(r"^val-core/(.+)/reward/mean@\d+$")


def metrics_path(path: str) -> str:
    """`path` itself when it is a file, else `<path>/metrics.jsonl`.

    Raises:
        PlotError: neither exists.
    """
    if os.path.isfile(path):
        return path
    candidate = os.path.join(path, "metrics.jsonl")
    if os.path.isfile(candidate):
        return candidate
    if os.path.isdir(path):
        raise PlotError(
            f"{path}: no metrics.jsonl in this folder; pass the run's trainer.default_local_dir "
            "of a run with 'file' in trainer.logger, or the metrics.jsonl itself"
        )
    raise PlotError(f"{path}: no such file or folder; pass a run folder or its metrics.jsonl")


def load_metrics(path: str) -> list[dict]:
    """The step records of a run folder or metrics.jsonl; lines cut short by a crash are skipped.

    Raises:
        PlotError: the file is missing or holds no JSON object with a `step`.
    """
    path = metrics_path(path)
    records = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                records.append(record)
    if not records:
        raise PlotError(f"{path}: no metrics lines (JSON objects with a 'step'); is it the file logger's output?")
    return records


def series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric, by step; null/absent values are skipped, a repeated step
    keeps its last value (a resumed run)."""
    by_step = {}
    for record in records:
        value = record.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            by_step[record["step"]] = float(value)
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def validation_keys(records: list[dict]) -> list[str]:
    return sorted({k for r in records for k in r if _VAL_KEY.match(k)})


def panel_contents(runs: dict[str, list[dict]]) -> list[tuple[Panel, list[str]]]:
    """Each panel with the metric names that have data in at least one run."""
    out = []
    for panel in PANELS:
        keys = [k for k in panel.keys if any(series(r, k)[0] for r in runs.values())]
        if panel.title == "reward":
            keys += sorted({k for r in runs.values() for k in validation_keys(r)})
        out.append((panel, keys))
    return out


def _draw_panel(ax, panel: Panel, keys: list[str], runs: dict[str, list[dict]]) -> None:
    if not keys:
        ax.set_title(f"{panel.title} (not logged)")
        ax.text(
            0.5,
            0.5,
            "not in the metrics:\n" + "\n".join(panel.keys),
            ha="center",
            va="center",
            transform=ax.transAxes,
            color="gray",
        )
        ax.set_xticks([])
        ax.set_yticks([])
        return
    ax.set_title(panel.title)
    styles = ("-", "--", ":", "-.")
    for color, (run, records) in zip(_colors(), runs.items()):
        prefix = f"{run}: " if len(runs) > 1 else ""
        lines = [k for k in keys if not _VAL_KEY.match(k)]
        for style, key in zip(styles, lines):  # one style per metric, the same in every run
            steps, values = series(records, key)
            if steps:  # dots as well when there are few steps: a line through one point is invisible
                ax.plot(
                    steps,
                    values,
                    style,
                    color=color,
                    label=prefix + panel.labels.get(key, key),
                    marker="." if len(steps) <= 30 else None,
                )
        if panel.band and lines:
            lo, hi = series(records, panel.band[0]), series(records, panel.band[1])
            if lo[0] and lo[0] == hi[0]:
                ax.fill_between(lo[0], lo[1], hi[1], color=color, alpha=0.15, label=prefix + "min-max")
        for marker, key in zip("os^vD", [k for k in keys if _VAL_KEY.match(k)]):
            steps, values = series(records, key)
            if steps:
                ax.plot(steps, values, marker, color=color, label=f"{prefix}val {_VAL_KEY.match(key).group(1)}")
    ax.set_xlabel("step")
    ax.set_ylabel(panel.ylabel)
    ax.grid(alpha=0.3)
    if len(ax.get_legend_handles_labels()[0]) > 1 or len(panel.keys) > 1:  # say which KL it is
        ax.legend(fontsize="small")


def _colors():
    from matplotlib import rcParams

    while True:
        yield from rcParams["axes.prop_cycle"].by_key()["color"]


def plot_curves(runs: dict[str, list[dict]], output: str | None = None, title: str | None = None):
    """Draw the panels of `PANELS` for one or more runs; save a PNG when `output` is given.

    Args:
        runs: run label -> step records (see `load_metrics`).
        output: PNG path, written atomically (temporary file, then rename); None: not saved.
        title: figure title; default: the run labels.

    Returns:
        The matplotlib Figure (its axes titles are the panel titles, "(not logged)" appended
        for panels without data).
    """
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state

    fig = Figure(figsize=(12, 10), dpi=100, layout="constrained")
    axes = fig.subplots(3, 2).flatten()
    for ax, (panel, keys) in zip(axes, panel_contents(runs)):
        _draw_panel(ax, panel, keys, runs)
    for ax in axes[len(PANELS) :]:
        fig.delaxes(ax)
    fig.suptitle(title or ", ".join(runs))
    if output:
        folder = os.path.dirname(os.path.abspath(output))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".curves.", suffix=".png")
        os.close(fd)
        try:
            fig.savefig(tmp, format="png")
            os.replace(tmp, output)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    return fig


def _run_label(path: str) -> str:
    path = os.path.abspath(path)
    return os.path.basename(os.path.dirname(path) if os.path.isfile(path) else path)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybridrl plot", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "runs", nargs="+", metavar="RUN", help="run folder (trainer.default_local_dir) or metrics.jsonl"
    )
    parser.add_argument("-o", "--output", default="curves.png", help="PNG to write (default: curves.png)")
    parser.add_argument("--title", help="figure title (default: the run names)")
    parser.add_argument("--list", action="store_true", help="print the panels and the metrics found; draw nothing")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        runs: dict[str, list[dict]] = {}
        for path in args.runs:
            label = _run_label(path)
            while label in runs:  # two runs with the same folder name
                label += "'"
            runs[label] = load_metrics(path)
    except (PlotError, OSError) as err:
        print(f"hybridrl plot: error: {err}", file=sys.stderr)
        return 2
    if args.list:
        for panel, keys in panel_contents(runs):
            print(f"{panel.title}: {', '.join(keys) if keys else 'not logged'}")
        return 0
    try:
        plot_curves(runs, args.output, args.title)
    except ImportError as err:
        print(
            f"hybridrl plot: error: drawing needs matplotlib ({err}); run `pip install 'hybridrl[plot]'`",
            file=sys.stderr,
        )
        return 2
    steps = sorted({r["step"] for records in runs.values() for r in records})
    print(f"hybridrl plot: wrote {args.output} ({len(runs)} run(s), steps {steps[0]}..{steps[-1]})")
    return 0
