"""GSM8K -> verl RL parquet for the ``tool_agent`` (verl's gsm8k_multiturn_w_tool format).

    python -m hybridrl.data.preprocess.gsm8k_tool --input_dir ../shared/data/gsm8k --local_dir ~/data/gsm8k_tool
    hybridrl preprocess gsm8k_tool --input_dir ../shared/data/gsm8k --local_dir ~/data/gsm8k_tool --interaction

Each row has a system prompt asking the model to check its answer with the
``calc_gsm8k_reward`` tool, ``agent_name: tool_agent``, the tool's ``create_kwargs`` (the
ground truth) in ``extra_info.tools_kwargs``, and ``extra_info.interaction_kwargs``
(``query``, ``ground_truth``; plus ``name: gsm8k`` with ``--interaction``, which turns on the
GSM8K interaction that tells the model whether it is right and lets it retry). Rows are
scored by the GSM8K rule like the plain GSM8K data (``data_source`` openai/gsm8k).
"""

from __future__ import annotations

import argparse
import sys

from hybridrl.data.errors import DataError
from hybridrl.data.preprocess import write_split
from hybridrl.data.preprocess.gsm8k import DATA_SOURCE, INSTRUCTION, extract_solution, load_splits

AGENT_NAME = "tool_agent"
TOOL_NAME = "calc_gsm8k_reward"
SYSTEM_PROMPT = (
    "You are a math expert. You are given a question and you need to solve it step by step. "
    "Reason step by step before any tool call. You should use the `calc_gsm8k_reward` tool after step by step "
    "solving the question, before generating the final answer at least once, and refine your answer if necessary. "
    "Put your final answer in the format of `#### <answer>`."
)


def make_row(question: str, answer: str, split: str, index: int, interaction: bool = False) -> dict:
    """One parquet row for the tool agent.

    Raises:
        DataError: the answer has no ``#### <number>`` final line.
    """
    ground_truth = extract_solution(answer)
    if ground_truth is None:
        raise DataError(f"gsm8k {split} example {index}: answer has no '#### <number>' line: {answer[-60:]!r}")
    interaction_kwargs = {"query": question, "ground_truth": ground_truth}
    if interaction:
        interaction_kwargs = {"name": "gsm8k", **interaction_kwargs}
    return {
        "data_source": DATA_SOURCE,
        "agent_name": AGENT_NAME,
        "prompt": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": question + " " + INSTRUCTION},
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {
            "split": split,
            "index": index,
            "answer": answer,
            "question": question,
            "need_tools_kwargs": True,
            "tools_kwargs": {TOOL_NAME: {"create_kwargs": {"ground_truth": ground_truth}}},
            "interaction_kwargs": interaction_kwargs,
        },
    }


def convert(
    input_dir: str | None,
    local_dir: str,
    train_size: int | None = None,
    test_size: int | None = None,
    interaction: bool = False,
) -> dict[str, str]:
    """Write ``train.parquet`` and ``test.parquet`` into ``local_dir`` (atomically); returns split -> path.

    Raises:
        DataError: unreadable input (see ``gsm8k.load_splits``).
    """
    written = {}
    for split, examples in load_splits(input_dir, train_size, test_size).items():
        rows = [make_row(ex["question"], ex["answer"], split, i, interaction) for i, ex in enumerate(examples)]
        written[split] = write_split(rows, local_dir, split)
    return written


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Write GSM8K as verl RL parquet for the tool agent.")
    parser.add_argument("--input_dir", default=None, help="folder with GSM8K train.jsonl and test.jsonl")
    parser.add_argument("--local_dir", default="~/data/gsm8k_tool", help="output folder")
    parser.add_argument("--train_size", type=int, default=None, help="keep the first N train rows")
    parser.add_argument("--test_size", type=int, default=None, help="keep the first N test rows")
    parser.add_argument(
        "--interaction",
        action="store_true",
        help="name the gsm8k interaction in interaction_kwargs (feedback and retries)",
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    """CLI entry; a ``DataError`` exits with its one-line message and status 1."""
    args = build_parser().parse_args(argv)
    try:
        written = convert(args.input_dir, args.local_dir, args.train_size, args.test_size, args.interaction)
    except DataError as exc:
        sys.exit(f"gsm8k_tool preprocess: error: {exc}")
    for split, path in written.items():
        print(f"wrote {split}: {path}")


if __name__ == "__main__":
    main()
