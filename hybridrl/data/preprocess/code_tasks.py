"""Write the generated code-writing task (a CPU demo of code rewards) as verl RL parquet files.

Each problem asks for one small Python function, drawn from a seeded RNG (no download), e.g.
"Write a Python function `add(x)` that returns x plus 7." Its tests are call-based cases that
run in the sandbox (:mod:`hybridrl.rewards.code`); the score is the fraction of cases passed,
so a half-right function earns half. Rows follow verl's RL format::

    data_source  "code_tasks"
    prompt       [{"role": "user", "content": "<task, one example, answer-format instruction>"}]
    ability      "code"
    reward_model {"style": "rule", "ground_truth": '{"fn_name": ..., "inputs": [[...], ...], "outputs": [...]}'}
    extra_info   {"split", "index", "question", "template", "constant" (the {c} of the template, or None)}

A problem is a template and its constant (``add`` with 7); test and train never share one, and
train may repeat one (with other test inputs). Usage: ``hybridrl preprocess code_tasks --local_dir ~/data/code_tasks``
"""

from __future__ import annotations

import argparse
import json
import random
import string
from dataclasses import dataclass
from typing import Any, Callable

from hybridrl.data.errors import DataError
from hybridrl.data.preprocess import write_splits

DATA_SOURCE = "code_tasks"
PROMPT_TEMPLATE = (
    "Write a Python function `{name}({params})` that {description}. For example, "
    "{name}({example_args}) returns {example_output}. "
    "Reply with the function in a ```python code block."
)


@dataclass(frozen=True)
class Template:
    """One kind of problem: ``fn(c, *args)`` is the reference, ``args`` names the input kind,
    ``constants`` the values of ``{c}`` (``(None,)``: the description has none)."""

    name: str
    args: str
    description: str
    fn: Callable[..., Any]
    constants: tuple = (None,)


_PARAMS = {"int": "x", "signed": "x", "pair": "a, b", "list": "xs", "nonempty": "xs", "digits": "xs", "word": "s"}
TEMPLATES = (
    Template("add", "int", "returns x plus {c}", lambda c, x: x + c, tuple(range(1, 21))),
    Template("subtract", "int", "returns x minus {c}", lambda c, x: x - c, tuple(range(1, 21))),
    Template("multiply", "int", "returns x multiplied by {c}", lambda c, x: x * c, tuple(range(2, 21))),
    Template(
        "divide",
        "int",
        "returns x divided by {c}, rounded down (integer division)",
        lambda c, x: x // c,
        tuple(range(2, 11)),
    ),
    Template("remainder", "int", "returns the remainder of x divided by {c}", lambda c, x: x % c, tuple(range(2, 13))),
    Template("power", "int", "returns x to the power of {c}", lambda c, x: x**c, (2, 3, 4)),
    Template(
        "greater_than",
        "int",
        "returns True if x is greater than {c}, otherwise False",
        lambda c, x: x > c,
        tuple(range(0, 31)),
    ),
    Template("square", "int", "returns x squared (x times x)", lambda c, x: x * x),
    Template("is_even", "int", "returns True if x is even, otherwise False", lambda c, x: x % 2 == 0),
    Template("absolute", "signed", "returns the absolute value of x", lambda c, x: abs(x)),
    Template("add_pair", "pair", "returns a plus b", lambda c, a, b: a + b),
    Template("larger", "pair", "returns the larger of a and b", lambda c, a, b: max(a, b)),
    Template("smaller", "pair", "returns the smaller of a and b", lambda c, a, b: min(a, b)),
    Template("total", "list", "returns the sum of the numbers in the list xs", lambda c, xs: sum(xs)),
    Template("count", "list", "returns the number of elements in the list xs", lambda c, xs: len(xs)),
    Template("largest", "nonempty", "returns the largest number in the list xs", lambda c, xs: max(xs)),
    Template(
        "count_value",
        "digits",
        "returns how many times {c} appears in the list xs",
        lambda c, xs: xs.count(c),
        tuple(range(0, 10)),
    ),
    Template(
        "contains",
        "digits",
        "returns True if {c} is in the list xs, otherwise False",
        lambda c, xs: c in xs,
        tuple(range(0, 10)),
    ),
    Template("reverse", "word", "returns the string s reversed", lambda c, s: s[::-1]),
    Template("shout", "word", "returns the string s in upper case", lambda c, s: s.upper()),
    Template("first_char", "word", "returns the first character of the string s", lambda c, s: s[0]),
    Template("repeat", "word", "returns the string s repeated {c} times", lambda c, s: s * c, (2, 3, 4, 5)),
)
PROBLEMS = tuple((t.name, c) for t in TEMPLATES for c in t.constants)  # every distinct problem
MAX_TEST_SIZE = len(PROBLEMS) - len(TEMPLATES)


