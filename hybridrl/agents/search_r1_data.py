"""Open-domain QA (NQ, HotpotQA, ...) -> verl RL parquet for a search agent, as in Search-R1.

    python examples/data_preprocess/search_r1.py --input_file ../shared/data/nq_open/dev.jsonl \\
        --corpus ../shared/data/wiki/corpus.jsonl --answerable_only --local_dir ~/data/search_r1

Each row asks the model to reason in ``<think>``, search with ``<search> query </search>``
(results come back in ``<information>``) and answer in ``<answer>``; it is scored by
``hybridrl.rewards.qa_em`` (exact match) and rolled out by the ``search_agent`` agent loop.
Search-R1: Jin et al., arXiv:2503.09516.

Input rows are ``{"question", "answer": [...]}`` (NQ-open) or ``{"question", "golden_answers"}``
(FlashRAG). Without ``--input_file``/``--input_dir`` the FlashRAG hub dataset that Search-R1
uses (``RUC-NLPIR/FlashRAG_datasets``, config = ``--data_source``) is loaded with ``datasets``.
``--answerable_only`` keeps the questions with an answer that occurs (normalised, as whole
words) in some passage of ``--corpus``: needed when the corpus is a small slice of Wikipedia.

Prompt. By default the instruction is followed by a demonstration, as earlier chat turns: the
instruction is the system message, then three solved questions (:data:`EXAMPLES`, none from
NQ-open), each answered in the exact form the ``search_agent`` produces (``<search> q </search>``,
the ``\n\n<information>Doc 1(Title: ...) ...</information>\n\n`` block the agent appends, then
``<think> ... </think>`` and ``<answer> ... </answer>``), then the real question. A 135M model
does not follow the bare instruction. First turns of SmolLM2-135M-Instruct on NQ-open dev
questions (8 questions x 4 samples, T=1, 64-96 tokens) that write ``<search>``: 0/32 with the plain
prompt, 0/32 with one example inside the user message, 1/32 with one example as chat turns,
23/32 with three examples that think before searching, and 30/32 (two sets of 8 questions) with
this prompt, 23/32 and 21/32 with a complete ``<search> q </search>``; the queries are about the
question, not copies of the examples. So the examples search at once and reason when the
information has arrived, as the instruction asks. It adds about 330 tokens (NQ-open prompts:
483-502 tokens with the SmolLM2 chat template). ``--no_example`` gives the plain prompt (one user
message: :data:`INSTRUCTION` with the question).
"""

import argparse
import os
import random
import sys

from hybridrl.agents.retrieval import format_passages, read_corpus
from hybridrl.agents.search_agent import INFO_CLOSE, INFO_OPEN
from hybridrl.data.errors import DataError
from hybridrl.data.jsonl import iter_jsonl
from hybridrl.data.preprocess import write_split
from hybridrl.rewards.qa_em import normalize_answer

