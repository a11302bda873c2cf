"""`hybridrl view <dump folder>`: browse the samples of `trainer.rollout_data_dir` or
`trainer.validation_data_dir` by step and score.

Opens a terminal UI (textual): left/right or p/n move between steps, s cycles the sort
(file order, best score first, worst first), / filters (`>0.5`, `<=0`, `==1` on the score, any
other text searches input, output, ground truth and data source), Enter opens a sample, q quits.
`--print` prints a plain table instead (no terminal UI, for logs and pipes).
"""

from __future__ import annotations

import argparse
import sys

from hybridrl.inspection.samples import (  # SampleDump, ViewerError, parse_filter, select: the API
    SORT_NAMES,
    SORTS,
    SampleDump,
    ViewerError,
    format_score,
    mean_score,
    one_line,
    parse_filter,
    select,
)
from hybridrl.trainer.ppo.rollout_dump import SampleDumpError


def print_tables(
    dump: SampleDump, step: int | None, sort: str, filter_text: str, limit: int, max_chars: int, console=None
) -> None:
    """Print a per-step summary and one step's samples as rich tables (no terminal UI)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    console.print(f"{dump.folder}: {len(dump.steps)} step(s)", soft_wrap=True, markup=False)
    summary = Table()
    for name in ("step", "samples", "mean score"):
        summary.add_column(name, justify="right")
    for s in dump.steps:
        records = dump.samples(s)
        mean = mean_score(records)
        summary.add_row(str(s), str(len(records)), "-" if mean is None else f"{mean:.4g}")
    console.print(summary)
    step = dump.steps[-1] if step is None else step
    rows = select(dump.samples(step), sort, filter_text)
    shown = rows[:limit] if limit > 0 else rows
    console.print(
        f"step {step}: {len(shown)} of {len(rows)} sample(s) ({SORT_NAMES[sort]}"
        + (f", filter {filter_text!r}" if filter_text else "")
        + ")",
        soft_wrap=True,
        markup=False,
    )
    table = Table(show_lines=True)
    for name, justify in (
        ("#", "right"),
        ("score", "right"),
        ("ground truth", "left"),
        ("input (end)", "left"),
        ("output", "left"),
    ):
        table.add_column(name, justify=justify, overflow="fold")
    for index, record in shown:
        table.add_row(
            str(index),
            format_score(record),
            one_line(record.get("ground_truth"), 40),
            one_line(record.get("input"), max_chars, keep_end=True),
            one_line(record.get("output"), max_chars),
        )
    console.print(table)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybridrl view", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="a trainer.rollout_data_dir or trainer.validation_data_dir")
    parser.add_argument(
        "--print", dest="print_only", action="store_true", help="print tables instead of opening the terminal UI"
    )
    parser.add_argument("--step", type=int, help="step to show (default: the last one)")
    parser.add_argument("--sort", choices=SORTS, default="file", help="file order (default), best or worst score first")
    parser.add_argument("--filter", default="", help="'>0.5', '<=0', '==1' on the score, or text to search")
    parser.add_argument("--limit", type=int, default=20, help="--print: samples to print, 0: all (default 20)")
    parser.add_argument("--max-chars", type=int, default=300, help="--print: characters per input/output cell")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        dump = SampleDump(args.folder)
        if args.step is not None and args.step not in dump.paths:
            raise ViewerError(f"--step {args.step}: {args.folder} has steps {dump.steps}")
        parse_filter(args.filter)
        if args.print_only:
            try:
                print_tables(dump, args.step, args.sort, args.filter, args.limit, args.max_chars)
            except ImportError as err:
                raise ViewerError(f"--print needs rich ({err}); run `pip install rich`") from err
            return 0
        try:
            from hybridrl.inspection.viewer_app import SampleViewer
        except ImportError as err:
            raise ViewerError(
                f"the terminal UI needs textual ({err}); run `pip install 'hybridrl[view]'` "
                "or add --print for a plain table"
            ) from err
        SampleViewer(dump, step=args.step, sort=args.sort, filter_text=args.filter).run()
    except (ViewerError, SampleDumpError, OSError) as err:
        print(f"hybridrl view: error: {err}", file=sys.stderr)
        return 2
    return 0
