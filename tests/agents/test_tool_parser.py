"""Hermes tool-call parsing: valid calls, malformed JSON, unknown tools, too many calls."""

from hybridrl.agents.tool_parser import parse_hermes_tool_calls

TOOLS = {"calc_gsm8k_reward", "search"}


def test_a_valid_call_is_parsed_and_removed_from_the_content():
    text = 'Let me check.\n<tool_call>\n{"name": "calc_gsm8k_reward", "arguments": {"answer": "72"}}\n</tool_call>'
    parsed = parse_hermes_tool_calls(text, known_tools=TOOLS)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("calc_gsm8k_reward", {"answer": "72"})]
    assert parsed.errors == [] and parsed.attempted
    assert parsed.content == "Let me check.\n"


def test_arguments_given_as_a_json_string_are_accepted():
    text = '<tool_call>{"name": "search", "arguments": "{\\"query_list\\": [\\"Nile\\"]}"}</tool_call>'
    parsed = parse_hermes_tool_calls(text, known_tools=TOOLS)
    assert parsed.calls[0].arguments == {"query_list": ["Nile"]}


def test_no_tool_call_is_no_attempt():
    parsed = parse_hermes_tool_calls("The answer is #### 72", known_tools=TOOLS)
    assert parsed.calls == [] and parsed.errors == [] and not parsed.attempted
    assert parsed.content == "The answer is #### 72"


def test_malformed_json_is_an_error_not_a_call():
    parsed = parse_hermes_tool_calls('<tool_call>{"name": "search", "arguments": {query: 1}}</tool_call>', TOOLS)
    assert parsed.calls == [] and parsed.attempted
    assert len(parsed.errors) == 1 and "not valid JSON" in parsed.errors[0]


def test_wrong_shapes_are_errors():
    bodies = [
        '["search"]',
        '{"arguments": {}}',
        '{"name": "search", "arguments": [1, 2]}',
        '{"name": "search", "arguments": "not json"}',
    ]
    for body in bodies:
        parsed = parse_hermes_tool_calls(f"<tool_call>{body}</tool_call>", TOOLS)
        assert parsed.calls == [] and len(parsed.errors) == 1, body


def test_unknown_tool_is_an_error_naming_the_available_ones():
    parsed = parse_hermes_tool_calls('<tool_call>{"name": "python", "arguments": {}}</tool_call>', TOOLS)
    assert parsed.calls == []
    assert "unknown tool 'python'" in parsed.errors[0] and "calc_gsm8k_reward, search" in parsed.errors[0]
    # without a list of known tools every name is accepted
    assert parse_hermes_tool_calls('<tool_call>{"name": "python", "arguments": {}}</tool_call>').calls


def test_calls_over_the_limit_are_dropped_with_one_error():
    text = "".join(
        f'<tool_call>{{"name": "search", "arguments": {{"query_list": ["q{i}"]}}}}</tool_call>' for i in range(3)
    )
    parsed = parse_hermes_tool_calls(text, TOOLS, max_calls=2)
    assert [c.arguments["query_list"] for c in parsed.calls] == [["q0"], ["q1"]]
    assert parsed.errors == ["at most 2 tool call(s) run per turn; the last 1 were not run"]


def test_good_and_bad_blocks_in_one_turn_and_an_unclosed_tag():
    text = (
        '<tool_call>{"name": "search", "arguments": {"query_list": ["a"]}}</tool_call>'
        '<tool_call>{oops}</tool_call> and <tool_call>{"name": "search"'
    )
    parsed = parse_hermes_tool_calls(text, TOOLS)
    assert [c.name for c in parsed.calls] == ["search"]
    assert len(parsed.errors) == 2
    assert "not valid JSON" in parsed.errors[0] and "not closed" in parsed.errors[1]