HUB_DATASET = "RUC-NLPIR/FlashRAG_datasets"
ABILITY = "fact-reasoning"
AGENT_NAME = "search_agent"
PROTOCOL = (
    "Answer the question below. Every time you receive new information, first reason about it "
    "inside <think> and </think>. If you are missing some knowledge, you can query a search engine "
    "by writing <search> your query </search>; the best matching passages will be returned between "
    "<information> and </information>. You may search as many times as you need. Once you can "
    "answer, give only the final short answer inside <answer> and </answer>, with no explanation, "
    "for example <answer> Paris </answer>."
)
INSTRUCTION = PROTOCOL + " Question: {question}\n"  # the plain (``--no_example``) prompt
# Solved questions for the demonstration: (question, query, [(title, passage), ...], thought, answer).
# None is an NQ-open question (a test checks); the passages are shortened Wikipedia lead sentences.
EXAMPLES = [
    (
        "who wrote the novel moby dick?",
        "Moby Dick novel author",
        [
            ("Moby-Dick", "Moby-Dick is an 1851 novel by American writer Herman Melville."),
            ("Herman Melville", "Herman Melville was an American novelist and poet."),
        ],
        "Doc 1 says Herman Melville wrote it.",
        "Herman Melville",
    ),
    (
        "which is the largest planet in the solar system?",
        "largest planet in the solar system",
        [
            ("Jupiter", "Jupiter is the fifth planet from the Sun and the largest in the Solar System."),
            ("Saturn", "Saturn is the second largest planet in the Solar System."),
        ],
        "Doc 1 says Jupiter is the largest.",
        "Jupiter",
    ),
    (
        "who is credited with inventing the telephone?",
        "inventor of the telephone",
        [
            (
                "Alexander Graham Bell",
                "Alexander Graham Bell was an inventor credited with patenting the first telephone.",
            ),
            ("Telephone", "A telephone lets two people talk when they are far apart."),
        ],
        "Doc 1 says Alexander Graham Bell.",
        "Alexander Graham Bell",
    ),
]
_HINT = 'pass --input_file with a {"question", "answer": [...]} jsonl (e.g. ../shared/data/nq_open/dev.jsonl)'


def information(passages: list[tuple[str, str]]) -> str:
    """The observation the ``search_agent`` appends after a search, for ``(title, text)`` passages
    (built by the agent's own formatting, so the demonstration cannot drift from it)."""
    hits = [{"document": {"contents": f'"{title}"\n{text}'}} for title, text in passages]
    return INFO_OPEN + format_passages(hits).strip() + INFO_CLOSE


def demonstration(question: str | None = None) -> list[dict]:
    """System message (:data:`PROTOCOL`) and the solved :data:`EXAMPLES` as earlier chat turns;
    an example with the same question as ``question`` is left out (it would give the answer away)."""
    messages = [{"role": "system", "content": PROTOCOL}]
    skip = normalize_answer(question) if question else None
    for q, query, passages, thought, answer in EXAMPLES:
        if normalize_answer(q) == skip:
            continue
        messages.append({"role": "user", "content": f"Question: {q}"})
        messages.append(
            {
                "role": "assistant",
                "content": f"<search> {query} </search>{information(passages)}"
                f"<think> {thought} </think>\n<answer> {answer} </answer>",
            }
        )
    return messages


def make_prompt(question: str, example: bool = True) -> list[dict]:
    """The chat messages of one row: the demonstration and the question, or (``example=False``)
    Search-R1's plain instruction prompt."""
    if not example:
        return [{"role": "user", "content": INSTRUCTION.format(question=question)}]
    return demonstration(question) + [{"role": "user", "content": f"Question: {question}"}]


def make_row(
    question: str, answers: list[str], split: str, index: int, data_source: str = "nq", example: bool = True
) -> dict:
    """One verl RL parquet row; the question gets a final '?' as in Search-R1's preprocessing.
    ``example``: prompt with the demonstration (see the module docstring) or the plain one."""
    question = question.strip()
    if not question.endswith("?"):
        question += "?"
    return {
        "data_source": data_source,
        "prompt": make_prompt(question, example),
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": {"target": list(answers)}},
        "extra_info": {"split": split, "index": index, "question": question},
        "agent_name": AGENT_NAME,
    }


def _answers_of(ex: dict) -> list[str] | None:
    answers = ex.get("answer", ex.get("golden_answers"))
    if isinstance(answers, str):
        answers = [answers]
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) for a in answers):
        return None
    return answers


def read_jsonl(path: str) -> list[dict]:
    """``[{"question": str, "answers": [str, ...]}, ...]`` from a QA jsonl file.

    Raises:
        DataError: the file is missing, a line is not JSON, or lacks a question or answers.
    """
    if not os.path.isfile(path):
        raise DataError(f"{path}: file not found; {_HINT}")
    examples = []
    for lineno, ex in iter_jsonl(path):
        answers = _answers_of(ex) if isinstance(ex, dict) else None
        if answers is None or not isinstance(ex.get("question"), str):
            raise DataError(
                f'{path}:{lineno}: expected {{"question": str, "answer": [str, ...]}} '
                "(or 'golden_answers' for the answers)"
            )
        examples.append({"question": ex["question"], "answers": answers})
    return examples


