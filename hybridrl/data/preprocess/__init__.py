"""Scripts that write a data set as verl RL parquet: ``hybridrl preprocess <task> ...``.

Each task is a module with ``main(argv)`` (here, or next to the agent whose prompts it writes);
:data:`TASKS` maps the task name to it.
"""

from __future__ import annotations

import importlib
import os
import sys

TASKS: dict[str, str] = {
    "gsm8k": "hybridrl.data.preprocess.gsm8k",
    "arithmetic": "hybridrl.data.preprocess.arithmetic",
    "hh_rlhf": "hybridrl.data.preprocess.hh_rlhf",
    "math500": "hybridrl.data.preprocess.math500",
    "search_r1": "hybridrl.agents.search_r1_data",  # the search agent's prompts and corpus
    "gsm8k_tool": "hybridrl.data.preprocess.gsm8k_tool",
    "humaneval": "hybridrl.data.preprocess.humaneval",
    "code_tasks": "hybridrl.data.preprocess.code_tasks",
}


def write_split(rows: list[dict], local_dir: str, split: str) -> str:
    """Write ``rows`` as ``<local_dir>/<split>.parquet`` (the folder created, ``~`` expanded) and
    return the path. Atomic: a reader never sees a half-written file."""
    import pandas as pd

    local_dir = os.path.expanduser(local_dir)
    os.makedirs(local_dir, exist_ok=True)
    path = os.path.join(local_dir, f"{split}.parquet")
    tmp = f"{path}.tmp-{os.getpid()}"
    pd.DataFrame(rows).to_parquet(tmp, index=False)
    os.replace(tmp, path)
    return path


def write_splits(rows_by_split: dict[str, list[dict]], local_dir: str) -> tuple[str, ...]:
    """:func:`write_split` for each split in order, saying what was written; the paths."""
    paths = []
    for split, rows in rows_by_split.items():
        paths.append(write_split(rows, local_dir, split))
        print(f"wrote {len(rows)} rows to {paths[-1]}")
    return tuple(paths)


def main(argv: list[str]) -> int:
    """``hybridrl preprocess <task> [args]``: runs the task's own ``main(args)``."""
    if not argv or argv[0] not in TASKS:
        print(
            f"hybridrl: error: preprocess needs a task, one of {sorted(TASKS)}; e.g. hybridrl preprocess gsm8k --help",
            file=sys.stderr,
        )
        return 2
    importlib.import_module(TASKS[argv[0]]).main(argv[1:])
    return 0
