"""NaiveRewardManager and load_reward_manager with the real SmolLM2 tokenizer."""

import logging
import re
import textwrap
import time

import pytest
import torch

from hybridrl.errors import ConfigError
from hybridrl.protocol import DataProto
from hybridrl.rewards.custom import RewardConfigError
from hybridrl.rewards.load import load_reward_manager
from hybridrl.rewards.manager import (
    NaiveRewardManager,
    RewardFunctionError,
    RewardInputError,
    get_reward_manager_cls,
    register_reward_manager,
)
from tests.tiny_models import ppo_config_with

P, R = 12, 16


def make_batch(tokenizer, prompts, responses, sources, truths, extra_info=None, add_eos=True):
    """Left-padded prompts (bs, P), right-padded responses (bs, R), attention_mask (bs, P+R)."""
    pad = tokenizer.pad_token_id
    bs = len(prompts)
    prompt_ids = torch.full((bs, P), pad, dtype=torch.long)
    response_ids = torch.full((bs, R), pad, dtype=torch.long)
    mask = torch.zeros(bs, P + R, dtype=torch.long)
    lengths = []
    for i, (p, r) in enumerate(zip(prompts, responses)):
        p_ids = tokenizer.encode(p)
        r_ids = tokenizer.encode(r) + ([tokenizer.eos_token_id] if add_eos else [])
        assert len(p_ids) <= P and len(r_ids) <= R
        prompt_ids[i, P - len(p_ids) :] = torch.tensor(p_ids)
        response_ids[i, : len(r_ids)] = torch.tensor(r_ids)
        mask[i, P - len(p_ids) : P + len(r_ids)] = 1
        lengths.append(len(r_ids))
    non_tensors = {"data_source": sources, "reward_model": [{"style": "rule", "ground_truth": t} for t in truths]}
    if extra_info is not None:
        non_tensors["extra_info"] = extra_info
    data = DataProto.from_dict(
        tensors={"prompts": prompt_ids, "responses": response_ids, "attention_mask": mask},
        non_tensors=non_tensors,
    )
    return data, lengths


def test_gsm8k_scores_land_on_last_valid_token(tokenizer):
    responses = ["#### 18", "The total is 3 + 4 so #### 7", "#### 5", "no idea"]
    data, lengths = make_batch(
        tokenizer,
        ["Q1?", "Q2?", "Q3?", "Q4?"],
        responses,
        ["openai/gsm8k"] * 4,
        ["18", "7", "6", "1"],
    )
    assert len(set(lengths)) >= 3  # really different response lengths
    out = NaiveRewardManager(tokenizer, num_examine=0)(data)
    expected = torch.zeros(4, R)
    expected[0, lengths[0] - 1] = 1.0  # correct
    expected[1, lengths[1] - 1] = 1.0  # correct
    # sample 2 is wrong (format_score 0), sample 3 has no answer: rows stay zero
    assert out.dtype == torch.float32 and out.shape == (4, R)
    assert torch.equal(out, expected)


def test_scorer_sees_decoded_text_and_full_length_response(tokenizer):
    calls = []

    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        calls.append((data_source, solution_str, ground_truth, extra_info))
        return len(solution_str)

    long_text = (
        "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
        "eighteen"
    )
    long_ids = tokenizer.encode(long_text)[:R]  # exactly R tokens: no padding at all
    long_text = tokenizer.decode(long_ids)
    data, lengths = make_batch(
        tokenizer,
        ["a", "b"],
        ["hi there", long_text],
        ["s1", "s2"],
        ["x", "y"],
        extra_info=[{"index": 0}, {"index": 1}],
        add_eos=False,
    )
    assert lengths[1] == R
    out = NaiveRewardManager(tokenizer, 0, compute_score=scorer)(data)
    assert calls == [("s1", "hi there", "x", {"index": 0}), ("s2", long_text, "y", {"index": 1})]
    assert out[0, lengths[0] - 1] == len("hi there") and out[1, R - 1] == len(long_text)
    assert out.count_nonzero() == 2


def test_special_tokens_are_skipped(tokenizer):
    seen = []
    data, _ = make_batch(tokenizer, ["q"], ["#### 4"], ["d"], ["4"], add_eos=True)
    NaiveRewardManager(tokenizer, 0, compute_score=lambda **kw: seen.append(kw["solution_str"]) or 1.0)(data)
    assert seen == ["#### 4"]


