"""perf/mfu/<role>: the FLOPs of a batch, the device's promised peak, and the worker's metric."""

import logging
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from hybridrl.models import flops
from hybridrl.models.flops import PEAK_ENV, device_peak_flops, forward_flops, peak_flops_of, update_mfu
from hybridrl.workers.perf_metrics import mfu_metrics

# d=8, 2 layers, 2 heads of 4 with 1 kv head (kv width 4), mlp 16, vocab 10
CONFIG = SimpleNamespace(hidden_size=8, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
CONFIG.intermediate_size, CONFIG.vocab_size = 16, 10
ATTENTION = torch.tensor([[0, 1, 1, 1], [1, 1, 0, 0]])  # 3 and 2 valid tokens
RESPONSE = torch.tensor([[1, 1], [1, 0]])  # 3 response tokens


def _by_hand(lm_head=True):
    per_layer = 2 * 8 * 8 + 2 * 8 * 4 + 3 * 8 * 16  # q, o; k, v; gate, up, down
    body = 2 * 2 * per_layer * 5
    attention = 2 * 2 * 8 * 2 * (3 * 4 / 2 + 2 * 3 / 2)  # causal pairs: 6 + 3
    return body + attention + (2 * 8 * 10 * 3 if lm_head else 0)


def test_forward_flops_by_hand():
    assert forward_flops(CONFIG, ATTENTION, RESPONSE) == _by_hand()
    assert forward_flops(CONFIG, ATTENTION, RESPONSE, lm_head=False) == _by_hand(lm_head=False)


def test_benchmarks_use_the_product_s_forward_flops(monkeypatch):
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parents[2] / "benchmarks" / "common.py"
    spec = importlib.util.spec_from_file_location("_bench_common", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "_bench_common", module)  # its dataclasses look it up
    spec.loader.exec_module(module)
    assert module.forward_flops is forward_flops


@pytest.mark.parametrize(
    "name, tflops",
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA H20", 148.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA L40S", 362.05),
        ("NVIDIA L40", 181.05),
        ("NVIDIA A800 80GB PCIe", 312.0),
    ],
)
def test_peak_table_longest_name_wins(name, tflops):
    assert peak_flops_of(name) == tflops * 1e12


def test_unknown_gpu_has_no_peak_and_one_note(caplog, monkeypatch):
    monkeypatch.setattr(flops, "_NOTED_UNKNOWN", set())
    with caplog.at_level(logging.WARNING, logger=flops.__name__):
        assert peak_flops_of("Some GPU 9000") is None
        assert peak_flops_of("Some GPU 9000") is None
    assert len([r for r in caplog.records if "Some GPU 9000" in r.getMessage()]) == 1


def test_cpu_has_no_peak_unless_the_env_var_sets_one(monkeypatch):
    monkeypatch.delenv(PEAK_ENV, raising=False)
    assert device_peak_flops("cpu") is None
    monkeypatch.setenv(PEAK_ENV, "0.5")
    assert device_peak_flops("cpu") == 0.5e12
    monkeypatch.setenv(PEAK_ENV, "fast")
    with pytest.raises(ValueError, match=PEAK_ENV):
        device_peak_flops("cpu")


def test_update_mfu_is_3x_flops_per_second_over_peak():
    batch = {"attention_mask": ATTENTION, "response_mask": RESPONSE}
    assert update_mfu(CONFIG, batch, 2.0, 1e3, epochs=2) == pytest.approx(3 * 2 * _by_hand() / 2.0 / 1e3)
    assert update_mfu(CONFIG, batch, 2.0, None) is None
    assert update_mfu(None, batch, 2.0, 1e3) is None  # no config to count


def test_worker_metric_on_cpu_with_the_env_var(monkeypatch):
    batch = {"attention_mask": ATTENTION, "response_mask": RESPONSE}
    module = SimpleNamespace(config=CONFIG)
    monkeypatch.delenv(PEAK_ENV, raising=False)
    assert mfu_metrics("actor", module, batch, time.perf_counter(), "cpu", 1) == {}
    monkeypatch.setenv(PEAK_ENV, "1e-9")  # 1000 FLOP/s
    start = time.perf_counter() - 1.0
    actor = mfu_metrics("actor", module, batch, start, "cpu", 1)
    (value,) = actor["perf/mfu/actor"]
    assert 0 < value <= 3 * _by_hand() / 1.0 / 1e3
    assert value == pytest.approx(3 * _by_hand() / 1e3, rel=0.05)
    critic = mfu_metrics("critic", module, batch, start, "cpu", 1, lm_head=False)
    assert critic["perf/mfu/critic"][0] < value
