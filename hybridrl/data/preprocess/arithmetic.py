"""Write the generated arithmetic task (hybridrl's default demo) as verl RL parquet files.

Each question is a short integer expression built from a seeded RNG, so no download is needed.
The default difficulty (two operands: ``+``/``-`` on 0..20, ``*`` on 0..12, e.g.
``What is 8 - 17?``) puts the untrained SmolLM2-135M-Instruct at a low but non-zero reward;
``--max_terms``, ``--max_value`` and ``--max_factor`` make it harder. Rows follow verl's RL format::

    data_source  "arithmetic"
    prompt       [{"role": "user", "content": "<question + answer-format instruction>"}]
    ability      "math"
    reward_model {"style": "rule", "ground_truth": "<answer as a string>"}
    extra_info   {"split", "index", "question"}

Train and test never share an expression; train may repeat one. Score responses with
``hybridrl.rewards.arithmetic.compute_score``.

Usage: ``python -m hybridrl.data.preprocess.arithmetic --local_dir ~/data/arithmetic``
"""

from __future__ import annotations

import argparse
import random

from hybridrl.data.preprocess import write_splits
from hybridrl.errors import UserError

DATA_SOURCE = "arithmetic"
PROMPT_TEMPLATE = "{question} Give only the final number, written as: Answer: <number>"
_OPERATORS = "+-*"


class ArithmeticConfigError(UserError, ValueError):
    """A difficulty knob or split size cannot produce the requested data set."""


def evaluate(operands: list[int], ops: list[str]) -> int:
    """Evaluate ``operands[0] ops[0] operands[1] ...`` with the usual precedence (* before +/-).

    Args:
        operands: n integers.
        ops: n-1 operators, each one of ``+ - *``.

    Returns:
        The integer value of the expression.
    """
    # Fold products first into a list of signed terms, then add the terms.
    terms, signs = [operands[0]], [1]
    for op, value in zip(ops, operands[1:]):
        if op == "*":
            terms[-1] *= value
        else:
            terms.append(value)
            signs.append(1 if op == "+" else -1)
    return sum(s * t for s, t in zip(signs, terms))


def make_problem(
    rng: random.Random, min_terms: int, max_terms: int, max_value: int, max_factor: int, operators: str
) -> tuple[str, int]:
    """Draw one expression; returns ``(expression, answer)``, e.g. ``("4 + 9 * 2", 22)``.

    Operands of ``*`` are drawn from 0..max_factor (times-table size, so products stay
    guessable for a small model); all other operands from 0..max_value.
    """
    n = rng.randint(min_terms, max_terms)
    ops = [rng.choice(operators) for _ in range(n - 1)]
    near_mul = [(i > 0 and ops[i - 1] == "*") or (i < n - 1 and ops[i] == "*") for i in range(n)]
    operands = [rng.randint(0, max_factor if mul else max_value) for mul in near_mul]
    expr = str(operands[0]) + "".join(f" {op} {v}" for op, v in zip(ops, operands[1:]))
    return expr, evaluate(operands, ops)


def _check_args(args: argparse.Namespace) -> None:
    if args.train_size < 0 or args.test_size < 0:
        raise ArithmeticConfigError("--train_size/--test_size must be >= 0")
    if not 2 <= args.min_terms <= args.max_terms:
        raise ArithmeticConfigError(f"need 2 <= --min_terms <= --max_terms, got {args.min_terms}, {args.max_terms}")
    if args.max_value < 1 or args.max_factor < 1:
        raise ArithmeticConfigError(
            f"--max_value and --max_factor must be >= 1, got {args.max_value}, {args.max_factor}"
        )
    bad = set(args.operators) - set(_OPERATORS)
    if not args.operators or bad:
        raise ArithmeticConfigError(f"--operators {args.operators!r}: use only the characters + - *")


def _draw(rng: random.Random, args: argparse.Namespace) -> tuple[str, int]:
    return make_problem(rng, args.min_terms, args.max_terms, args.max_value, args.max_factor, args.operators)


def generate_questions(args: argparse.Namespace) -> tuple[list, list]:
    """Seeded ``(test_pairs, train_pairs)`` of ``(expression, answer)``.

    Test expressions are distinct; train expressions are drawn with replacement (the small
    default space holds only a few thousand expressions) but never equal a test expression.
    The test set is drawn first, so it does not depend on ``--train_size``.

    Raises:
        ArithmeticConfigError: the knobs allow too few distinct expressions for the test set.
    """
    _check_args(args)
    rng, test, seen = random.Random(args.seed), [], set()
    budget = 50 * (args.train_size + args.test_size) + 1000
    while len(test) < args.test_size:
        budget -= 1
        if budget < 0:
            raise ArithmeticConfigError(
                f"only {len(test)} distinct expressions found for --test_size {args.test_size}; "
                "raise --max_value or --max_terms, or lower --test_size"
            )
        expr, answer = _draw(rng, args)
        if expr not in seen:
            seen.add(expr)
            test.append((expr, answer))
    train = []
    while len(train) < args.train_size:
        budget -= 1
        if budget < 0:
            raise ArithmeticConfigError(
                "the test set covers almost every expression, none left for training; raise "
                "--max_value or --max_terms, or lower --test_size"
            )
        expr, answer = _draw(rng, args)
        if expr not in seen:
            train.append((expr, answer))
    return test, train


def make_row(expr: str, answer: int, split: str, index: int) -> dict:
    """One verl RL row for the expression ``expr`` whose value is ``answer``."""
    question = f"What is {expr}?"
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": PROMPT_TEMPLATE.format(question=question)}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(answer)},
        "extra_info": {"split": split, "index": index, "question": question},
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Write the generated arithmetic task as parquet.")
    p.add_argument("--local_dir", default="~/data/arithmetic", help="output folder")
    p.add_argument("--train_size", type=int, default=5000)
    p.add_argument("--test_size", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min_terms", type=int, default=2, help="fewest operands per expression")
    p.add_argument("--max_terms", type=int, default=2, help="most operands per expression")
    p.add_argument("--max_value", type=int, default=20, help="+/- operands are drawn from 0..max_value")
    p.add_argument("--max_factor", type=int, default=12, help="* operands are drawn from 0..max_factor")
    p.add_argument("--operators", default="+-*", help="operators to draw from, e.g. '+-*'")
    return p


def main(argv: list[str] | None = None) -> tuple[str, str]:
    """Generate the data and write ``train.parquet`` and ``test.parquet``; returns their paths."""
    args = build_parser().parse_args(argv)
    test_pairs, train_pairs = generate_questions(args)
    return write_splits(
        {
            split: [make_row(e, a, split, i) for i, (e, a) in enumerate(pairs)]
            for split, pairs in (("train", train_pairs), ("test", test_pairs))
        },
        args.local_dir,
    )


if __name__ == "__main__":
    main()