def test_dict_results_fill_reward_extra_info(tokenizer):
    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        ok = solution_str == ground_truth
        result = {"score": 2.0 if ok else -1.0, "acc": ok}
        if data_source == "with_pred":
            result["pred"] = solution_str
        return result

    data, lengths = make_batch(tokenizer, ["q", "q"], ["yes", "no"], ["plain", "with_pred"], ["yes", "yes"])
    out = NaiveRewardManager(tokenizer, 0, compute_score=scorer)(data, return_dict=True)
    reward, extra = out["reward_tensor"], out["reward_extra_info"]
    assert reward[0, lengths[0] - 1] == 2.0 and reward[1, lengths[1] - 1] == -1.0
    assert extra == {"acc": [True, False], "pred": [None, "no"]}


def test_rm_scores_add_to_rule_scores_only_where_a_rule_scorer_exists(tokenizer):
    # row 0: GSM8K (has a rule scorer, answer right); row 1: HH-RLHF (no rule scorer)
    data, lengths = make_batch(
        tokenizer, ["q", "q"], ["#### 7", "sure"], ["openai/gsm8k", "Anthropic/hh-rlhf"], ["7", None]
    )
    rm = torch.zeros(2, R)
    rm[0, lengths[0] - 1], rm[1, lengths[1] - 1] = 0.25, -1.5
    data.batch["rm_scores"] = rm
    out = NaiveRewardManager(tokenizer, 0)(data, return_dict=True)
    expected = rm.clone()
    expected[0, lengths[0] - 1] += 1.0  # rule score 1 (correct) + rm 0.25
    assert torch.equal(out["reward_tensor"], expected)
    assert out["reward_extra_info"]["rm_score"] == [0.25, -1.5]
    assert out["reward_extra_info"]["rule_score"] == [1.0, None]
    # a custom compute_score scores every row, so it is added everywhere
    custom = NaiveRewardManager(tokenizer, 0, compute_score=lambda **kw: 2.0)(data)
    assert torch.equal(custom, rm + 2.0 * (rm != 0))
    # without rm_scores an unknown data source is still an error (the rule path is unchanged)
    del data.batch["rm_scores"]
    with pytest.raises(
        Exception, match="data_source='Anthropic/hh-rlhf' is not a known data_source with a reward scorer"
    ):
        NaiveRewardManager(tokenizer, 0)(data)


