"""Tools: the verl-format YAML loader, the GSM8K answer checker, the calculator, the search tool;
interactions: the loader and the GSM8K teacher."""

import asyncio
import textwrap
import time

import pytest

pytest.importorskip("pydantic")  # tool schemas are pydantic models (the agents extra)

from hybridrl.agents.errors import AgentConfigError
from hybridrl.agents.interactions import load_interactions
from hybridrl.agents.interactions.gsm8k import CORRECT, INCORRECT
from hybridrl.agents.retrieval import RetrieverError
from hybridrl.agents.tools import load_tools
from hybridrl.agents.tools.gsm8k import NO_PROGRESS_PENALTY, CalculatorTool, Gsm8kTool
from hybridrl.agents.tools.search import SearchTool


def run(coro):
    return asyncio.run(coro)


VERL_GSM8K_CONFIG = """
tools:
  - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
    config: {type: native}
    tool_schema:
      type: "function"
      function:
        name: "calc_gsm8k_reward"
        description: "A tool for calculating the reward of gsm8k."
        parameters:
          type: "object"
          properties:
            answer: {type: "string", description: "The model's answer to the GSM8K math problem"}
          required: ["answer"]
  - class_name: calculator
"""


def write(tmp_path, text, name="tools.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_a_verl_tool_config_loads_unchanged(tmp_path):
    tools = load_tools(write(tmp_path, VERL_GSM8K_CONFIG))
    assert sorted(tools) == ["calc_gsm8k_reward", "calculator"]
    assert isinstance(tools["calc_gsm8k_reward"], Gsm8kTool) and isinstance(tools["calculator"], CalculatorTool)
    schema = tools["calc_gsm8k_reward"].get_openai_tool_schema().model_dump()
    assert schema["function"]["parameters"]["required"] == ["answer"]
    assert tools["calculator"].get_openai_tool_schema().function.name == "calculator"  # the class default


@pytest.mark.parametrize(
    "text, expected",
    [
        ("tools: [", "not valid YAML"),
        ("something: []", "expected a top-level 'tools:' list"),
        ("tools:\n  - config: {}", "each entry needs a class_name"),
        ("tools:\n  - class_name: no.such.Tool", "is not a BaseTool subclass"),
        ("tools:\n  - class_name: collections.OrderedDict", "is not a BaseTool subclass"),
        ("tools:\n  - class_name: calculator\n  - class_name: calculator", "a second tool named 'calculator'"),
        (
            "tools:\n  - class_name: calculator\n    tool_schema: {type: function, function: {description: x}}",
            "bad tool_schema at function.name",
        ),
    ],
)
def test_bad_tool_configs_are_one_line_errors_naming_the_key(tmp_path, text, expected):
    with pytest.raises(AgentConfigError) as err:
        load_tools(write(tmp_path, text))
    msg = str(err.value)
    assert "tool_config_path=" in msg and expected in msg and "\n" not in msg


def test_a_missing_tool_config_file(tmp_path):
    with pytest.raises(AgentConfigError, match="file not found"):
        load_tools(str(tmp_path / "nope.yaml"))


def test_gsm8k_tool_scores_the_last_answer_and_penalises_no_progress():
    tool = Gsm8kTool()

    async def episode():
        iid = await tool.create(ground_truth="72")
        first = await tool.execute(iid, {"answer": "70"})
        second = await tool.execute(iid, {"answer": "72"})
        third = await tool.execute(iid, {"answer": "#### 72"})
        reward = await tool.calc_reward(iid)
        await tool.release(iid)
        return first, second, third, reward

    first, second, third, reward = run(episode())
    assert first == ("Current parsed answer='#### 70' reward=0.0", NO_PROGRESS_PENALTY, {})
    assert second == ("Current parsed answer='#### 72' reward=1.0", 0.0, {})
    assert third[1] == NO_PROGRESS_PENALTY  # right again, but no better than before
    assert reward == 1.0 and tool._instances == {}


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("(48 + 24) / 2", "36"),
        ("7 / 2", "3.5"),
        ("2 ** 10 - 24", "1000"),
        ("10 // 3 + 10 % 3", "4"),
    ],
)
def test_calculator_evaluates_arithmetic(expression, expected):
    assert run(CalculatorTool().execute("x", {"expression": expression}))[0] == expected


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').getcwd()",
        "x + 1",
        "1 / 0",
        "9 ** 9 ** 9",
        "'a' * 3",
        "1 +",
        "10**4000000 * 10**4000000",
        "2 ** 4097",
        "1 < 2",
        "1 << 99999999",
    ],
)
def test_calculator_refuses_what_is_not_safe_arithmetic(expression):
    """Including work that would hold the event loop: integers are bounded before they are computed."""
    started = time.process_time()
    text, reward, metrics = run(CalculatorTool().execute("x", {"expression": expression}))
    assert text.startswith("Error:") and metrics == {"error": 1}
    assert time.process_time() - started < 0.5  # 10**4000000 * 10**4000000 alone took 24 s unbounded


