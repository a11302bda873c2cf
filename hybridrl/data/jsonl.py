"""JSON-lines files: one JSON value per line, blank lines skipped, a bad line named by file and number."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from typing import Any

from hybridrl.data.errors import DataError


def iter_jsonl(path: str, error: type[Exception] = DataError) -> Iterator[tuple[int, Any]]:
    """``(line number, value)`` of each non-blank line of a ``.jsonl`` or ``.jsonl.gz`` file.

    Raises:
        error: a line is not valid JSON (``"<path>:<line>: not valid JSON (...)"``).
        OSError: the file cannot be opened (callers that know what is missing say so first).
    """
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise error(f"{path}:{lineno}: not valid JSON ({exc.msg}); fix or remove the line") from None
            yield lineno, value
