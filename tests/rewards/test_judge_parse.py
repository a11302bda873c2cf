"""LLM-judge rewards without a model: the score parser, the prompt template, the settings checks."""

import re

import pytest

from hybridrl.errors import ConfigError
from hybridrl.rewards.custom import RewardConfigError
from hybridrl.rewards.judge import (
    DEFAULT_TEMPLATE,
    DEFAULT_TEMPLATE_WITH_REFERENCE,
    JudgeParseError,
    JudgePromptError,
    JudgeSettings,
    load_score_parser,
    load_template,
    parse_score,
    render_template,
)
from tests.tiny_models import ppo_config_with


@pytest.mark.parametrize(
    "text, score, number",
    [
        ("Score: 7", 0.7, 7),
        ("score = 3", 0.3, 3),
        ("The score is 4", 0.4, 4),
        ("Rating: **6**", 0.6, 6),
        ("grade: 9.5", 0.95, 9.5),
        ("Score:8.", 0.8, 8),
        (" 9.5", 0.95, 9.5),  # after a response prefix "Score:"
        ("<score>8</score>", 0.8, 8),
        ("<SCORE> 3/5 </SCORE>", 0.6, 3),  # a fraction is read as one
        ("I would give it 7/10.", 0.7, 7),
        ("Your rating is 0 out of 10.", 0.0, 0),
        ("Score: 5 (out of 10)", 0.5, 5),
        ("Score: 10\nRating: Very High", 1.0, 10),  # a label without a number is skipped
        ("First thoughts: 2 issues. <score>9</score>", 0.9, 9),  # the tag wins over other numbers
        ("Score: 2 at first, but on reflection Score: 8", 0.8, 8),  # the last verdict counts
        ("It is mostly right, so 6", 0.6, 6),  # the last number, when nothing else matches
        ("Score: 0", 0.0, 0),
        ("Score: 10", 1.0, 10),
    ],
)
def test_default_parser_reads_many_formats(text, score, number):
    got, raw = parse_score(text)
    assert got == pytest.approx(score) and raw == pytest.approx(number)


@pytest.mark.parametrize(
    "text, message",
    [
        ("no number here", "no score in the judge's answer 'no number here'"),
        ("Score: 11", "outside reward_model.judge.score_range [0, 10]"),
        ("Score: -1", "outside"),
        ("7 + 5 = 12.", "the score 12"),
        ("score: 1e5", "outside"),
        ("<score>6/5</score>", "not a fraction between 0 and 1"),
        ("", "no score"),
    ],
)
def test_unusable_answers_raise_one_line(text, message):
    with pytest.raises(JudgeParseError, match=re.escape(message)) as err:
        parse_score(text)
    assert "\n" not in str(err.value)


def test_long_answers_are_shortened_in_the_message():
    with pytest.raises(JudgeParseError) as err:
        parse_score("blah " * 200)
    assert len(str(err.value)) < 200


def test_score_range_scales_bare_numbers():
    assert parse_score("Score: 3", (1, 5)) == (pytest.approx(0.5), 3)
    assert parse_score("Score: 1", (1, 5))[0] == 0.0
    assert parse_score("Score: 4/8", (1, 5))[0] == 0.5  # fractions ignore the range
    with pytest.raises(JudgeParseError, match=r"\[1, 5\]"):
        parse_score("Score: 0", (1, 5))


def test_custom_pattern_takes_group_score_or_group_one_and_its_last_match():
    assert parse_score("Final grade: 2 ... Final grade: 4", (1, 5), r"Final grade: (\d+)") == (0.75, 4)
    assert parse_score("x 3 y 5", (0, 10), r"(?P<score>\d) y") == (0.3, 3)
    with pytest.raises(JudgeParseError, match="does not match"):
        parse_score("Score: 7", (0, 10), r"Final grade: (\d+)")
    with pytest.raises(JudgeParseError, match="not a number"):
        parse_score("grade: A", (0, 10), r"grade: (\w)")


# ---------------------------------------------------------------- templates


def test_template_renders_fields_and_extra_info_keys():
    text = render_template(
        "Q={question} P={prompt} R={response} G={ground_truth} D={data_source} E={extra_info[topic]} {{literal}}",
        response="r",
        prompt="p",
        question="q",
        ground_truth=42,
        data_source="ds",
        extra_info={"topic": "math"},
    )
    assert text == "Q=q P=p R=r G=42 D=ds E=math {literal}"
    assert render_template("{question}|{response}", response="r", prompt="p") == "p|r"  # question falls back


def test_default_template_has_a_reference_section_only_with_a_ground_truth():
    with_ref = render_template(None, response="Paris", prompt="Capital of France?", ground_truth="Paris")
    assert with_ref == DEFAULT_TEMPLATE_WITH_REFERENCE.format(
        question="Capital of France?", ground_truth="Paris", response="Paris"
    )
    for missing in (None, "", "  "):
        plain = render_template(None, response="Paris", prompt="Capital of France?", ground_truth=missing)
        assert plain == DEFAULT_TEMPLATE.format(question="Capital of France?", response="Paris")


