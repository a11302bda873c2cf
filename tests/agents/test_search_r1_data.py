"""Search-R1 preprocessing on a slice of the real NQ-open dev set and a few wiki-style passages."""

import json
import os
import re
import sys

import pandas as pd
import pytest

from hybridrl.agents import search_r1_data as prep
from hybridrl.data.errors import DataError
from hybridrl.data.preprocess import TASKS
from hybridrl.rewards import default_compute_score
from hybridrl.rewards.qa_em import normalize_answer

REPO = os.path.join(os.path.dirname(__file__), "..", "..")

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data")
NQ_DEV = os.path.join(SHARED, "nq_open", "dev.jsonl")
WIKI = os.path.join(SHARED, "wiki", "corpus.jsonl")

# For the first 12 NQ-open dev questions: only #0 ("December 1972") and #10 ("Madhya Pradesh")
# have an answer in these passages; "The Impalas" and "Bob Russell" occur only as parts of words.
PASSAGES = [
    '"Apollo 17"\nApollo 17 was the last crewed Moon landing, in December 1972.',
    '"Madhya Pradesh"\nMadhya Pradesh is a state in central India.',
    '"Impala"\nThe impala is an antelope found in Africa.',
    '"Bob"\nBob Russellx wrote songs.',
]


@pytest.fixture(scope="module")
def nq_slice(tmp_path_factory):
    if not os.path.isfile(NQ_DEV):
        pytest.skip(f"{NQ_DEV} not found (real data lives in ../shared/data)")
    path = tmp_path_factory.mktemp("nq") / "dev.jsonl"
    with open(NQ_DEV, encoding="utf-8") as f:
        path.write_text("".join(next(f) for _ in range(12)), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("wiki") / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "contents": c}) + "\n" for i, c in enumerate(PASSAGES)))
    return str(path)


def test_answer_finder_matches_whole_normalised_words():
    finder = prep.AnswerFinder(PASSAGES)
    assert finder.contains("December 1972") and finder.contains("the MOON landing")
    assert finder.contains("Madhya Pradesh")
    assert not finder.contains("14 December 1972 UTC")
    assert not finder.contains("197") and not finder.contains("Bob Russell") and not finder.contains("Impalas")
    assert not finder.contains("") and not finder.contains("the")


def test_answerable_only_on_the_nq_slice(nq_slice, small_corpus, tmp_path):
    written = prep.convert(nq_slice, None, str(tmp_path), corpus=small_corpus, answerable_only=True, test_size=1)
    train, test = pd.read_parquet(written["train"]), pd.read_parquet(written["test"])
    questions = list(train["extra_info"].map(lambda e: e["question"])) + list(
        test["extra_info"].map(lambda e: e["question"])
    )
    assert sorted(questions) == [
        "when was the last time anyone was on the moon?",
        "which state is located in the centre of india?",
    ]


def test_rows_follow_the_verl_format_and_score(nq_slice, tmp_path):
    prep.main(["--input_file", nq_slice, "--local_dir", str(tmp_path), "--test_size", "3", "--train_size", "5"])
    train, test = pd.read_parquet(tmp_path / "train.parquet"), pd.read_parquet(tmp_path / "test.parquet")
    assert (len(train), len(test)) == (5, 3)
    with open(nq_slice) as f:
        source = {ex["question"] + "?": ex["answer"] for ex in map(json.loads, f)}
    for split, df in (("train", train), ("test", test)):
        assert list(df["extra_info"].map(lambda e: e["index"])) == list(range(len(df)))
        for row in df.to_dict("records"):
            question = row["extra_info"]["question"]
            assert row["extra_info"]["split"] == split and question in source
            assert row["data_source"] == "nq" and row["ability"] == "fact-reasoning"
            assert row["agent_name"] == "search_agent"
            # the instruction, the solved examples as earlier chat turns, then this question
            prompt = list(row["prompt"])
            assert prompt[0] == {"role": "system", "content": prep.PROTOCOL}
            assert prompt[-1] == {"role": "user", "content": f"Question: {question}"}
            assert [m["role"] for m in prompt[1:]] == ["user", "assistant"] * len(prep.EXAMPLES) + ["user"]
            for tag in ("<think>", "<search>", "</search>", "<information>", "<answer>", "</answer>"):
                assert tag in prompt[0]["content"]
            gt = row["reward_model"]["ground_truth"]
            assert row["reward_model"]["style"] == "rule" and list(gt["target"]) == source[question]
            # the parquet round trip (numpy arrays) still scores with the registered scorer
            answer = source[question][-1]
            assert default_compute_score("nq", f"<think>x</think><answer> {answer} </answer>", gt) == 1.0
            assert default_compute_score("nq", "<answer>surely wrong</answer>", gt) == 0.0
    assert not set(train["extra_info"].map(lambda e: e["question"])) & set(
        test["extra_info"].map(lambda e: e["question"])
    )


