"""GSM8K -> verl RL parquet (train.parquet, test.parquet), row for row like verl's preprocess.

    python examples/data_preprocess/gsm8k.py --input_dir ../shared/data/gsm8k --local_dir ~/data/gsm8k

Without ``--input_dir`` the hub dataset ``openai/gsm8k`` ("main") is loaded with the
``datasets`` library, when that is installed and online.
"""

import argparse
import os
import re
import sys

from hybridrl.data.errors import DataError
from hybridrl.data.jsonl import iter_jsonl
from hybridrl.data.preprocess import write_split

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
_ANSWER_RE = re.compile(r"#### (\-?[0-9\.\,]+)")


def extract_solution(answer: str) -> str | None:
    """The number after ``#### `` in a GSM8K solution, commas removed ("1,200" -> "1200");
    None when there is none."""
    match = _ANSWER_RE.search(answer)
    return None if match is None else match.group(1).replace(",", "")


def make_row(question: str, answer: str, split: str, index: int) -> dict:
    """One verl RL parquet row for a GSM8K example.

    Raises:
        DataError: the answer has no ``#### <number>`` final line.
    """
    ground_truth = extract_solution(answer)
    if ground_truth is None:
        raise DataError(f"gsm8k {split} example {index}: answer has no '#### <number>' line: {answer[-60:]!r}")
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question + " " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


def read_jsonl(path: str) -> list[dict]:
    """GSM8K ``{"question", "answer"}`` lines of one jsonl file.

    Raises:
        DataError: the file is missing, a line is not JSON, or lacks question/answer.
    """
    if not os.path.isfile(path):
        raise DataError(
            f"--input_dir: {path} not found; pass the folder holding GSM8K train.jsonl and test.jsonl "
            "(e.g. ../shared/data/gsm8k)"
        )
    examples = []
    for lineno, ex in iter_jsonl(path):
        if not isinstance(ex, dict) or "question" not in ex or "answer" not in ex:
            raise DataError(f"{path}:{lineno}: expected an object with 'question' and 'answer' keys")
        examples.append(ex)
    return examples


def load_hub_splits() -> dict[str, list[dict]]:
    """``openai/gsm8k`` ("main") train/test from the hub via the ``datasets`` library."""
    try:
        import datasets
    except ImportError:
        raise DataError(
            "the `datasets` library is not installed, so openai/gsm8k cannot be loaded from the hub; "
            "pass --input_dir with GSM8K train.jsonl and test.jsonl (e.g. ../shared/data/gsm8k)"
        ) from None
    try:
        ds = datasets.load_dataset(DATA_SOURCE, "main")
    except Exception as exc:  # noqa: BLE001 - offline, hub errors: all mean "use local files"
        raise DataError(
            f"could not load {DATA_SOURCE} from the hub ({type(exc).__name__}); "
            "pass --input_dir with GSM8K train.jsonl and test.jsonl (e.g. ../shared/data/gsm8k)"
        ) from None
    return {split: ds[split].to_list() for split in ("train", "test")}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Write GSM8K as verl RL parquet (train.parquet, test.parquet).")
    parser.add_argument("--input_dir", default=None, help="folder with GSM8K train.jsonl and test.jsonl")
    parser.add_argument("--local_dir", default="~/data/gsm8k", help="output folder")
    parser.add_argument("--train_size", type=int, default=None, help="keep the first N train rows")
    parser.add_argument("--test_size", type=int, default=None, help="keep the first N test rows")
    return parser


def convert(
    input_dir: str | None, local_dir: str, train_size: int | None = None, test_size: int | None = None
) -> dict[str, str]:
    """Write ``train.parquet`` and ``test.parquet`` into ``local_dir``; returns split -> path.

    Raises:
        DataError: unreadable input (see ``read_jsonl`` / ``load_hub_splits``).
    """
    written = {}
    for split, examples in load_splits(input_dir, train_size, test_size).items():
        rows = [make_row(ex["question"], ex["answer"], split, i) for i, ex in enumerate(examples)]
        written[split] = write_split(rows, local_dir, split)
    return written


def load_splits(
    input_dir: str | None, train_size: int | None = None, test_size: int | None = None
) -> dict[str, list[dict]]:
    """GSM8K ``{"question", "answer"}`` examples by split (``train``, ``test``): from the jsonl
    files of ``input_dir``, or from the hub when it is None; the first ``*_size`` of each.

    Raises:
        DataError: unreadable input (see ``read_jsonl`` / ``load_hub_splits``).
    """
    if input_dir is None:
        splits = load_hub_splits()
    else:
        input_dir = os.path.expanduser(input_dir)
        splits = {s: read_jsonl(os.path.join(input_dir, f"{s}.jsonl")) for s in ("train", "test")}
    sizes = {"train": train_size, "test": test_size}
    return {
        split: examples[: sizes[split]] if sizes[split] is not None else examples for split, examples in splits.items()
    }


def main(argv: list[str] | None = None) -> None:
    """CLI entry (returns None, so ``sys.exit(main())`` is 0); a ``DataError`` exits with its
    one-line message and status 1. Use ``convert`` for the written paths."""
    args = build_parser().parse_args(argv)
    try:
        written = convert(args.input_dir, args.local_dir, args.train_size, args.test_size)
    except DataError as exc:
        sys.exit(f"gsm8k preprocess: error: {exc}")
    for split, path in written.items():
        print(f"wrote {split}: {path}")


if __name__ == "__main__":
    main()
