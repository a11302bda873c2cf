"""Loading a user's reward function from custom_reward_function.path / .name."""

import textwrap

import pytest

from hybridrl.rewards.custom import RewardConfigError, load_custom_reward_fn


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(
        textwrap.dedent(
            """
        from math import sqrt

        def helper(x):
            return x

        def compute_score(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):
            return scale * float(solution_str.strip() == ground_truth)

        class Scorer:
            pass
        """
        )
    )
    return path


def test_loads_the_named_function(reward_file):
    fn = load_custom_reward_fn(str(reward_file))
    assert fn(data_source="d", solution_str=" 42 ", ground_truth="42") == 1.0
    assert load_custom_reward_fn(str(reward_file), "helper")(7) == 7


def test_reward_kwargs_are_bound(reward_file):
    fn = load_custom_reward_fn(str(reward_file), "compute_score", {"scale": 3.0})
    assert fn(data_source="d", solution_str="42", ground_truth="42") == 3.0


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.py"
    with pytest.raises(RewardConfigError) as info:
        load_custom_reward_fn(str(missing))
    msg = str(info.value)
    assert "custom_reward_function.path" in msg and str(missing) in msg and "does not exist" in msg


def test_missing_function_lists_what_the_file_defines(reward_file):
    with pytest.raises(RewardConfigError) as info:
        load_custom_reward_fn(str(reward_file), "score_fn")
    msg = str(info.value)
    assert "custom_reward_function.name='score_fn'" in msg and str(reward_file) in msg
    assert "compute_score" in msg and "helper" in msg and "Scorer" in msg
    assert "sqrt" not in msg  # imported, not defined there
    assert isinstance(info.value, ValueError)


def test_file_that_fails_to_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def compute_score(:\n")
    with pytest.raises(RewardConfigError, match="custom_reward_function.path.*SyntaxError"):
        load_custom_reward_fn(str(bad))


def test_a_name_that_is_not_a_string_is_one_line(tmp_path):
    path = tmp_path / "r.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    with pytest.raises(RewardConfigError, match=r"custom_reward_function.name=1 is not a function in .*compute_score"):
        load_custom_reward_fn(str(path), 1)
