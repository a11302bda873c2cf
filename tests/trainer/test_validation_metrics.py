"""verl's validation metric functions (bootstrap_metric, calc_maj_val, process_validation_metrics)
and the compute_throughout_metrics alias; expected values are worked out by hand."""

import math

import numpy as np
import pytest
import torch

from hybridrl.protocol import DataProto
from hybridrl.trainer.ppo.metrics import (
    bootstrap_metric,
    calc_maj_val,
    compute_data_metrics,
    compute_throughout_metrics,
    compute_throughput_metrics,
    process_validation_metrics,
)
from hybridrl.trainer.ppo.validation_metrics import ValidationMetricsError


# ----------------------------------------------------------------- bootstrap_metric
def test_bootstrap_constant_data_is_exact():
    assert bootstrap_metric([4, 4, 4], 2, [np.mean, np.max], n_bootstrap=50) == [(4.0, 0.0), (4.0, 0.0)]


def test_bootstrap_max_of_two_draws_from_zero_one():
    # P(max of 2 draws from {0, 1} = 1) = 3/4, so mean 0.75 and std sqrt(0.75 * 0.25).
    [(mean, std)] = bootstrap_metric([0, 1], 2, [np.max], n_bootstrap=20_000, seed=3)
    assert mean == pytest.approx(0.75, abs=0.015)
    assert std == pytest.approx(math.sqrt(0.75 * 0.25), abs=0.015)


def test_bootstrap_is_seeded_and_leaves_numpy_global_state_alone():
    np.random.seed(123)
    state = np.random.get_state()[1].copy()
    a = bootstrap_metric([1, 2, 3, 4, 5], 3, [np.mean], n_bootstrap=100, seed=7)
    assert np.array_equal(np.random.get_state()[1], state)
    assert a == bootstrap_metric([1, 2, 3, 4, 5], 3, [np.mean], n_bootstrap=100, seed=7)
    assert a != bootstrap_metric([1, 2, 3, 4, 5], 3, [np.mean], n_bootstrap=100, seed=8)


def test_bootstrap_subsets_are_object_arrays_of_the_items():
    seen = []
    bootstrap_metric([{"v": 1}], 2, [lambda s: seen.append(list(s)) or 0.0], n_bootstrap=2)
    assert seen == [[{"v": 1}, {"v": 1}]] * 2


@pytest.mark.parametrize(
    "data, size, n_boot, match",
    [
        ([], 1, 10, "data is empty"),
        ([1], 0, 10, "subset_size=0"),
        ([1], 1, 0, "n_bootstrap=0"),
    ],
)
def test_bootstrap_errors(data, size, n_boot, match):
    with pytest.raises(ValidationMetricsError, match=match):
        bootstrap_metric(data, size, [np.mean], n_bootstrap=n_boot)
    assert issubclass(ValidationMetricsError, ValueError)


# ----------------------------------------------------------------- calc_maj_val
def test_calc_maj_val_majority_tie_and_none():
    votes = [{"p": "B", "v": 0.1}, {"p": "A", "v": 0.2}, {"p": "A", "v": 0.3}]
    assert calc_maj_val(votes, "p", "v") == 0.2  # A wins; its first value
    tie = [{"p": "B", "v": 0.1}, {"p": "A", "v": 0.2}, {"p": "A", "v": 0.3}, {"p": "B", "v": 0.4}]
    assert calc_maj_val(tie, "p", "v") == 0.1  # tie: the answer seen first
    nones = [{"p": None, "v": 0.0}, {"p": None, "v": 1.0}, {"p": "A", "v": 0.5}]
    assert calc_maj_val(nones, "p", "v") == 0.0  # None votes too (as in verl)


def test_calc_maj_val_errors():
    with pytest.raises(ValidationMetricsError, match="data is empty"):
        calc_maj_val([], "p", "v")
    with pytest.raises(ValidationMetricsError, match="item 1 has keys \\['p'\\]; each needs 'p' and 'v'"):
        calc_maj_val([{"p": 1, "v": 1}, {"p": 2}], "p", "v")


