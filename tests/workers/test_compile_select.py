"""actor.use_torch_compile: the logits' log-prob/entropy functions compiled on CUDA only."""

import pytest
import torch

from hybridrl.algorithms.errors import AlgorithmInputError
from hybridrl.algorithms.functional import entropy_from_logits, logprobs_from_logits
from hybridrl.workers import model_forward
from hybridrl.workers.model_forward import ForwardOptions, logit_stat_fns


@pytest.fixture
def fake_compile(monkeypatch):
    """torch.compile as the identity (recording its calls): the selection without compiling."""
    calls = []

    def compile_(fn, dynamic=None):
        calls.append((fn.__name__, dynamic))
        return fn

    model_forward._compiled_logit_stat_fns.cache_clear()
    monkeypatch.setattr(torch, "compile", compile_)
    yield calls
    model_forward._compiled_logit_stat_fns.cache_clear()


def test_cpu_and_flag_off_stay_eager(fake_compile):
    eager = (logprobs_from_logits, entropy_from_logits)
    assert logit_stat_fns(True, "cpu") == eager
    assert logit_stat_fns(False, "cuda") == eager
    assert logit_stat_fns(False, torch.device("cuda", 1)) == eager
    assert fake_compile == []


def test_cuda_with_the_flag_compiles_once(fake_compile):
    first = logit_stat_fns(True, "cuda")
    assert first != (logprobs_from_logits, entropy_from_logits)
    assert logit_stat_fns(True, torch.device("cuda", 0)) == first  # built once per process
    assert sorted(fake_compile) == [("_logsumexp_rows", True), ("entropy_rows", True)]


def test_compiled_wrappers_compute_the_eager_values(fake_compile):
    logprobs, entropy = logit_stat_fns(True, "cuda")
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=gen)[:, 1:4]  # a non-contiguous view, as the padded path
    labels = torch.randint(0, 11, (3, 3), generator=gen)
    assert torch.equal(logprobs(logits, labels), logprobs_from_logits(logits, labels))
    assert torch.equal(entropy(logits), entropy_from_logits(logits))
    with pytest.raises(AlgorithmInputError, match="labels shape"):
        logprobs(logits, labels[:, :2])


def test_the_forward_asks_with_the_option_and_the_logits_device(monkeypatch):
    seen = []

    def select(use_torch_compile, device):
        seen.append((use_torch_compile, torch.device(device).type))
        return logprobs_from_logits, entropy_from_logits

    monkeypatch.setattr(model_forward, "logit_stat_fns", select)
    logits, labels = torch.randn(2, 3, 7), torch.randint(0, 7, (2, 3))
    model_forward._stats_from_logits(logits, labels, 1.0, True, ForwardOptions(use_torch_compile=True))
    assert seen == [(True, "cpu")]
