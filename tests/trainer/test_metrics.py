"""Step metrics on a small hand-built batch; expected values are worked out by hand below."""

import math

import pytest
import torch

from hybridrl.protocol import DataProto
from hybridrl.trainer.ppo.metrics import (
    MetricsInputError,
    compute_data_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
)
from hybridrl.trainer.run import metrics as run_metrics
from hybridrl.trainer.run.metrics import marked_timer


def _batch(with_values=True, meta_info=None):
    # bs=2, prompt P=3 (left padded), response R=4 (right padded).
    # row 0: prompt len 2, response len 4 (= R: clipped); position 1 is a tool token (mask 0).
    # row 1: prompt len 3 (= P: clipped), response len 2.
    tensors = {
        "responses": torch.tensor([[5, 6, 7, 8], [5, 6, 0, 0]]),
        "attention_mask": torch.tensor([[0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0]]),
        "response_mask": torch.tensor([[1, 0, 1, 1], [1, 1, 0, 0]]),
        "token_level_scores": torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 0.5, 0.0, 0.0]]),
        "token_level_rewards": torch.tensor([[-0.1, 0.0, -0.1, 0.9], [-0.2, 0.3, 0.0, 0.0]]),
        # 99 / 50 / 9 sit on masked positions and must not leak into any statistic.
        "advantages": torch.tensor([[1.0, 99.0, 2.0, 3.0], [-1.0, -2.0, 50.0, 50.0]]),
        "returns": torch.tensor([[2.0, 99.0, 2.0, 2.0], [0.0, 0.0, 9.0, 9.0]]),
    }
    if with_values:
        tensors["values"] = torch.tensor([[1.0, 99.0, 2.0, 3.0], [0.0, 1.0, 9.0, 9.0]])
    return DataProto.from_dict(tensors=tensors, meta_info=meta_info)


def test_data_metrics_by_hand():
    m = compute_data_metrics(_batch(), use_critic=True)
    expected = {
        # sequence sums: scores [1.0, 0.5], rewards [0.7, 0.1]
        "critic/score/mean": 0.75,
        "critic/score/max": 1.0,
        "critic/score/min": 0.5,
        "critic/rewards/mean": 0.4,
        "critic/rewards/max": 0.7,
        "critic/rewards/min": 0.1,
        # valid advantages [1, 2, 3, -1, -2], returns [2, 2, 2, 0, 0], values [1, 2, 3, 0, 1]
        "critic/advantages/mean": 0.6,
        "critic/advantages/max": 3.0,
        "critic/advantages/min": -2.0,
        "critic/returns/mean": 1.2,
        "critic/returns/max": 2.0,
        "critic/returns/min": 0.0,
        "critic/values/mean": 1.4,
        "critic/values/max": 3.0,
        "critic/values/min": 0.0,
        # returns - values = [1, 0, -1, 0, -1]: unbiased var 2.8/4 = 0.7; var(returns) = 4.8/4 = 1.2
        "critic/vf_explained_var": 1 - 0.7 / (1.2 + 1e-5),
        # response lengths from attention_mask [4, 2]; prompt lengths [2, 3]
        "response_length/mean": 3.0,
        "response_length/max": 4.0,
        "response_length/min": 2.0,
        "response_length/clip_ratio": 0.5,
        "prompt_length/mean": 2.5,
        "prompt_length/max": 3.0,
        "prompt_length/min": 2.0,
        "prompt_length/clip_ratio": 0.5,
    }
    assert set(m) == set(expected)
    for key, value in expected.items():
        assert m[key] == pytest.approx(value, abs=1e-5), key
        assert isinstance(m[key], float), key


def test_data_metrics_without_critic():
    m = compute_data_metrics(_batch(with_values=False), use_critic=False)
    assert not any(k.startswith("critic/values") or k == "critic/vf_explained_var" for k in m)
    assert m["critic/score/mean"] == pytest.approx(0.75)


def test_data_metrics_missing_values_is_clear():
    with pytest.raises(MetricsInputError, match="'values'.*use_critic=False"):
        compute_data_metrics(_batch(with_values=False), use_critic=True)


def test_data_metrics_missing_key_names_it():
    batch = _batch()
    batch.batch.pop("advantages")
    with pytest.raises(ValueError, match="'advantages'"):
        compute_data_metrics(batch)


def test_data_metrics_all_masked_gives_nan_not_crash():
    batch = _batch()
    batch.batch["response_mask"] = torch.zeros(2, 4, dtype=torch.long)
    m = compute_data_metrics(batch)
    assert math.isnan(m["critic/advantages/mean"])
    assert math.isnan(m["critic/vf_explained_var"])


def test_timing_metrics_per_token():
    # 6 response tokens, 5 prompt tokens -> 11 tokens in all
    timing_raw = {"gen": 0.6, "update_actor": 1.1, "old_log_prob": 0.22, "reward": 0.1}
    timing_raw["step"] = 2.0
    m = compute_timing_metrics(_batch(), timing_raw)
    assert m["timing_s/gen"] == 0.6 and m["timing_s/reward"] == 0.1 and m["timing_s/step"] == 2.0
    assert m["timing_per_token_ms/gen"] == pytest.approx(100.0)
    assert m["timing_per_token_ms/update_actor"] == pytest.approx(100.0)
    assert m["timing_per_token_ms/old_log_prob"] == pytest.approx(20.0)
    per_token = {k for k in m if k.startswith("timing_per_token_ms/")}
    assert per_token == {f"timing_per_token_ms/{s}" for s in ("gen", "update_actor", "old_log_prob")}


def test_throughput_metrics():
    m = compute_throughput_metrics(_batch(), {"step": 2.0}, n_devices=2)
    assert m == {"perf/total_num_tokens": 11.0, "perf/time_per_step": 2.0, "perf/throughput": 2.75}
    # the rollout's own count wins when recorded
    m = compute_throughput_metrics(_batch(meta_info={"global_token_num": [5, 7]}), {"step": 2.0}, 1)
    assert m["perf/total_num_tokens"] == 12.0 and m["perf/throughput"] == 6.0


def test_throughput_needs_step_time():
    with pytest.raises(MetricsInputError, match="marked_timer\\('step'"):
        compute_throughput_metrics(_batch(), {"gen": 1.0}, n_devices=1)
    with pytest.raises(MetricsInputError, match="n_devices"):
        compute_throughput_metrics(_batch(), {"step": 1.0}, n_devices=0)


def test_marked_timer_accumulates_and_survives_errors(monkeypatch):
    clock = iter([10.0, 10.5, 20.0, 20.25])
    monkeypatch.setattr(run_metrics.time, "perf_counter", lambda: next(clock))
    timing_raw = {}
    with marked_timer("gen", timing_raw):
        pass
    with pytest.raises(RuntimeError):
        with marked_timer("gen", timing_raw):
            raise RuntimeError("boom")
    assert timing_raw == {"gen": pytest.approx(0.75)}


def test_marked_timer_real_clock():
    timing_raw = {}
    with marked_timer("step", timing_raw):
        sum(range(1000))
    assert 0.0 <= timing_raw["step"] < 5.0