class AnswerFinder:
    """Tells whether an answer occurs in some passage of a corpus, after :func:`normalize_answer`
    and on word boundaries ("1972" is not found in "19724").

    A word -> passages map narrows each lookup to the passages holding every answer word.
    """

    def __init__(self, passages: list[str]):
        self._passages = [f" {normalize_answer(p)} " for p in passages]
        self._by_word: dict[str, set[int]] = {}
        for i, text in enumerate(self._passages):
            for word in set(text.split()):
                self._by_word.setdefault(word, set()).add(i)

    def contains(self, answer: str) -> bool:
        words = normalize_answer(answer).split()
        if not words:
            return False
        sets = sorted((self._by_word.get(w, set()) for w in set(words)), key=len)
        candidates = set.intersection(*sets)
        needle = f" {' '.join(words)} "
        return any(needle in self._passages[i] for i in candidates)


def answer_finder(corpus_path: str) -> AnswerFinder:
    """An :class:`AnswerFinder` over the passages of a corpus jsonl.

    Raises:
        DataError: unreadable corpus (see ``hybridrl.agents.retrieval.read_corpus``).
    """
    return AnswerFinder([doc["contents"] for doc in read_corpus(corpus_path)])


def filter_answerable(examples: list[dict], finder: AnswerFinder) -> list[dict]:
    """The examples with at least one answer that ``finder`` finds in its corpus."""
    return [ex for ex in examples if any(finder.contains(a) for a in ex["answers"])]


def load_hub_splits(data_source: str) -> dict[str, list[dict]]:
    """Train/test of ``RUC-NLPIR/FlashRAG_datasets`` (config ``data_source``) from the hub."""
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"the `datasets` library is not installed, so {HUB_DATASET} cannot be loaded; {_HINT}"
        ) from None
    try:
        ds = datasets.load_dataset(HUB_DATASET, data_source)
    except Exception as exc:  # noqa: BLE001 - offline, unknown config, hub errors: all mean "use local files"
        raise DataError(
            f"could not load {HUB_DATASET} ({data_source}) from the hub ({type(exc).__name__}); {_HINT}"
        ) from None
    splits = {}
    for split, names in (("train", ("train",)), ("test", ("test", "dev"))):
        name = next((n for n in names if n in ds), None)
        if name is not None:
            splits[split] = [{"question": ex["question"], "answers": list(ex["golden_answers"])} for ex in ds[name]]
    return splits


def _read_input(input_file: str | None, input_dir: str | None) -> dict[str, list[dict]]:
    """``{"train": [...], "test": [...]}`` from separate files, or ``{"all": [...]}`` to be split."""
    if input_file is not None:
        return {"all": read_jsonl(os.path.expanduser(input_file))}
    input_dir = os.path.expanduser(input_dir)
    found = {n: os.path.join(input_dir, f"{n}.jsonl") for n in ("train", "test", "dev")}
    found = {n: p for n, p in found.items() if os.path.isfile(p)}
    test_name = "test" if "test" in found else "dev" if "dev" in found else None
    if test_name is None and "train" not in found:
        raise DataError(f"--input_dir {input_dir}: no train.jsonl, test.jsonl or dev.jsonl there; {_HINT}")
    if "train" not in found or test_name is None:  # one file only: split it
        return {"all": read_jsonl(found.get("train") or found[test_name])}
    return {"train": read_jsonl(found["train"]), "test": read_jsonl(found[test_name])}