def test_the_demonstration_is_what_the_search_agent_produces():
    from hybridrl.agents.retrieval import format_passages
    from hybridrl.agents.search_agent import INFO_CLOSE, INFO_OPEN, STOP, parse_action

    prompt = prep.make_prompt("who sang yesterday?")
    assert len(prompt) == 2 + 2 * len(prep.EXAMPLES)
    for (question, query, passages, _, answer), user, assistant in zip(prep.EXAMPLES, prompt[1::2], prompt[2::2]):
        assert user == {"role": "user", "content": f"Question: {question}"}
        text = assistant["content"]
        # first turn: what the agent samples until its stop string, a search action
        first = text[: text.index(STOP[0]) + len(STOP[0])]
        assert parse_action(first) == ("search", query)
        # then the observation exactly as the agent appends it for these passages
        hits = [
            {"document": {"id": str(i), "contents": f'"{title}"\n{body}'}} for i, (title, body) in enumerate(passages)
        ]
        observation = INFO_OPEN + format_passages(hits).strip() + INFO_CLOSE
        assert text[len(first) :].startswith(observation)
        # then a turn that reasons and answers with the example's answer
        last = text[len(first) + len(observation) :]
        assert last.startswith("<think>") and "</think>" in last and parse_action(last) == ("answer", answer)
        assert normalize_answer(answer) in normalize_answer(" ".join(body for _, body in passages))


def test_examples_are_not_nq_questions_and_never_give_the_row_answer_away():
    if not os.path.isfile(NQ_DEV):
        pytest.skip(f"{NQ_DEV} not found")
    nq = {normalize_answer(ex["question"]) for ex in prep.read_jsonl(NQ_DEV)}
    assert not nq & {normalize_answer(q) for q, *_ in prep.EXAMPLES}
    # a data set that holds an example's question: that example is left out of its row's prompt
    question, _, _, _, answer = prep.EXAMPLES[1]
    row = prep.make_row(question.upper().rstrip("?"), [answer], "train", 0)
    shown = [m["content"] for m in row["prompt"][1:-1]]
    assert len(shown) == 2 * (len(prep.EXAMPLES) - 1) and not any(answer in text for text in shown)
    assert row["prompt"][-1]["content"] == f"Question: {question.upper()}"


def test_no_example_gives_the_plain_instruction(nq_slice, tmp_path):
    prep.main(["--input_file", nq_slice, "--local_dir", str(tmp_path), "--test_size", "2", "--no_example"])
    for split in ("train", "test"):
        for row in pd.read_parquet(tmp_path / f"{split}.parquet").to_dict("records"):
            question = row["extra_info"]["question"]
            assert list(row["prompt"]) == [{"role": "user", "content": prep.INSTRUCTION.format(question=question)}]
            assert row["prompt"][0]["content"].endswith(f"Question: {question}\n")
            assert not any(q in row["prompt"][0]["content"] for q, *_ in prep.EXAMPLES)