def _flaky(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "boom":
        return 1 / 0
    return 1.0


def test_on_error_raise_names_sample_and_fix(tokenizer):
    data, _ = make_batch(tokenizer, ["q"] * 3, ["ok", "boom", "ok"], ["a", "b", "a"], ["", "", ""])
    with pytest.raises(RewardFunctionError) as info:
        NaiveRewardManager(tokenizer, 0, compute_score=_flaky)(data)
    msg = str(info.value)
    assert "sample 1" in msg and "'b'" in msg and "ZeroDivisionError: division by zero" in msg
    assert "set reward_model.on_error to zero, mask_sample or drop_group" in msg and "\n" not in msg
    assert isinstance(info.value, RuntimeError)


class Flaky:
    """Fails its first ``failures`` calls on the response "boom", then scores it 1."""

    def __init__(self, failures):
        self.failures, self.calls = failures, 0

    def __call__(self, data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "boom":
            self.calls += 1
            if self.calls <= self.failures:
                raise ConnectionError("judge unavailable")
        return 1.0


def test_retry_calls_again_then_stops_with_the_count(tokenizer):
    data, lengths = make_batch(tokenizer, ["q"] * 2, ["ok", "boom"], ["a", "b"], ["", ""])
    scorer = Flaky(failures=2)
    out = NaiveRewardManager(tokenizer, 0, compute_score=scorer, on_error="retry", retries=2)(data, return_dict=True)
    assert out["reward_tensor"][1, lengths[1] - 1] == 1.0 and scorer.calls == 3
    assert "reward_error" not in out["reward_extra_info"]  # retry either scores or stops
    with pytest.raises(
        RewardFunctionError,
        match=r"ConnectionError: judge unavailable after 2 attempts "
        r"\(reward_model.retries=1\)",
    ):
        NaiveRewardManager(tokenizer, 0, compute_score=Flaky(failures=5), on_error="retry", retries=1)(data)


@pytest.mark.parametrize("policy", ["mask_sample", "drop_group"])
def test_going_on_policies_report_errors_and_timeouts_per_sample(tokenizer, policy):
    data, _ = make_batch(tokenizer, ["q"] * 3, ["ok", "boom", "slow"], ["a", "b", "c"], ["", "", ""])

    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "slow":
            time.sleep(1.0)
        if solution_str == "boom":
            raise ValueError("bad")
        return 1.0

    manager = NaiveRewardManager(tokenizer, 0, compute_score=scorer, on_error=policy, timeout_s=0.2)
    info = manager(data, return_dict=True)["reward_extra_info"]
    assert info["reward_error"] == [0.0, 1.0, 1.0] and info["reward_timeout"] == [0.0, 0.0, 1.0]


def test_the_slowest_samples_are_named_in_the_log(tokenizer, caplog):
    data, _ = make_batch(tokenizer, ["q"] * 2, ["ok", "slow"], ["fast_source", "slow_source"], ["", ""])

    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        time.sleep(1.05 if solution_str == "slow" else 0.0)
        return 1.0

    with caplog.at_level(logging.INFO, logger="hybridrl.rewards.manager"):
        NaiveRewardManager(tokenizer, 0, compute_score=scorer)(data)
    assert re.search(r"reward: slowest samples: #1 \(slow_source\) 1\.\d s, #0 \(fast_source\)", caplog.text)


def test_on_error_zero_scores_zero_and_warns_once(tokenizer, caplog):
    data, lengths = make_batch(tokenizer, ["q"] * 3, ["boom", "ok", "boom"], ["a"] * 3, [""] * 3)
    manager = NaiveRewardManager(tokenizer, 0, compute_score=_flaky, on_error="zero")
    with caplog.at_level(logging.WARNING, logger="hybridrl.rewards.manager"):
        out = manager(data, return_dict=True)
    assert out["reward_extra_info"]["reward_error"] == [1.0, 0.0, 1.0]
    expected = torch.zeros(3, R)
    expected[1, lengths[1] - 1] = 1.0
    assert torch.equal(out["reward_tensor"], expected)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "2 of 3" in warnings[0].getMessage()


def test_on_error_zero_stops_when_every_sample_fails(tokenizer):
    """An unknown data source or a broken scorer fails every sample: all-zero rewards train nothing."""
    data, _ = make_batch(tokenizer, ["q"] * 2, ["boom", "boom"], ["a"] * 2, [""] * 2)
    with pytest.raises(
        RewardFunctionError, match=r"failed on all 2 samples of this batch .*first: .*ZeroDivision"
    ) as err:
        NaiveRewardManager(tokenizer, 0, compute_score=_flaky, on_error="zero")(data)
    assert "\n" not in str(err.value)


def test_bad_return_value_is_a_reward_function_error(tokenizer):
    data, _ = make_batch(tokenizer, ["q"], ["a"], ["d"], ["a"])
    with pytest.raises(RewardFunctionError, match="without a 'score' key"):
        NaiveRewardManager(tokenizer, 0, compute_score=lambda **kw: {"acc": 1.0})(data)
    with pytest.raises(RewardFunctionError, match="returned str"):
        NaiveRewardManager(tokenizer, 0, compute_score=lambda **kw: "1.0")(data)


def test_num_examine_prints_per_data_source_each_call(tokenizer, capsys):
    data, _ = make_batch(
        tokenizer,
        ["q1", "q2", "q3"],
        ["#### 1", "#### 2", "#### 3"],
        ["gsm8k", "gsm8k", "openai/gsm8k"],
        ["1", "2", "3"],
    )
    manager = NaiveRewardManager(tokenizer, num_examine=1)
    manager(data)
    first = capsys.readouterr().out
    assert first.count("[response]") == 2  # one per data source
    assert "[prompt] q1" in first and "[prompt] q3" in first and "q2" not in first
    assert "[ground_truth] 1" in first and "[score] 1.0" in first
    manager(data)
    assert capsys.readouterr().out.count("[response]") == 2


def test_input_errors(tokenizer):
    data, _ = make_batch(tokenizer, ["q"], ["a"], ["d"], ["a"])
    data.non_tensor_batch["reward_model"][0] = {"style": "rule"}
    with pytest.raises(RewardInputError, match="ground_truth"):
        NaiveRewardManager(tokenizer, 0)(data)
    data, _ = make_batch(tokenizer, ["q"], ["a"], ["d"], ["a"])
    with pytest.raises(RewardInputError, match="data.reward_fn_key"):
        NaiveRewardManager(tokenizer, 0, reward_fn_key="source")(data)
    with pytest.raises(RewardConfigError, match="reward_model.on_error"):
        NaiveRewardManager(tokenizer, 0, on_error="ignore")


def test_manager_registry():
    assert get_reward_manager_cls("naive") is NaiveRewardManager
    with pytest.raises(
        RewardConfigError,
        match=r"reward_model.reward_manager='prime' is not a known reward "
        r"manager; known: dapo, .*naive",
    ):
        get_reward_manager_cls("prime")

    @register_reward_manager("test_only")
    class Mine(NaiveRewardManager):
        pass

    assert get_reward_manager_cls("test_only") is Mine
    register_reward_manager("test_only")(Mine)  # the same class again (a re-import) is fine
    with pytest.raises(
        RewardConfigError,
        match=r"reward manager 'naive' is already registered to "
        r"hybridrl.rewards.manager.NaiveRewardManager; pick another name",
    ):
        register_reward_manager("naive")(Mine)


def test_load_reward_manager_from_config(tokenizer, tmp_path):
    path = tmp_path / "reward.py"
    path.write_text(
        textwrap.dedent(
            """
        def my_score(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):
            if solution_str == "boom":
                raise ValueError("bad")
            return scale * float(solution_str == ground_truth)
        """
        )
    )
    config = ppo_config_with(
        {
            "data": {"reward_fn_key": "source"},
            "custom_reward_function": {"path": str(path), "name": "my_score", "reward_kwargs": {"scale": 3.0}},
            "reward_model": {"reward_manager": "naive", "on_error": "zero", "reward_kwargs": {}},
        }
    )
    manager = load_reward_manager(config, tokenizer, num_examine=0)
    data, lengths = make_batch(tokenizer, ["q", "q"], ["yes", "boom"], ["s", "s"], ["yes", "yes"])
    data.non_tensor_batch["source"] = data.non_tensor_batch.pop("data_source")
    out = manager(data, return_dict=True)
    assert out["reward_tensor"][0, lengths[0] - 1] == 3.0
    assert out["reward_extra_info"]["reward_error"] == [0.0, 1.0]


def test_load_reward_manager_defaults_and_bad_kwargs(tokenizer):
    manager = load_reward_manager(ppo_config_with({"custom_reward_function": {"path": None}}), tokenizer)
    assert isinstance(manager, NaiveRewardManager)
    assert manager.reward_fn_key == "data_source" and manager.on_error == "raise"
    data, lengths = make_batch(tokenizer, ["q"], ["#### 9"], ["openai/gsm8k"], ["9"])
    assert manager(data)[0, lengths[0] - 1] == 1.0
    bad = ppo_config_with({"reward_model": {"reward_kwargs": {"max_resp_len": 10}}})
    with pytest.raises(RewardConfigError, match="reward_model.reward_kwargs"):
        load_reward_manager(bad, tokenizer)


def _sleepy(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "hang":
        time.sleep(30)
    return 1.0


def test_a_scorer_that_never_returns_meets_its_deadline(tokenizer):
    data, _ = make_batch(tokenizer, ["q"] * 2, ["ok", "hang"], ["a"] * 2, [""] * 2)
    started = time.perf_counter()
    with pytest.raises(
        RewardFunctionError,
        match=r"sample 1 .*ScoreTimeoutError: no result within "
        r"reward_model.timeout_s=0.5 s",
    ) as err:
        NaiveRewardManager(tokenizer, 0, compute_score=_sleepy, timeout_s=0.5)(data)
    assert time.perf_counter() - started < 5 and "\n" not in str(err.value)
    # with on_error=zero the late sample scores 0 and the others are kept
    out = NaiveRewardManager(tokenizer, 0, compute_score=_sleepy, on_error="zero", timeout_s=0.5)(
        data, return_dict=True
    )
    assert out["reward_extra_info"]["reward_error"] == [0.0, 1.0] and out["reward_tensor"].sum() == 1.0


def test_the_deadline_comes_from_the_config(tokenizer):
    manager = load_reward_manager(ppo_config_with({"reward_model": {"timeout_s": 7}}), tokenizer)
    assert manager.timeout_s == 7.0
    with pytest.raises(RewardConfigError, match=r"reward_model.timeout_s=0.0 must be a number of seconds > 0"):
        load_reward_manager(ppo_config_with({"reward_model": {"timeout_s": 0}}), tokenizer)
    with pytest.raises(ConfigError, match=r"reward_model.timeout_s: Value 'soon' .* could not be converted to Float"):
        ppo_config_with({"reward_model": {"timeout_s": "soon"}})  # the typed config refuses it at start-up