def _split(examples: list[dict], test_size: int | None, seed: int) -> dict[str, list[dict]]:
    examples = list(examples)
    random.Random(seed).shuffle(examples)
    n_test = max(1, len(examples) // 10) if test_size is None else test_size
    if n_test >= len(examples):
        raise DataError(
            f"--test_size {n_test}: the input has only {len(examples)} usable questions; ask for fewer test rows"
        )
    return {"train": examples[n_test:], "test": examples[:n_test]}


def convert(
    input_file: str | None,
    input_dir: str | None,
    local_dir: str,
    *,
    train_size: int | None = None,
    test_size: int | None = None,
    corpus: str | None = None,
    answerable_only: bool = False,
    data_source: str = "nq",
    seed: int = 0,
    example: bool = True,
) -> dict[str, str]:
    """Write ``train.parquet`` and ``test.parquet`` into ``local_dir``; returns split -> path.

    A single input file (``input_file``, or an ``input_dir`` with one of train/test/dev.jsonl)
    is shuffled with ``seed`` and split: ``test_size`` rows (default 10 %) for test, the rest
    for train. The answerable filter runs before the sizes are applied. ``example=False``: the
    plain instruction prompt instead of the demonstration.

    Raises:
        DataError: bad options or unreadable input/corpus.
    """
    if input_file is not None and input_dir is not None:
        raise DataError("give --input_file or --input_dir, not both")
    if answerable_only and corpus is None:
        raise DataError("--answerable_only needs --corpus (the passages the answers must occur in)")
    if input_file is None and input_dir is None:
        splits = load_hub_splits(data_source)
    else:
        splits = _read_input(input_file, input_dir)
    if answerable_only:
        finder = answer_finder(corpus)
        splits = {name: filter_answerable(examples, finder) for name, examples in splits.items()}
    if "all" in splits:
        splits = _split(splits["all"], test_size, seed)
    sizes = {"train": train_size, "test": test_size}
    written = {}
    for split, examples in splits.items():
        examples = examples[: sizes[split]] if sizes[split] is not None else examples
        rows = [
            make_row(ex["question"], ex["answers"], split, i, data_source, example) for i, ex in enumerate(examples)
        ]
        written[split] = write_split(rows, local_dir, split)
    return written


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Write a QA data set as verl RL parquet for a search agent (Search-R1)."
    )
    parser.add_argument("--input_file", default=None, help="one QA jsonl, split into train/test")
    parser.add_argument("--input_dir", default=None, help="folder with train.jsonl and test.jsonl (or dev.jsonl)")
    parser.add_argument("--local_dir", default="~/data/search_r1", help="output folder")
    parser.add_argument("--train_size", type=int, default=None, help="keep at most N train rows")
    parser.add_argument(
        "--test_size", type=int, default=None, help="keep at most N test rows (single input file: 10%% by default)"
    )
    parser.add_argument(
        "--corpus", default=None, help='retrieval corpus jsonl ({"id", "contents"}) for --answerable_only'
    )
    parser.add_argument(
        "--answerable_only",
        action="store_true",
        help="keep questions with an answer that occurs in some passage of --corpus",
    )
    parser.add_argument("--data_source", default="nq", help="data_source column (picks the reward) and hub config")
    parser.add_argument("--seed", type=int, default=0, help="shuffle seed for splitting a single input file")
    parser.add_argument(
        "--no_example",
        action="store_true",
        help="Search-R1's plain instruction prompt, without the solved examples before the question",
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    """CLI entry; a ``DataError`` exits with its one-line message and status 1."""
    args = build_parser().parse_args(argv)
    try:
        written = convert(
            args.input_file,
            args.input_dir,
            args.local_dir,
            train_size=args.train_size,
            test_size=args.test_size,
            corpus=args.corpus,
            answerable_only=args.answerable_only,
            data_source=args.data_source,
            seed=args.seed,
            example=not args.no_example,
        )
    except DataError as exc:
        sys.exit(f"search_r1 preprocess: error: {exc}")
    for split, path in written.items():
        print(f"wrote {split}: {path}")


if __name__ == "__main__":
    main()