def test_nq_prompts_fit_the_example_script_prompt_length(tokenizer):
    """examples/run_search_agent.sh feeds NQ-open dev rows; the trainer rejects longer prompts."""
    if not os.path.isfile(NQ_DEV):
        pytest.skip(f"{NQ_DEV} not found")
    with open(os.path.join(REPO, "examples", "run_search_agent.sh"), encoding="utf-8") as f:
        [limit] = [int(v) for v in re.findall(r"data\.max_prompt_length=(\d+)", f.read())]
    chats = [prep.make_row(ex["question"], ex["answers"], "train", 0)["prompt"] for ex in prep.read_jsonl(NQ_DEV)]
    texts = tokenizer.apply_chat_template(chats, add_generation_prompt=True, tokenize=False)
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    assert max(lengths) <= limit
    assert min(lengths) > limit // 2  # the demonstration is there (the plain prompt is < 170 tokens)


def test_split_is_seeded(nq_slice, tmp_path):
    def test_questions(seed, out):
        prep.convert(nq_slice, None, str(tmp_path / out), test_size=4, seed=seed)
        return list(pd.read_parquet(tmp_path / out / "test.parquet")["extra_info"].map(lambda e: e["question"]))

    assert test_questions(0, "a") == test_questions(0, "b")
    assert test_questions(0, "a") != test_questions(1, "c")


def test_input_dir_with_train_and_dev_files(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.jsonl").write_text(
        '{"question": "q1", "golden_answers": ["a1"]}\n{"question": "q2?", "answer": "a2"}\n'
    )
    (src / "dev.jsonl").write_text('{"question": "q3", "answer": ["a3", "b3"]}\n')
    written = prep.convert(None, str(src), str(tmp_path / "out"), data_source="hotpotqa")
    train, test = pd.read_parquet(written["train"]), pd.read_parquet(written["test"])
    assert list(train["extra_info"].map(lambda e: e["question"])) == ["q1?", "q2?"]
    assert [list(gt["target"]) for gt in train["reward_model"].map(lambda r: r["ground_truth"])] == [["a1"], ["a2"]]
    assert list(test["data_source"]) == ["hotpotqa"] and list(test["reward_model"][0]["ground_truth"]["target"]) == [
        "a3",
        "b3",
    ]


def test_answerable_filter_on_the_real_corpus_agrees_with_brute_force():
    if not (os.path.isfile(NQ_DEV) and os.path.isfile(WIKI)):
        pytest.skip("../shared/data not found")
    examples = prep.read_jsonl(NQ_DEV)[:60]
    kept = prep.filter_answerable(examples, prep.answer_finder(WIKI))
    with open(WIKI, encoding="utf-8") as f:
        haystack = "\n".join(f" {normalize_answer(json.loads(line)['contents'])} " for line in f)
    expected = [
        ex
        for ex in examples
        if any(normalize_answer(a) and f" {normalize_answer(a)} " in haystack for a in ex["answers"])
    ]
    assert kept == expected and 0 < len(kept) < len(examples)


def test_errors(nq_slice, tmp_path, monkeypatch):
    with pytest.raises(DataError, match="--answerable_only needs --corpus"):
        prep.convert(nq_slice, None, str(tmp_path), answerable_only=True)
    with pytest.raises(DataError, match="not both"):
        prep.convert(nq_slice, str(tmp_path), str(tmp_path))
    with pytest.raises(DataError, match="--test_size 12: the input has only 12"):
        prep.convert(nq_slice, None, str(tmp_path), test_size=12)
    with pytest.raises(DataError, match="no train.jsonl, test.jsonl or dev.jsonl"):
        prep.convert(None, str(tmp_path), str(tmp_path))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": []}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:1: expected"):
        prep.read_jsonl(str(bad))
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed: no hub access in tests
    with pytest.raises(SystemExit, match="search_r1 preprocess: error: the `datasets` library is not installed"):
        prep.main(["--local_dir", str(tmp_path)])
    assert TASKS["search_r1"] == "hybridrl.agents.search_r1_data"
