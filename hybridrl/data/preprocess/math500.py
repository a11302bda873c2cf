"""MATH-500 -> verl RL parquet (test.parquet), with the prompt of verl's MATH examples.

    python examples/data_preprocess/math500.py --input_dir ../shared/data/math500 --local_dir ~/data/math500

Without ``--input_dir`` the hub dataset ``HuggingFaceH4/MATH-500`` is loaded with the
``datasets`` library, when that is installed and online. Rows are scored by
``hybridrl.rewards.math`` (registered for ``data_source="HuggingFaceH4/MATH-500"``).
"""

import argparse
import os
import sys

from hybridrl.data.errors import DataError
from hybridrl.data.jsonl import iter_jsonl
from hybridrl.data.preprocess import write_split

DATA_SOURCE = "HuggingFaceH4/MATH-500"
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
FIELDS = ("problem", "solution", "answer")
_HINT = "pass --input_dir with MATH-500 test.jsonl (e.g. ../shared/data/math500)"


def make_row(example: dict, index: int, split: str = "test") -> dict:
    """One verl RL parquet row for a MATH-500 example (``problem``, ``solution``, ``answer``,
    optional ``subject``, ``level``, ``unique_id``); the ground truth is ``answer``."""
    problem = example["problem"]
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": problem + " " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(example["answer"])},
        "extra_info": {
            "split": split,
            "index": index,
            "question": problem,
            "solution": example["solution"],
            "subject": example.get("subject"),
            "level": example.get("level"),
            "unique_id": example.get("unique_id"),
        },
    }


def read_jsonl(path: str) -> list[dict]:
    """The MATH-500 examples of one jsonl file.

    Raises:
        DataError: the file is missing, a line is not JSON, or lacks problem/solution/answer.
    """
    if not os.path.isfile(path):
        raise DataError(f"--input_dir: {path} not found; {_HINT}")
    examples = []
    for lineno, ex in iter_jsonl(path):
        if not isinstance(ex, dict) or any(key not in ex for key in FIELDS):
            raise DataError(f"{path}:{lineno}: expected an object with keys {', '.join(FIELDS)}")
        examples.append(ex)
    return examples


def load_hub_split() -> list[dict]:
    """``HuggingFaceH4/MATH-500`` (test) from the hub via the ``datasets`` library."""
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"the `datasets` library is not installed, so {DATA_SOURCE} cannot be loaded from the hub; {_HINT}"
        ) from None
    try:
        return datasets.load_dataset(DATA_SOURCE, split="test").to_list()
    except Exception as exc:  # noqa: BLE001 - offline, hub errors: all mean "use local files"
        raise DataError(f"could not load {DATA_SOURCE} from the hub ({type(exc).__name__}); {_HINT}") from None


def convert(input_dir: str | None, local_dir: str, size: int | None = None) -> str:
    """Write ``test.parquet`` into ``local_dir`` and return its path.

    Args:
        input_dir: folder with ``test.jsonl``; ``None``: the hub dataset.
        local_dir: output folder (created; ``~`` expanded).
        size: keep the first ``size`` rows (``None``: all 500).

    Raises:
        DataError: unreadable input (see :func:`read_jsonl` / :func:`load_hub_split`).
    """
    if input_dir is None:
        examples = load_hub_split()
    else:
        examples = read_jsonl(os.path.join(os.path.expanduser(input_dir), "test.jsonl"))
    if size is not None:
        examples = examples[:size]
    return write_split([make_row(ex, i) for i, ex in enumerate(examples)], local_dir, "test")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Write MATH-500 as verl RL parquet (test.parquet).")
    parser.add_argument("--input_dir", default=None, help="folder with MATH-500 test.jsonl")
    parser.add_argument("--local_dir", default="~/data/math500", help="output folder")
    parser.add_argument("--size", type=int, default=None, help="keep the first N rows")
    return parser


def main(argv: list[str] | None = None) -> None:
    """CLI entry; a ``DataError`` exits with its one-line message and status 1."""
    args = build_parser().parse_args(argv)
    try:
        path = convert(args.input_dir, args.local_dir, args.size)
    except DataError as exc:
        sys.exit(f"math500 preprocess: error: {exc}")
    print(f"wrote test: {path}")


if __name__ == "__main__":
    main()