def test_a_row_without_what_the_template_reads_fails_alone():
    with pytest.raises(JudgePromptError, match=r"uses \{ground_truth\} but this row has none"):
        render_template("{response} vs {ground_truth}", response="r", prompt="p", ground_truth=None)
    with pytest.raises(JudgePromptError, match="'topic'"):
        render_template("{response} {extra_info[topic]}", response="r", prompt="p", extra_info={})


@pytest.mark.parametrize(
    "template, message",
    [
        ("Grade this.", "has no {response} field"),
        ("{response} {answer}", "unknown field {answer}"),
        ("{response} {0}", "unknown field {0}"),
        ("{response} {", "write {{ and }} for literal braces"),
        ("judge/template.txt", "no such file"),
        (42, "must be a str.format template"),
    ],
)
def test_bad_templates_are_one_line_errors_naming_the_key(template, message):
    with pytest.raises(RewardConfigError) as err:
        load_template(template)
    assert "reward_model.judge.prompt_template" in str(err.value) and message in str(err.value)
    assert "\n" not in str(err.value)


def test_template_from_a_file(tmp_path):
    path = tmp_path / "judge.txt"
    path.write_text("Answer: {response}\nScore it.")
    assert load_template(str(path)) == "Answer: {response}\nScore it."
    path.write_text("no field")
    with pytest.raises(RewardConfigError, match=r"\(the file\): the template has no \{response\}"):
        load_template(str(path))
    assert load_template(None) is None and load_template("") is None


# ---------------------------------------------------------------- settings and the parser file


def _config(**judge):
    """The PPO config as the run reads it, with these judge settings."""
    rollout = {"name": "hf", "prompt_length": 512, "response_length": 16}
    rollout.update(judge.pop("rollout", {}))
    return ppo_config_with(
        {
            "reward_model": {
                "enable": judge.pop("enable", False),
                "model": {"path": judge.pop("path", "m")},
                "rollout": rollout,
                "judge": judge,
            },
            "custom_reward_function": {"path": judge.pop("custom", None)},
        }
    )


def test_settings_defaults():
    s = JudgeSettings.from_config(_config())
    assert (s.model_path, s.template, s.score_range, s.timeout_s, s.apply_chat_template) == (
        "m",
        None,
        (0, 10),
        600,
        True,
    )
    assert s.rollout["response_length"] == 16


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"path": ""}, "needs reward_model.model.path"),  # a string key: unset is ""
        ({"enable": True}, "set reward_model.enable=false"),
        ({"custom": "my_reward.py"}, "custom_reward_function.path is set"),
        ({"rollout": {"response_length": 0}}, "reward_model.rollout.response_length=0 must be an integer >= 1"),
        ({"rollout": {"tensor_model_parallel_size": 2}}, "tensor_model_parallel_size > 1 is not supported"),
        ({"timeout_s": 0}, "reward_model.judge.timeout_s=0 must be a number of seconds > 0"),
        ({"score_range": [10, 0]}, "reward_model.judge.score_range=[10, 0] must be two numbers"),
        ({"score_range": [0]}, "score_range=[0]"),
        ({"score_pattern": "Score: ("}, "is not a valid regular expression"),
        ({"score_pattern": r"Score: \d+"}, "captures nothing"),
        ({"prompt_template": "Rate it."}, "has no {response} field"),
        ({"score_parser": {"path": "/nonexistent/parse.py"}}, "reward_model.judge.score_parser.path"),
    ],
)
def test_bad_settings_are_one_line_errors(changes, message):
    with pytest.raises(RewardConfigError) as err:
        JudgeSettings.from_config(_config(**changes))
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"rollout": {"prompt_length": "long"}}, "reward_model.rollout.prompt_length: Value 'long'"),
        ({"score_range": [0, "ten"]}, "reward_model.judge.score_range[1]: Value 'ten'"),
    ],
)
def test_values_of_another_type_are_refused_by_the_typed_config(changes, message):
    with pytest.raises(ConfigError) as err:
        _config(**changes)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_score_parser_file(tmp_path):
    path = tmp_path / "parse.py"
    path.write_text("def parse_score(judge_text, **row):\n    return 1.0 if 'yes' in judge_text.lower() else 0.0\n")
    assert load_score_parser(str(path), "parse_score")("Yes!") == 1.0
    with pytest.raises(RewardConfigError, match=r"score_parser.name='other' is not a function"):
        load_score_parser(str(path), "other")
    path.write_text("def parse_score(:\n")
    with pytest.raises(RewardConfigError, match=r"reward_model.judge.score_parser.path=.*SyntaxError"):
        load_score_parser(str(path), "parse_score")
