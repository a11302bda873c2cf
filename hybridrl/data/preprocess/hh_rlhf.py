"""Anthropic HH-RLHF preference pairs -> parquet for reward-model training AND PPO.

    python examples/data_preprocess/hh_rlhf.py --input_dir ../shared/data/hh_rlhf --local_dir ~/data/hh_rlhf

Each HH-RLHF record is two whole dialogues, ``chosen`` and ``rejected``, in the form
``"\\n\\nHuman: ...\\n\\nAssistant: ..."`` that differ only in the last assistant turn. A row
of the output holds::

    data_source  "Anthropic/hh-rlhf"
    prompt       [{"role": "user"|"assistant", "content": ...}, ...]   (verl's RL prompt column)
    chosen       the preferred last assistant turn (str)
    rejected     the other one (str)
    ability      "alignment"
    reward_model {"style": "model", "ground_truth": <chosen>}           (scored by a reward model)
    extra_info   {"split", "index", "source"}

so ``hybridrl rm`` trains on ``prompt`` + ``chosen`` + ``rejected`` and ``hybridrl train``
reads the same file's ``prompt`` column. Pairs whose two dialogues differ before the last
assistant turn, or whose two responses are identical, carry no clean preference and are dropped
(5 of the 2,312 pairs of harmless-base test).

``--input_dir`` takes a folder of ``*.jsonl`` / ``*.jsonl.gz`` files; a file whose path holds
"train" is train data, "test" test data (the GitHub layout ``harmless-base/train.jsonl.gz``
and names like ``harmless-base-test.jsonl.gz`` both work). When the folder has no train file
(``../shared/data/hh_rlhf`` has only harmless-base test), a seeded ``--test_ratio`` of the
pairs is held out as test and the rest is train. Without ``--input_dir`` the hub dataset
``Anthropic/hh-rlhf`` (``--subset``, e.g. harmless-base) is loaded with ``datasets``.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys

from hybridrl.data.errors import DataError
from hybridrl.data.jsonl import iter_jsonl
from hybridrl.data.preprocess import write_split

DATA_SOURCE = "Anthropic/hh-rlhf"
ASSISTANT_MARKER = "\n\nAssistant:"
_TURN = re.compile(r"\n\n(Human|Assistant):")
_ROLES = {"Human": "user", "Assistant": "assistant"}


def parse_dialogue(text: str) -> list[dict]:
    """``"\\n\\nHuman: a\\n\\nAssistant: b"`` -> ``[{"role": "user", "content": "a"}, {"role":
    "assistant", "content": "b"}]`` (contents stripped).

    Raises:
        DataError: the text does not start with a ``"\\n\\nHuman:"`` / ``"\\n\\nAssistant:"`` turn.
    """
    parts = _TURN.split(text)
    if parts[0].strip() or len(parts) < 3:
        raise DataError(f"not an HH-RLHF dialogue (it must start with '\\n\\nHuman:'): {text[:60]!r}")
    return [{"role": _ROLES[speaker], "content": content.strip()} for speaker, content in zip(parts[1::2], parts[2::2])]


def split_pair(chosen: str, rejected: str) -> tuple[list[dict], str, str] | None:
    """One HH-RLHF pair -> ``(prompt messages, chosen response, rejected response)``.

    The prompt is everything up to the last ``"\\n\\nAssistant:"`` of each dialogue; the
    responses are the text after it. Returns None for a pair without a clean preference: the
    prompts differ, the responses are identical, or the prompt does not end with a user turn.

    Raises:
        DataError: a dialogue has no assistant turn or is not in the HH-RLHF form.
    """
    cut_c, cut_r = chosen.rfind(ASSISTANT_MARKER), rejected.rfind(ASSISTANT_MARKER)
    if cut_c < 0 or cut_r < 0:
        text = chosen if cut_c < 0 else rejected
        raise DataError(f"an HH-RLHF dialogue has no '\\n\\nAssistant:' turn: {text[:60]!r}")
    if chosen[:cut_c] != rejected[:cut_r]:
        return None
    response_c = chosen[cut_c + len(ASSISTANT_MARKER) :].strip()
    response_r = rejected[cut_r + len(ASSISTANT_MARKER) :].strip()
    messages = parse_dialogue(chosen[:cut_c])
    if response_c == response_r or messages[-1]["role"] != "user":
        return None
    return messages, response_c, response_r


def make_row(chosen: str, rejected: str, split: str, index: int, source: str) -> dict | None:
    """One output row (see the module docstring), or None for a dropped pair."""
    parts = split_pair(chosen, rejected)
    if parts is None:
        return None
    messages, response_c, response_r = parts
    return {
        "data_source": DATA_SOURCE,
        "prompt": messages,
        "chosen": response_c,
        "rejected": response_r,
        "ability": "alignment",
        "reward_model": {"style": "model", "ground_truth": response_c},
        "extra_info": {"split": split, "index": index, "source": source},
    }


def read_pairs(path: str) -> list[dict]:
    """``{"chosen", "rejected"}`` records of one ``.jsonl`` or ``.jsonl.gz`` file.

    Raises:
        DataError: a line is not JSON or lacks chosen/rejected strings.
    """
    pairs = []
    for lineno, record in iter_jsonl(path):
        if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in ("chosen", "rejected")):
            raise DataError(f"{path}:{lineno}: expected an object with 'chosen' and 'rejected' strings")
        pairs.append(record)
    return pairs


def find_split_files(input_dir: str, subset: str | None) -> dict[str, list[str]]:
    """``{"train": [...], "test": [...]}``: the jsonl(.gz) files under ``input_dir`` by split.

    Raises:
        DataError: the folder is missing or holds no matching file.
    """
    if not os.path.isdir(input_dir):
        raise DataError(
            f"--input_dir: {input_dir} is not a folder; pass the folder holding the HH-RLHF "
            "*.jsonl.gz files (e.g. ../shared/data/hh_rlhf)"
        )
    files: dict[str, list[str]] = {"train": [], "test": []}
    for root, _, names in sorted(os.walk(input_dir)):
        for name in sorted(names):
            rel = os.path.relpath(os.path.join(root, name), input_dir)
            if not name.endswith((".jsonl", ".jsonl.gz")) or (subset and subset not in rel):
                continue
            for split in files:
                if split in rel:
                    files[split].append(os.path.join(root, name))
    if not files["train"] and not files["test"]:
        wanted = f" of subset {subset!r}" if subset else ""
        raise DataError(
            f"--input_dir: no *train*/*test* .jsonl(.gz) files{wanted} in {input_dir}; "
            "pass the folder holding the HH-RLHF files (e.g. ../shared/data/hh_rlhf)"
        )
    return files


def load_hub_splits(subset: str | None) -> dict[str, list[tuple[dict, str]]]:
    """``Anthropic/hh-rlhf`` train/test from the hub via ``datasets`` (``subset``: its data_dir)."""
    try:
        import datasets
    except ImportError:
        raise DataError(
            "the `datasets` library is not installed, so Anthropic/hh-rlhf cannot be loaded "
            "from the hub; pass --input_dir (e.g. ../shared/data/hh_rlhf)"
        ) from None
    try:
        ds = datasets.load_dataset(DATA_SOURCE, data_dir=subset)
    except Exception as exc:  # noqa: BLE001 - offline, hub errors: all mean "use local files"
        raise DataError(
            f"could not load {DATA_SOURCE} from the hub ({type(exc).__name__}); "
            "pass --input_dir (e.g. ../shared/data/hh_rlhf)"
        ) from None
    source = f"hub:{DATA_SOURCE}/{subset or 'all'}"
    return {split: [(r, source) for r in ds[split].to_list()] for split in ("train", "test") if split in ds}


def _local_splits(input_dir: str, subset: str | None, test_ratio: float, seed: int):
    files = find_split_files(input_dir, subset)
    splits = {s: [(r, os.path.basename(p)) for p in paths for r in read_pairs(p)] for s, paths in files.items()}
    if not splits["train"]:  # only test files: hold out a seeded part of them as test
        pool = splits["test"]
        random.Random(seed).shuffle(pool)
        n_test = max(1, round(len(pool) * test_ratio))
        splits = {"train": pool[n_test:], "test": pool[:n_test]}
        print(
            f"hh_rlhf: no train file in {input_dir}: {len(splits['train'])} pairs for train, "
            f"{n_test} held out for test (--test_ratio={test_ratio}, --seed={seed})"
        )
    return splits


def convert(
    input_dir: str | None,
    local_dir: str,
    subset: str | None = None,
    train_size: int | None = None,
    test_size: int | None = None,
    test_ratio: float = 0.1,
    seed: int = 0,
) -> dict[str, str]:
    """Write ``train.parquet`` and ``test.parquet`` into ``local_dir``; returns split -> path.

    Raises:
        DataError: unreadable input, a bad ``test_ratio``, or no pair left in a split.
    """
    if not 0 < test_ratio < 1:
        raise DataError(f"--test_ratio={test_ratio} must be between 0 and 1 (e.g. 0.1)")
    if input_dir is None:
        splits = load_hub_splits(subset)
    else:
        splits = _local_splits(os.path.expanduser(input_dir), subset, test_ratio, seed)
    written = {}
    for split, limit in (("train", train_size), ("test", test_size)):
        rows, dropped = [], 0
        for record, source in splits.get(split, []):
            row = make_row(record["chosen"], record["rejected"], split, len(rows), source)
            if row is None:
                dropped += 1
            else:
                rows.append(row)
            if limit is not None and len(rows) >= limit:
                break
        if not rows:
            raise DataError(f"hh_rlhf: no {split} pair left to write (dropped {dropped}); check --input_dir/--subset")
        if dropped:
            print(
                f"hh_rlhf: {split}: dropped {dropped} pairs without a clean preference "
                "(different prompts or identical responses)"
            )
        written[split] = write_split(rows, local_dir, split)
    return written


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Write Anthropic HH-RLHF pairs as parquet (prompt + chosen + rejected, verl RL columns)."
    )
    parser.add_argument(
        "--input_dir",
        default=None,
        help="folder with HH-RLHF *train*/*test* .jsonl(.gz) files; without it the hub dataset is loaded",
    )
    parser.add_argument("--local_dir", default="~/data/hh_rlhf", help="output folder")
    parser.add_argument("--subset", default=None, help="e.g. harmless-base or helpful-base (default: all files)")
    parser.add_argument("--train_size", type=int, default=None, help="keep the first N train pairs")
    parser.add_argument("--test_size", type=int, default=None, help="keep the first N test pairs")
    parser.add_argument(
        "--test_ratio", type=float, default=0.1, help="share of pairs held out as test when the input has no train file"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of that hold-out split")
    return parser


def main(argv: list[str] | None = None) -> None:
    """CLI entry; a ``DataError`` exits with its one-line message and status 1."""
    args = build_parser().parse_args(argv)
    try:
        written = convert(
            args.input_dir, args.local_dir, args.subset, args.train_size, args.test_size, args.test_ratio, args.seed
        )
    except DataError as exc:
        sys.exit(f"hh_rlhf preprocess: error: {exc}")
    for split, path in written.items():
        print(f"wrote {split}: {path}")


if __name__ == "__main__":
    main()
