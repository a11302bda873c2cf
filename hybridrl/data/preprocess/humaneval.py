"""HumanEval -> verl RL parquet (test.parquet), scored by running its tests in the sandbox.

    hybridrl preprocess humaneval --input ../shared/data/humaneval/HumanEval.jsonl.gz --local_dir ~/data/humaneval

Each of the 164 problems (``task_id``, ``prompt``, ``entry_point``, ``canonical_solution``,
``test``) becomes one row::

    data_source  "humaneval"
    prompt       [{"role": "user", "content": "<instruction>\\n\\n```python\\n<HumanEval prompt>```"}]
    ability      "code"
    reward_model {"style": "rule", "ground_truth": '{"test_code": ..., "entry_point": ..., "prefix": ...}'}
    extra_info   {"split": "test", "index", "task_id", "canonical_solution"}

The ground truth is a JSON string of the assert-style form of :mod:`hybridrl.rewards.code`:
``test_code`` defines ``check(candidate)``, ``prefix`` is the HumanEval prompt. verl ships no
HumanEval preprocess and no ``humaneval`` data source; the name is this project's, and
``openai_humaneval`` (the hub name) is registered to the same scorer.

Without ``--input`` the hub dataset ``openai/openai_humaneval`` is loaded with the
``datasets`` library, when that is installed and online.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from hybridrl.data.errors import DataError
from hybridrl.data.jsonl import iter_jsonl
from hybridrl.data.preprocess import write_split

DATA_SOURCE = "humaneval"
HUB_NAME = "openai/openai_humaneval"
INSTRUCTION = (
    "Complete the following Python function. Reply with the complete function, its "
    "signature included, in a ```python code block."
)
FIELDS = ("task_id", "prompt", "entry_point", "canonical_solution", "test")
_HINT = "pass --input with HumanEval.jsonl(.gz) (e.g. ../shared/data/humaneval/HumanEval.jsonl.gz)"


def make_ground_truth(problem: dict) -> str:
    """The assert-style ground truth of one problem, as a JSON string (see the module doc)."""
    return json.dumps(
        {"test_code": problem["test"], "entry_point": problem["entry_point"], "prefix": problem["prompt"]}
    )


def make_row(problem: dict, index: int, split: str = "test") -> dict:
    """One verl RL parquet row for a HumanEval problem (a dict with the keys of :data:`FIELDS`)."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{INSTRUCTION}\n\n```python\n{problem['prompt']}```"}],
        "ability": "code",
        "reward_model": {"style": "rule", "ground_truth": make_ground_truth(problem)},
        "extra_info": {
            "split": split,
            "index": index,
            "task_id": problem["task_id"],
            "canonical_solution": problem["canonical_solution"],
        },
    }


def read_problems(path: str) -> list[dict]:
    """The problems of a HumanEval ``.jsonl`` or ``.jsonl.gz`` file.

    Raises:
        DataError: the file is missing, a line is not JSON, or lacks one of :data:`FIELDS`.
    """
    if not os.path.isfile(path):
        raise DataError(f"--input: {path} not found; {_HINT}")
    problems = []
    try:
        for lineno, problem in iter_jsonl(path):
            if not isinstance(problem, dict) or any(not isinstance(problem.get(k), str) for k in FIELDS):
                raise DataError(f"{path}:{lineno}: expected an object with string keys {', '.join(FIELDS)}")
            problems.append(problem)
    except (OSError, EOFError) as exc:  # e.g. a file named .gz that is not gzip
        raise DataError(f"--input: cannot read {path} ({exc}); {_HINT}") from None
    return problems


def load_hub_split() -> list[dict]:
    """``openai/openai_humaneval`` (test) from the hub via the ``datasets`` library."""
    try:
        import datasets
    except ImportError:
        raise DataError(f"the `datasets` library is not installed, so {HUB_NAME} cannot be loaded; {_HINT}") from None
    try:
        return datasets.load_dataset(HUB_NAME, split="test").to_list()
    except Exception as exc:  # noqa: BLE001 - offline, hub errors: all mean "use the local file"
        raise DataError(f"could not load {HUB_NAME} from the hub ({type(exc).__name__}); {_HINT}") from None


def convert(input_path: str | None, local_dir: str, size: int | None = None) -> str:
    """Write ``test.parquet`` into ``local_dir`` and return its path.

    Args:
        input_path: HumanEval ``.jsonl(.gz)``; ``None``: the hub dataset.
        local_dir: output folder (created; ``~`` expanded).
        size: keep the first ``size`` problems (``None``: all 164).

    Raises:
        DataError: unreadable input (see :func:`read_problems` / :func:`load_hub_split`).
    """
    problems = load_hub_split() if input_path is None else read_problems(os.path.expanduser(input_path))
    if size is not None:
        problems = problems[:size]
    return write_split([make_row(p, i) for i, p in enumerate(problems)], local_dir, "test")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Write HumanEval as verl RL parquet (test.parquet).")
    parser.add_argument("--input", default=None, help="HumanEval.jsonl or HumanEval.jsonl.gz")
    parser.add_argument("--local_dir", default="~/data/humaneval", help="output folder")
    parser.add_argument("--size", type=int, default=None, help="keep the first N problems")
    return parser


def main(argv: list[str] | None = None) -> None:
    """CLI entry; a ``DataError`` exits with its one-line message and status 1."""
    args = build_parser().parse_args(argv)
    try:
        path = convert(args.input, args.local_dir, args.size)
    except DataError as exc:
        sys.exit(f"humaneval preprocess: error: {exc}")
    print(f"wrote test: {path}")


if __name__ == "__main__":
    main()
