"""The agent loops on a scripted engine: token-exact responses, exact masks, turn limits,
tool errors, interactions, Search-R1's protocol and retriever failures."""

import asyncio
import time

import pytest

from hybridrl.agents.base import ResponseBuilder, get_agent_loop_cls
from hybridrl.agents.chat import ChatTurnEncoder, render_prompt_ids, tool_instructions
from hybridrl.agents.errors import AgentConfigError, AgentToolError
from hybridrl.agents.interactions.gsm8k import INCORRECT, Gsm8kInteraction
from hybridrl.agents.search_agent import INFO_CLOSE, INFO_OPEN, INVALID_ACTION, STOP
from hybridrl.agents.tools.base import BaseTool
from hybridrl.agents.tools.gsm8k import Gsm8kTool
from hybridrl.agents.tools.loop import run_on_tool_loop

MESSAGES = [
    {"role": "system", "content": "You are a math expert."},
    {"role": "user", "content": "Natalia sold 48 clips in April and half as many in May. How many in all?"},
]
CALL = '<tool_call>\n{"name": "calc_gsm8k_reward", "arguments": {"answer": "72"}}\n</tool_call>'
ROW = {
    "raw_prompt_ids": [1, 2, 3],
    "raw_prompt": MESSAGES,
    "tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72"}, "execute_kwargs": None}},
    "interaction_kwargs": {"query": "...", "ground_truth": "72"},
}


def run_loop(name, context, row, sampling=None):
    return asyncio.run(get_agent_loop_cls(name)(context).run(sampling or {}, **row))