def test_calculator_computes_up_to_its_bound():
    assert run(CalculatorTool().execute("x", {"expression": "2 ** 4096"}))[0] == str(2**4096)


class FailingRetriever:
    def __init__(self, delay_s=0.0):
        self.delay_s = delay_s

    def retrieve(self, queries, topk):
        if self.delay_s:
            import time

            time.sleep(self.delay_s)
            return [[] for _ in queries]
        raise RetrieverError("retriever http://127.0.0.1:1/retrieve is not reachable (ConnectionError)")


def test_search_tool_formats_passages_search_r1_style(bm25_retriever):
    tool = SearchTool(config={"topk": 1})
    tool.set_default_retriever(lambda: bm25_retriever)
    text, _, metrics = run(tool.execute("x", {"query_list": ["capital of France", "highest mountain"]}))
    assert text.splitlines() == [
        'Doc 1(Title: "Paris") Paris is the capital and largest city of France.',
        'Doc 1(Title: "Mount Everest") Mount Everest is the highest mountain above sea level.',
    ]
    assert metrics == {}


def test_search_tool_failures_are_error_responses(corpus_file):
    down = SearchTool(config={})
    down.set_default_retriever(FailingRetriever)
    text, _, metrics = run(down.execute("x", {"query_list": ["Nile"]}))
    assert text.startswith("Error: the search engine failed") and metrics == {"search_error": 1}
    slow = SearchTool(config={"timeout": 0.05})
    slow.set_default_retriever(lambda: FailingRetriever(delay_s=0.5))
    text, _, metrics = run(slow.execute("x", {"query_list": ["Nile"]}))
    assert "did not answer within 0.05 s" in text and metrics == {"search_error": 1}
    stuck = SearchTool(config={"timeout": 0.1})
    stuck.set_default_retriever(lambda: FailingRetriever(delay_s=20))
    started = time.perf_counter()  # the event loop closes without waiting for the stuck thread
    assert "did not answer within 0.1 s" in run(stuck.execute("x", {"query_list": ["Nile"]}))[0]
    assert time.perf_counter() - started < 5
    assert run(down.execute("x", {"query_list": []}))[0].startswith("Error: give at least one")
    own = SearchTool(config={"corpus_path": corpus_file, "topk": 2})  # its own in-process index
    assert run(own.execute("x", {"query_list": ["river Africa"]}))[0].startswith('Doc 1(Title: "Nile")')


# ---------------------------------------------------------------- interactions


def test_interaction_config_and_the_gsm8k_teacher(tmp_path):
    path = write(
        tmp_path,
        """
        interaction:
          - name: teacher
            class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction
            config: {}
        """,
        "interaction.yaml",
    )
    teacher = load_interactions(path)["teacher"]
    assert teacher.name == "teacher"

    async def episode():
        iid = await teacher.start_interaction(ground_truth="72", query="...")
        wrong = await teacher.generate_response(
            iid, [{"role": "user", "content": "q"}, {"role": "assistant", "content": "It is #### 70"}]
        )
        right = await teacher.generate_response(iid, [{"role": "assistant", "content": "So #### 72"}])
        score = await teacher.calculate_score(iid)
        await teacher.finalize_interaction(iid)
        return wrong, right, score

    wrong, right, score = run(episode())
    assert wrong == (False, INCORRECT, 0.0, {}) and right == (True, CORRECT, 1.0, {}) and score == 1.0


def test_bad_interaction_configs(tmp_path):
    with pytest.raises(AgentConfigError, match="interaction_config_path=.*each entry needs a class_name"):
        load_interactions(write(tmp_path, "interaction:\n  - name: x", "i.yaml"))
    with pytest.raises(AgentConfigError, match="config.method='fuzzy'"):
        load_interactions(write(tmp_path, "interaction:\n  - class_name: gsm8k\n    config: {method: fuzzy}", "j.yaml"))