# ----------------------------------------------------------------- process_validation_metrics
def test_process_validation_metrics_by_hand():
    # s1: prompt u1 has 2 responses scoring 1, 1; u2 has 4 scoring 0. s2: u3 scores 0, 1.
    sources = ["s1", "s1", "s1", "s1", "s1", "s1", "s2", "s2"]
    uids = ["u1", "u1", "u2", "u2", "u2", "u2", "u3", "u3"]
    scores = [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    out = process_validation_metrics(sources, uids, {"score": scores, "tag": ["x"] * 8}, seed=0)
    assert set(out) == {"s1", "s2"} and set(out["s1"]) == {"score"}  # str variables get nothing
    s1 = out["s1"]["score"]
    # mean@N / best@n average over the prompts that have them: u1 gives @2, u2 gives @4 and @2.
    assert s1["mean@2"] == 1.0 and s1["mean@4"] == 0.0 and s1["std@2"] == 0.0
    assert s1["best@2/mean"] == 0.5 and s1["worst@2/mean"] == 0.5 and s1["best@4/mean"] == 0.0
    assert s1["best@2/std"] == 0.0 and "maj@2/mean" not in s1
    assert set(s1) == {
        "mean@2",
        "std@2",
        "best@2/mean",
        "best@2/std",
        "worst@2/mean",
        "worst@2/std",
        "mean@4",
        "std@4",
        "best@4/mean",
        "best@4/std",
        "worst@4/mean",
        "worst@4/std",
    }
    s2 = out["s2"]["score"]
    assert s2["mean@2"] == 0.5 and s2["std@2"] == 0.5
    assert s2["best@2/mean"] == pytest.approx(0.75, abs=0.05)  # P(max of 2 draws = 1) = 3/4
    assert s2["worst@2/mean"] == pytest.approx(0.25, abs=0.05)
    assert all(isinstance(v, float) for v in s2.values())


def test_process_validation_metrics_subset_sizes_and_single_response():
    out = process_validation_metrics(["s"] * 5 + ["s"], ["a"] * 5 + ["b"], {"acc": [1, 0, 1, 0, 1, 1]})
    keys = set(out["s"]["acc"])
    assert {"best@2/mean", "best@4/mean", "best@5/mean", "mean@5", "mean@1"} <= keys
    assert "best@3/mean" not in keys and "std@1" not in keys
    assert out["s"]["acc"]["mean@1"] == 1.0 and out["s"]["acc"]["mean@5"] == pytest.approx(0.6)


def test_process_validation_metrics_majority_vote():
    # Every response of the prompt answers "A" with value 1: maj@n is exactly 1.
    out = process_validation_metrics(["s"] * 3, ["u"] * 3, {"acc": [1.0, 1.0, 1.0], "pred": ["A"] * 3})
    acc = out["s"]["acc"]
    assert acc["maj@2/mean"] == 1.0 and acc["maj@3/mean"] == 1.0 and acc["maj@3/std"] == 0.0
    assert "pred" not in out["s"]


def test_failed_sessions_count_as_incorrect_only_where_acc_is_reported():
    # prompt p1 expected 4 sessions but 2 came back (acc 1, 1); p2 expected 2, none came back
    result = process_validation_metrics(
        ["math", "math", "chat"],
        ["p1", "p1", "c1"],
        {"acc": [1.0, 1.0, None], "reward": [0.4, 0.6, 0.5]},
        expected_acc_counts={("math", "p1"): 4, ("math", "p2"): 2, ("chat", "c1"): 3},
    )
    assert result["math"]["acc"]["mean@4"] == pytest.approx(0.5)  # (1 + 1 + 0 + 0) / 4
    assert result["math"]["acc"]["mean@2"] == pytest.approx(0.0)  # p2: both sessions missing
    assert result["math"]["acc_success_only"]["mean@2"] == pytest.approx(1.0)
    assert result["math"]["reward"]["mean@2"] == pytest.approx(0.5)
    assert "acc" not in result["chat"] and "acc_success_only" not in result["chat"]  # None is left out


def test_process_validation_metrics_length_mismatch():
    with pytest.raises(ValidationMetricsError, match=r"infos_dict\['score'\] has 1 values but data_sources has 2"):
        process_validation_metrics(["a", "a"], ["u", "u"], {"score": [1.0]})
    with pytest.raises(ValidationMetricsError, match="sample_uids has 1 values"):
        process_validation_metrics(["a", "a"], ["u"], {})


# ----------------------------------------------------------------- verl-named wrappers
def test_compute_throughout_metrics_is_compute_throughput_metrics_with_n_gpus():
    batch = DataProto(meta_info={"global_token_num": [100, 300]})
    out = compute_throughout_metrics(batch, {"step": 2.0}, n_gpus=2)
    assert out == {"perf/total_num_tokens": 400.0, "perf/time_per_step": 2.0, "perf/throughput": 100.0}
    assert out == compute_throughput_metrics(batch, {"step": 2.0}, n_devices=2)


def test_data_metrics_ignore_a_meta_info_that_is_not_a_dict():
    class StandIn:  # a test double whose meta_info is not a dict (e.g. a MagicMock attribute)
        batch = {
            "responses": torch.zeros(1, 2),
            "attention_mask": torch.ones(1, 4),
            "response_mask": torch.ones(1, 2),
            "token_level_scores": torch.tensor([[1.0, 2.0]]),
            "token_level_rewards": torch.tensor([[1.0, 1.0]]),
            "advantages": torch.zeros(1, 2),
            "returns": torch.zeros(1, 2),
        }
        non_tensor_batch = {}
        meta_info = object()

    m = compute_data_metrics(StandIn(), use_critic=False)
    assert m["critic/score/mean"] == 3.0 and m["prompt_length/clip_ratio"] == 1.0