def ids_of(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_response_builder_keeps_room_for_a_model_token_after_an_observation():
    r = ResponseBuilder(6)
    assert r.add_model([1, 2]) == [1, 2]
    assert not r.add_observation([7, 7, 7, 7])  # would leave no room for the model: refused
    assert r.add_observation([7, 7, 7])
    assert r.add_model([3, 4, 5]) == [3]  # cut at the budget
    assert (r.ids, r.mask, r.room) == ([1, 2, 7, 7, 7, 3], [1, 1, 0, 0, 0, 1], 0)


# ---------------------------------------------------------------- tool_agent


def test_tool_call_round_trip_is_token_exact(tokenizer, scripted, turn, make_context):
    t1, t2 = turn(f"Let me check. {CALL}"), turn("The answer is #### 72")
    engine = scripted([t1, t2])
    out = run_loop("tool_agent", make_context(engine, tools={"calc_gsm8k_reward": Gsm8kTool()}), ROW)
    tool_msg = [{"role": "tool", "content": "Current parsed answer='#### 72' reward=1.0"}]
    obs = ChatTurnEncoder(tokenizer).encode(tool_msg, t1)
    assert tokenizer.decode(obs) == (
        "\n<|im_start|>tool\nCurrent parsed answer='#### 72' reward=1.0<|im_end|>\n<|im_start|>assistant\n"
    )
    assert out.response_ids == t1 + obs + t2
    assert out.response_mask == [1] * len(t1) + [0] * len(obs) + [1] * len(t2)
    # the prompt carries the tool schema; the second turn sees exactly prompt + turn 1 + observation
    assert out.prompt_ids == render_prompt_ids(tokenizer, MESSAGES, [Gsm8kTool().tool_schema.model_dump()])
    assert "calc_gsm8k_reward" in tokenizer.decode(out.prompt_ids)
    assert engine.calls[1][0] == out.prompt_ids + t1 + obs
    assert (out.num_turns, out.metrics["tool_calls"], out.metrics["tool_errors"]) == (4, 1, 0)
    assert out.reward_scores == {"calc_gsm8k_reward": 1.0}
    # decoding the ids gives the chat template's own rendering of the whole conversation
    conversation = [
        {
            **MESSAGES[0],
            "content": MESSAGES[0]["content"] + "\n\n" + tool_instructions([Gsm8kTool().tool_schema.model_dump()]),
        },
        MESSAGES[1],
        {"role": "assistant", "content": f"Let me check. {CALL}"},
        *tool_msg,
        {"role": "assistant", "content": "The answer is #### 72"},
    ]
    expected = tokenizer.apply_chat_template(conversation, tokenize=False)
    assert tokenizer.decode(out.prompt_ids + out.response_ids) + "\n" == expected


@pytest.mark.parametrize(
    "call, expected, parsed_calls",
    [
        (
            '<tool_call>{"name": "calc_gsm8k_reward", "arguments": {answer: 72}}</tool_call>',
            "Error: the tool call is not valid JSON",
            0,
        ),
        ('<tool_call>{"name": "python", "arguments": {}}</tool_call>', "Error: unknown tool 'python'", 0),
        (
            '<tool_call>{"name": "calc_gsm8k_reward", "arguments": {"answer": 72}}</tool_call>',
            "Error: invalid arguments for calc_gsm8k_reward: 72 is not of type 'string'",
            1,
        ),
        ('<tool_call>{"name": "calc_gsm8k_reward", "arguments": {}}</tool_call>', "'answer' is a required property", 1),
    ],
)
def test_bad_calls_get_an_error_response_and_the_episode_goes_on(
    tokenizer, scripted, turn, make_context, call, expected, parsed_calls
):
    t1, t2 = turn(call), turn("#### 72")
    engine = scripted([t1, t2])
    out = run_loop("tool_agent", make_context(engine, tools={"calc_gsm8k_reward": Gsm8kTool()}), ROW)
    obs = out.response_ids[len(t1) : len(out.response_ids) - len(t2)]
    assert expected in tokenizer.decode(obs)
    assert out.metrics["tool_errors"] == 1 and out.metrics["tool_calls"] == parsed_calls
    assert out.reward_scores == {"calc_gsm8k_reward": 0.0}  # nothing valid was checked


def test_calls_over_max_parallel_calls_are_not_run(tokenizer, scripted, turn, make_context):
    t1 = turn(CALL.replace("72", "70") + CALL)
    out = run_loop(
        "tool_agent",
        make_context(scripted([t1, turn("done")]), tools={"calc_gsm8k_reward": Gsm8kTool()}, max_parallel_calls=1),
        ROW,
    )
    text = tokenizer.decode(out.response_ids)
    assert "answer='#### 70'" in text and "answer='#### 72'" not in text and "at most 1 tool call(s)" in text
    assert out.reward_scores == {"calc_gsm8k_reward": 0.0}  # the answer it checked, 70, is wrong


class SlowTool(BaseTool):
    DEFAULT_SCHEMA = {"type": "function", "function": {"name": "slow"}}

    async def execute(self, instance_id, parameters, **kwargs):
        await asyncio.sleep(1.0)
        return "late", 0.0, {}


def test_a_tool_that_times_out_is_an_error_response(tokenizer, scripted, turn, make_context):
    t1 = turn('<tool_call>{"name": "slow", "arguments": {}}</tool_call>')
    out = run_loop(
        "tool_agent",
        make_context(scripted([t1, turn("ok")]), tools={"slow": SlowTool({"timeout": 0.05})}),
        {**ROW, "tools_kwargs": None},
    )
    assert "Error: slow did not answer within 0.05 s" in tokenizer.decode(out.response_ids)
    assert out.metrics["tool_errors"] == 1


BLOCK_S = 1.25  # how long BlockingTool blocks: the errors below come within its 0.2 s timeouts, long before


class BlockingTool(BaseTool):
    """Blocks its event loop (time.sleep, not await asyncio.sleep) in the phase it is given."""

    DEFAULT_SCHEMA = {"type": "function", "function": {"name": "blocking"}}

    def __init__(self, phase, block_s=BLOCK_S):
        super().__init__({"timeout": 0.2})
        self.phase, self.block_s = phase, block_s

    def _maybe_block(self, phase):
        if phase == self.phase:
            time.sleep(self.block_s)

    async def create(self, instance_id=None, **kwargs):
        self._maybe_block("create")
        return await super().create(instance_id, **kwargs)

    async def execute(self, instance_id, parameters, **kwargs):
        self._maybe_block("execute")
        return "done", 0.0, {}


def wait_until_the_tool_loop_is_free():
    """The blocked call runs on in the tools' thread; later tests must not queue behind it."""

    async def noop():
        return None

    asyncio.run(run_on_tool_loop(noop(), timeout_s=30, what="noop"))


def test_a_tool_that_blocks_the_event_loop_is_one_line_within_its_timeout(tokenizer, scripted, turn, make_context):
    t1 = turn('<tool_call>{"name": "blocking", "arguments": {}}</tool_call>')
    context = make_context(scripted([t1, turn("ok")]), tools={"blocking": BlockingTool("execute")})
    started = time.perf_counter()
    with pytest.raises(AgentToolError) as err:  # execute times out; calc_reward queues behind the blocked loop
        run_loop("tool_agent", context, {**ROW, "tools_kwargs": None})
    elapsed = time.perf_counter() - started
    wait_until_the_tool_loop_is_free()
    assert str(err.value).startswith(
        "tool 'blocking': its calc_reward did not finish within 0.2 s: the tools' "
        "event loop is still blocked by tool 'blocking': its execute, which overran"
    )
    assert elapsed < BLOCK_S - 0.25 and "\n" not in str(err.value)  # not waiting for the tool's block to end


def test_a_tool_whose_create_blocks_is_one_line_within_its_timeout(scripted, turn, make_context):
    context = make_context(scripted([turn("ok")]), tools={"blocking": BlockingTool("create")})
    started = time.perf_counter()
    with pytest.raises(
        AgentToolError,
        match=r"^tool 'blocking': its create did not finish within 0.2 s; make it "
        r"faster or raise the tool's config.timeout$",
    ):
        run_loop("tool_agent", context, {**ROW, "tools_kwargs": None})
    elapsed = time.perf_counter() - started
    wait_until_the_tool_loop_is_free()
    assert elapsed < BLOCK_S - 0.25


class LoopBoundTool(BaseTool):
    """Keeps an asyncio.Queue made in ``create``: usable only on the loop that made it."""

    DEFAULT_SCHEMA = {"type": "function", "function": {"name": "queue"}}

    async def create(self, instance_id=None, **kwargs):
        if not hasattr(self, "queue"):
            self.queue = asyncio.Queue()
        return await super().create(instance_id, **kwargs)

    async def execute(self, instance_id, parameters, **kwargs):
        await self.queue.put(instance_id)
        return f"queued {self.queue.qsize()}", 0.0, {}


def test_a_tool_keeps_loop_bound_state_across_steps(tokenizer, scripted, turn, make_context):
    tool = LoopBoundTool()  # each step runs its agent loops under a new asyncio.run
    for step in (1, 2):
        t1 = turn('<tool_call>{"name": "queue", "arguments": {}}</tool_call>')
        out = run_loop(
            "tool_agent", make_context(scripted([t1, turn("ok")]), tools={"queue": tool}), {**ROW, "tools_kwargs": None}
        )
        assert f"queued {step}" in tokenizer.decode(out.response_ids) and out.metrics["tool_errors"] == 0


class BrokenTool(Gsm8kTool):
    def __init__(self, phase):
        super().__init__({"name": "calc_gsm8k_reward"})
        self.phase = phase

    async def create(self, instance_id=None, **kwargs):
        if self.phase == "create":
            raise KeyError("ground_truth")
        return await super().create(instance_id, **kwargs)

    async def calc_reward(self, instance_id, **kwargs):
        if self.phase == "calc_reward":
            raise ValueError("no answer parsed")
        return await super().calc_reward(instance_id, **kwargs)


@pytest.mark.parametrize(
    "phase, error", [("create", "KeyError: 'ground_truth'"), ("calc_reward", "ValueError: no answer parsed")]
)
def test_a_tool_whose_create_or_calc_reward_raises_is_one_line(scripted, turn, make_context, phase, error):
    context = make_context(scripted([turn("ok")]), tools={"calc_gsm8k_reward": BrokenTool(phase)})
    with pytest.raises(
        AgentToolError, match=rf"tool 'calc_gsm8k_reward': its {phase} raised {error}; fix the tool"
    ) as err:
        run_loop("tool_agent", context, ROW)
    assert "\n" not in str(err.value)


def test_limits_end_the_episode(scripted, turn, make_context):
    tools = {"calc_gsm8k_reward": Gsm8kTool()}
    t1 = turn(CALL)
    out = run_loop("tool_agent", make_context(scripted([t1]), tools=tools, max_assistant_turns=1), ROW)
    assert out.response_ids == t1 and out.response_mask == [1] * len(t1)
    # the tool response does not fit with room for another model token: the episode ends on turn 1
    out = run_loop("tool_agent", make_context(scripted([t1]), response_length=len(t1) + 20, tools=tools), ROW)
    assert out.response_ids == t1 and out.metrics["tool_calls"] == 1
    # a long turn is cut at the budget, and nothing is appended after it
    out = run_loop("tool_agent", make_context(scripted([turn("word " * 50)]), response_length=10, tools=tools), ROW)
    assert len(out.response_ids) == 10 and out.response_mask == [1] * 10 and out.num_turns == 2
    # max_tokens_per_turn caps each turn
    engine = scripted([turn("word " * 50), turn("b")])
    run_loop("tool_agent", make_context(engine, tools=tools, max_tokens_per_turn=5), ROW)
    assert engine.calls[0][1] == 5


def test_interaction_gives_feedback_and_a_retry(tokenizer, scripted, turn, make_context):
    t1, t2 = turn("It is #### 70"), turn("Sorry, #### 72")
    context = make_context(scripted([t1, t2]), interactions={"gsm8k": Gsm8kInteraction({"name": "gsm8k"})})
    row = {**ROW, "interaction_kwargs": {"name": "gsm8k", "query": "...", "ground_truth": "72"}}
    out = run_loop("tool_agent", context, row)
    feedback = ChatTurnEncoder(tokenizer).encode([{"role": "user", "content": INCORRECT}], t1)
    assert out.response_ids == t1 + feedback + t2
    assert out.response_mask == [1] * len(t1) + [0] * len(feedback) + [1] * len(t2)
    assert out.reward_scores == {"interaction": 1.0} and out.num_turns == 4
    # the retries are bounded by max_user_turns
    context = make_context(
        scripted([t1, t1]), interactions={"gsm8k": Gsm8kInteraction({"name": "gsm8k"})}, max_user_turns=1
    )
    out = run_loop("tool_agent", context, row)
    assert out.reward_scores == {"interaction": 0.0} and out.num_turns == 4


def test_a_row_naming_an_unconfigured_interaction_is_a_config_error(scripted, make_context):
    row = {**ROW, "interaction_kwargs": {"name": "teacher"}}
    with pytest.raises(AgentConfigError, match="interaction 'teacher'.*interaction_config_path"):
        run_loop("tool_agent", make_context(scripted([])), row)


# ---------------------------------------------------------------- search_agent


def search_context(make_context, engine, retriever, **knobs):
    search = {"max_turns": knobs.pop("max_turns", 2), "max_obs_length": knobs.pop("max_obs_length", 256)}
    return make_context(
        engine,
        retriever_impl=retriever,
        search=search,
        retriever={"topk": 2, "timeout": knobs.pop("timeout", 5)},
        **knobs,
    )


def test_search_then_answer_is_token_exact(tokenizer, scripted, turn, make_context, bm25_retriever):
    t1 = turn("<think>I need to look it up.</think><search> capital of France </search>", eos=False)
    t2 = turn("<think>Paris.</think><answer> Paris </answer>", eos=False)
    engine = scripted([t1, t2])
    out = run_loop("search_agent", search_context(make_context, engine, bm25_retriever), {"raw_prompt_ids": [5, 6]})
    passages = (
        'Doc 1(Title: "Paris") Paris is the capital and largest city of France.\n'
        'Doc 2(Title: "Berlin") Berlin is the capital and largest city of Germany.'
    )
    obs = ids_of(tokenizer, INFO_OPEN) + ids_of(tokenizer, passages) + ids_of(tokenizer, INFO_CLOSE)
    assert tokenizer.decode(obs) == f"\n\n<information>{passages}</information>\n\n"
    assert out.response_ids == t1 + obs + t2
    assert out.response_mask == [1] * len(t1) + [0] * len(obs) + [1] * len(t2)
    assert engine.calls[1][0] == [5, 6] + t1 + obs and engine.calls[0][2] == STOP
    assert out.num_turns == 4
    assert {k: out.metrics[k] for k in ("assistant_turns", "valid_actions", "searches", "search_errors")} == {
        "assistant_turns": 2,
        "valid_actions": 2,
        "searches": 1,
        "search_errors": 0,
    }


def test_invalid_actions_and_the_last_turn_without_search(tokenizer, scripted, turn, make_context, bm25_retriever):
    t1 = turn("I am not sure what to do.")
    t2 = turn("<search> Nile </search>", eos=False)
    t3 = turn("<search> Everest </search>", eos=False)  # the last turn: not searched
    engine = scripted([t1, t2, t3])
    out = run_loop(
        "search_agent", search_context(make_context, engine, bm25_retriever, max_turns=2), {"raw_prompt_ids": [5]}
    )
    text = tokenizer.decode(out.response_ids)
    assert text.count(INVALID_ACTION) == 1 and text.count("<information>") == 1
    assert text.endswith("<search> Everest </search>") and out.response_mask[-1] == 1
    assert {k: out.metrics[k] for k in ("assistant_turns", "valid_actions", "searches")} == {
        "assistant_turns": 3,
        "valid_actions": 2,
        "searches": 1,
    }
    assert out.num_turns == 1 + 3 + 2


class BrokenRetriever:
    def __init__(self, delay_s=0.0):
        self.delay_s = delay_s

    def retrieve(self, queries, topk):
        from hybridrl.agents.retrieval import RetrieverError

        if self.delay_s:
            import time

            time.sleep(self.delay_s)
            return [[]]
        raise RetrieverError("retriever http://127.0.0.1:1/retrieve is not reachable (ConnectionError)")


@pytest.mark.parametrize("retriever, timeout", [(BrokenRetriever(), 5), (BrokenRetriever(delay_s=0.5), 0.05)])
def test_a_down_or_slow_retriever_gives_an_error_observation(
    tokenizer, scripted, turn, make_context, retriever, timeout
):
    t1, t2 = turn("<search> Nile </search>", eos=False), turn("<answer> Egypt </answer>", eos=False)
    out = run_loop(
        "search_agent",
        search_context(make_context, scripted([t1, t2]), retriever, timeout=timeout),
        {"raw_prompt_ids": [5]},
    )
    assert "<information>Search failed" in tokenizer.decode(out.response_ids)
    assert out.metrics["search_errors"] == 1 and out.metrics["searches"] == 1


def test_observations_are_cut_to_max_obs_length_with_their_tags(
    tokenizer, scripted, turn, make_context, bm25_retriever
):
    t1, t2 = turn("<search> capital city </search>", eos=False), turn("<answer> x </answer>", eos=False)
    out = run_loop(
        "search_agent",
        search_context(make_context, scripted([t1, t2]), bm25_retriever, max_obs_length=16),
        {"raw_prompt_ids": [5]},
    )
    obs = out.response_ids[len(t1) : len(out.response_ids) - len(t2)]
    assert len(obs) == 16 and out.response_mask.count(0) == 16
    assert obs[: len(ids_of(tokenizer, INFO_OPEN))] == ids_of(tokenizer, INFO_OPEN)
    assert obs[-len(ids_of(tokenizer, INFO_CLOSE)) :] == ids_of(tokenizer, INFO_CLOSE)
