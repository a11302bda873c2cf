"""The sample dumps of ``trainer.rollout_data_dir`` as data: steps, scores, sorting and filters,
shared by ``hybridrl view --print`` (:mod:`.viewer`) and its terminal UI (:mod:`.viewer_app`)."""

from __future__ import annotations

import operator
import os
import re
from typing import Callable

from hybridrl.errors import UserError
from hybridrl.trainer.ppo.rollout_dump import list_steps, read_step

SORTS = ("file", "best", "worst")  # file order, highest score first, lowest score first
SORT_NAMES = {"file": "file order", "best": "score, best first", "worst": "score, worst first"}
_COMPARISON = re.compile(r"^\s*(<=|>=|==|!=|<|>|=)\s*(.*?)\s*$")
_OPS = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "=": operator.eq,
    "!=": operator.ne,
}


class ViewerError(UserError, ValueError):
    """A folder holds no sample dumps, or a filter does not parse."""


def _has_dumps(path: str) -> bool:
    try:
        return os.path.isdir(path) and bool(list_steps(path))
    except OSError:  # an unreadable folder
        return False


class SampleDump:
    """The step files of one dump folder, each read on first use.

    Raises:
        ViewerError: the folder has no `step_<N>.jsonl` files (names sub-folders that have).
        FileNotFoundError: the folder does not exist.
    """

    def __init__(self, folder: str):
        self.folder = folder
        self.paths = list_steps(folder)
        if not self.paths:
            nested = sorted(p for p in (os.path.join(folder, d) for d in os.listdir(folder)) if _has_dumps(p))
            hint = (
                f"; sample folders under it: {', '.join(nested)}"
                if nested
                else ("; set trainer.rollout_data_dir or trainer.validation_data_dir to write them")
            )
            raise ViewerError(f"{folder}: no step_<N>.jsonl sample dumps{hint}")
        self.steps = list(self.paths)
        self._cache: dict[int, list[dict]] = {}

    def samples(self, step: int) -> list[dict]:
        if step not in self._cache:
            self._cache[step] = read_step(self.paths[step])
        return self._cache[step]


def score_of(record: dict) -> float | None:
    value = record.get("score")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def format_score(record: dict) -> str:
    score = score_of(record)
    return str(record.get("score")) if score is None else f"{score:.4g}"


def parse_filter(text: str) -> Callable[[dict], bool]:
    """A predicate on samples: `<op><number>` compares the score (op one of < <= > >= == = !=),
    any other text is a case-insensitive search in input, output, ground_truth and data_source;
    empty text keeps everything.

    Raises:
        ViewerError: a comparison whose right side is not a number.
    """
    text = (text or "").strip()
    if not text:
        return lambda record: True
    match = _COMPARISON.match(text)
    if match:
        op, number = match.groups()
        try:
            bound = float(number)
        except ValueError:
            raise ViewerError(f"filter {text!r}: a score filter is <op><number>, e.g. >0.5 or ==1") from None
        return lambda record: score_of(record) is not None and _OPS[op](score_of(record), bound)
    needle = text.lower()
    fields = ("input", "output", "ground_truth", "data_source")
    return lambda record: any(needle in str(record.get(f, "")).lower() for f in fields)


def select(records: list[dict], sort: str = "file", filter_text: str = "") -> list[tuple[int, dict]]:
    """(index in the file, sample) pairs kept by the filter, in the chosen order (see SORTS).

    Samples without a score sort last either way.

    Raises:
        ViewerError: an unknown sort or a bad filter.
    """
    if sort not in SORTS:
        raise ViewerError(f"sort {sort!r}: choose one of {', '.join(SORTS)}")
    keep = parse_filter(filter_text)
    rows = [(i, r) for i, r in enumerate(records) if keep(r)]
    if sort != "file":
        sign = -1.0 if sort == "best" else 1.0
        rows.sort(key=lambda row: (score_of(row[1]) is None, sign * (score_of(row[1]) or 0.0), row[0]))
    return rows


def one_line(text, limit: int, keep_end: bool = False) -> str:
    """`text` on one line (newlines as ⏎), cut to `limit` characters from the start or the end."""
    text = str("" if text is None else text).strip().replace("\n", " ⏎ ")
    if len(text) <= limit:
        return text
    return "…" + text[-(limit - 1) :] if keep_end else text[: limit - 1] + "…"


def mean_score(records: list[dict]) -> float | None:
    scores = [s for s in map(score_of, records) if s is not None]
    return sum(scores) / len(scores) if scores else None