def draw_args(rng: random.Random, kind: str) -> list:
    """One test input (the argument list) of the given kind, e.g. ``[7]`` or ``[[3, 1, 4]]``."""
    if kind == "int":
        return [rng.randint(0, 30)]
    if kind == "signed":
        return [rng.randint(-30, 30)]
    if kind == "pair":
        return [rng.randint(-20, 20), rng.randint(-20, 20)]
    if kind in ("list", "nonempty"):
        return [[rng.randint(-9, 9) for _ in range(rng.randint(1 if kind == "nonempty" else 0, 6))]]
    if kind == "digits":
        return [[rng.randint(0, 9) for _ in range(rng.randint(0, 8))]]
    return ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 8)))]


def draw_tests(template: Template, c: Any, rng: random.Random, num_tests: int) -> list[list]:
    """``num_tests`` inputs whose outputs are not all equal (when 20 draws allow it), so that a
    function returning a constant cannot pass every case."""
    for _ in range(20):
        tests = [draw_args(rng, template.args) for _ in range(num_tests)]
        if num_tests < 2 or len({json.dumps(template.fn(c, *a)) for a in tests}) > 1:
            break
    return tests


def make_row(template: Template, c: Any, rng: random.Random, num_tests: int, split: str, index: int) -> dict:
    """One verl RL row: ``template`` with constant ``c``, ``num_tests`` call-based cases drawn from ``rng``."""
    description = template.description.format(c=c)
    example = draw_args(rng, template.args)
    tests = draw_tests(template, c, rng, num_tests)
    content = PROMPT_TEMPLATE.format(
        name=template.name,
        params=_PARAMS[template.args],
        description=description,
        example_args=", ".join(repr(a) for a in example),
        example_output=repr(template.fn(c, *example)),
    )
    ground_truth = {"fn_name": template.name, "inputs": tests, "outputs": [template.fn(c, *a) for a in tests]}
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": content}],
        "ability": "code",
        "reward_model": {"style": "rule", "ground_truth": json.dumps(ground_truth)},
        "extra_info": {
            "split": split,
            "index": index,
            "question": f"{template.name}: {description}",
            "template": template.name,
            "constant": c,
        },
    }


def _draw_problem(rng: random.Random, exclude: set, keep_one: bool = False) -> tuple[Template, Any]:
    """A template drawn uniformly (so those with many constants do not dominate), then one of its
    constants not in ``exclude``; with ``keep_one``, never a template's last such constant."""
    free = {t.name: [c for c in t.constants if (t.name, c) not in exclude] for t in TEMPLATES}
    template = rng.choice([t for t in TEMPLATES if len(free[t.name]) > keep_one])
    return template, rng.choice(free[template.name])


def generate_rows(train_size: int, test_size: int, num_tests: int, seed: int) -> tuple[list, list]:
    """Seeded ``(train_rows, test_rows)``: test problems distinct, train problems drawn (with
    repeats) from the others. Test takes no template's last problem, so every template is trained
    on and the test split holds new constants of trained templates. The test split is drawn
    first, so it does not depend on ``train_size``.

    Raises:
        DataError: a negative size, ``num_tests < 1``, or ``test_size > MAX_TEST_SIZE``.
    """
    if train_size < 0 or test_size < 0 or num_tests < 1:
        raise DataError(
            f"--train_size/--test_size must be >= 0 and --num_tests >= 1, got {train_size}, {test_size}, {num_tests}"
        )
    if test_size > MAX_TEST_SIZE:
        raise DataError(
            f"--test_size {test_size}: at most {MAX_TEST_SIZE} problems can be held out (each "
            "template keeps one for training); lower --test_size"
        )
    rng, in_test, test = random.Random(seed), set(), []
    for i in range(test_size):
        template, c = _draw_problem(rng, in_test, keep_one=True)
        in_test.add((template.name, c))
        test.append(make_row(template, c, rng, num_tests, "test", i))
    train = [make_row(*_draw_problem(rng, in_test), rng, num_tests, "train", i) for i in range(train_size)]
    return train, test


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Write the generated code-writing task as parquet.")
    p.add_argument("--local_dir", default="~/data/code_tasks", help="output folder")
    p.add_argument("--train_size", type=int, default=2000)
    p.add_argument("--test_size", type=int, default=32, help=f"distinct problems (at most {MAX_TEST_SIZE})")
    p.add_argument("--num_tests", type=int, default=5, help="test cases per problem")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> tuple[str, str]:
    """Generate the data and write ``train.parquet`` and ``test.parquet``; returns their paths.

    Raises:
        DataError: see :func:`generate_rows`.
    """
    args = build_parser().parse_args(argv)
    train, test = generate_rows(args.train_size, args.test_size, args.num_tests, args.seed)
    return write_splits({"train": train, "test": test}, args.local_dir)


if __name__ == "__main__":
    main()
