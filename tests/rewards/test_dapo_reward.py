"""DAPO's reward manager: the overlong penalty is linear over the buffer (arXiv 2503.14476, eq. 13),
a float score is also reported as acc, and bad buffer settings are one line."""

import pytest

from hybridrl.rewards.custom import RewardConfigError
from hybridrl.rewards.dapo import DAPORewardManager, overlong_penalty
from hybridrl.rewards.load import load_reward_manager
from tests.rewards.test_reward_manager import R, make_batch
from tests.tiny_models import ppo_config_with


def always_one(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0


@pytest.mark.parametrize("length, expected", [(8, 0.0), (12, 0.0), (13, -0.25), (14, -0.5), (16, -1.0)])
def test_the_penalty_grows_linearly_over_the_buffer(length, expected):
    # L_max = 16, L_cache = 4: free up to 12 tokens, then -1/4 per token, -1 at L_max
    assert overlong_penalty(length, max_resp_len=16, buffer_len=4, penalty_factor=1.0) == pytest.approx(expected)
    assert overlong_penalty(length, 16, 4, 0.5) == pytest.approx(expected / 2)


def test_the_manager_adds_the_penalty_on_the_last_token_and_logs_it(tokenizer):
    cfg = {"enable": True, "len": 8, "penalty_factor": 1.0, "log": True}
    manager = DAPORewardManager(tokenizer, 0, compute_score=always_one, max_resp_len=R, overlong_buffer_cfg=cfg)
    short, long = "hi", "one two three four five six seven eight nine ten"
    data, lengths = make_batch(tokenizer, ["q", "q"], [short, long], ["s", "s"], ["x", "x"])
    out = manager(data, return_dict=True)
    expected = [1.0 + overlong_penalty(n, R, 8, 1.0) for n in lengths]
    assert lengths[1] > R - 8 >= lengths[0]  # one response inside the buffer, one before it
    assert [out["reward_tensor"][i, n - 1].item() for i, n in enumerate(lengths)] == pytest.approx(expected)
    assert out["reward_extra_info"]["acc"] == [1.0, 1.0]
    assert out["reward_extra_info"]["overlong"] == [False, True]
    assert out["reward_extra_info"]["overlong_reward"][1] == pytest.approx(expected[1] - 1.0)


def test_the_buffer_comes_from_the_config_keys(tokenizer):
    config = ppo_config_with(
        {
            "data": {"max_response_length": R},
            "reward_model": {
                "reward_manager": "dapo",
                "overlong_buffer": {"enable": True, "len": 4, "penalty_factor": 2.0},
            },
        }
    )
    manager = load_reward_manager(config, tokenizer)
    assert isinstance(manager, DAPORewardManager)
    assert (manager.max_resp_len, manager.buffer_len, manager.penalty_factor) == (R, 4, 2.0)


@pytest.mark.parametrize(
    "cfg, message",
    [
        (
            {"enable": True, "len": 0},
            r"overlong_buffer.len=0 must be a whole number of tokens in \(0, data.max_response",
        ),
        ({"enable": True, "len": R + 1}, r"overlong_buffer.len=17"),
        ({"enable": True, "len": 4, "penalty_factor": -1}, r"penalty_factor=-1 must be a number >= 0"),
    ],
)
def test_bad_buffer_settings_are_one_line(tokenizer, cfg, message):
    with pytest.raises(RewardConfigError, match=message):
        DAPORewardManager(tokenizer, 0, max_resp_len=R, overlong_buffer_cfg=cfg)
