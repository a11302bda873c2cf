"""Helpers of the agent tests: a scripted generation engine, a tiny passage corpus, a context."""

import json

import pytest

from hybridrl.agents.base import AgentContext
from tests.tiny_models import ppo_section

CORPUS = [
    {"id": "1", "contents": '"Paris"\nParis is the capital and largest city of France.'},
    {"id": "2", "contents": '"Berlin"\nBerlin is the capital and largest city of Germany.'},
    {"id": "3", "contents": '"Mount Everest"\nMount Everest is the highest mountain above sea level.'},
    {"id": "4", "contents": '"Nile"\nThe Nile is a major river in northeastern Africa.'},
]


class ScriptedEngine:
    """Stands in for AsyncBatchEngine: each ``generate`` returns the next scripted turn (ids),
    cut to ``max_new_tokens``, and records what the loop asked for."""

    def __init__(self, turns):
        self.turns = list(turns)
        self.calls = []  # (context ids, max_new_tokens, stop)

    async def generate(self, prompt_ids, sampling_params, max_new_tokens, stop=None):
        self.calls.append((list(prompt_ids), max_new_tokens, stop))
        assert self.turns, "the loop asked for more turns than scripted"
        return list(self.turns.pop(0))[:max_new_tokens]


@pytest.fixture
def scripted():
    """The ScriptedEngine class."""
    return ScriptedEngine


@pytest.fixture
def turn(tokenizer):
    """``turn(text, eos=True)``: ids of a model turn, plus EOS when the turn ended with it."""

    def make(text, eos=True):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids + [tokenizer.eos_token_id] if eos else ids

    return make


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in CORPUS))
    return str(path)


@pytest.fixture(scope="session")
def bm25_retriever(corpus_file):
    from hybridrl.agents.retrieval import make_retriever

    return make_retriever(corpus_path=corpus_file)


@pytest.fixture
def make_context(tokenizer):
    def make(
        engine, response_length=200, tools=None, interactions=None, retriever_impl=None, retriever=None, **multi_turn
    ):
        # the multi_turn section as the run has it: these knobs, the top-level `retriever`, the rest defaults
        section = ppo_section("actor_rollout_ref.rollout.multi_turn", multi_turn, others={"retriever": retriever or {}})
        return AgentContext(
            engine=engine,
            tokenizer=tokenizer,
            response_length=response_length,
            multi_turn=section,
            tools=tools or {},
            interactions=interactions or {},
            get_retriever=(lambda: retriever_impl),
        )

    return make
