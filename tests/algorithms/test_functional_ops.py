import math

import pytest
import torch

from hybridrl.algorithms import AlgorithmInputError
from hybridrl.algorithms import functional as F


def test_masked_sum_and_mean_hand_values():
    values = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[1, 0], [1, 1]])
    assert F.masked_sum(values, mask).item() == pytest.approx(8.0)
    assert F.masked_mean(values, mask).item() == pytest.approx(8.0 / 3.0)
    assert torch.allclose(F.masked_mean(values, mask, axis=-1), torch.tensor([1.0, 3.5]))
    assert torch.allclose(F.masked_sum(values, mask, axis=0), torch.tensor([4.0, 4.0]))


def test_masked_mean_ignores_nan_in_padding_and_empty_rows_are_zero():
    values = torch.tensor([[1.0, float("nan")], [float("inf"), 5.0]])
    mask = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    assert F.masked_mean(values, mask).item() == pytest.approx(1.0)
    assert F.masked_mean(values, mask, axis=-1).tolist() == [1.0, 0.0]


def test_masked_var_unbiased_and_biased():
    values = torch.tensor([[1.0, 2.0, 3.0, 4.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    # mean 2.5, squared deviations 2.25+0.25+0.25+2.25 = 5
    assert F.masked_var(values, mask).item() == pytest.approx(5.0 / 3.0)
    assert F.masked_var(values, mask, unbiased=False).item() == pytest.approx(5.0 / 4.0)
    single = F.masked_var(values, torch.tensor([[0, 1, 0, 0, 0]]))
    assert single.item() == 0.0


def test_masked_var_empty_mask_is_a_clear_error():
    with pytest.raises(AlgorithmInputError, match="response_mask"):
        F.masked_var(torch.ones(2, 3), torch.zeros(2, 3))


def test_masked_whiten():
    values = torch.tensor([[0.5, 0.6, 0.7, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    # mean 0.6, unbiased var (0.01 + 0 + 0.01) / 2 = 0.01 -> std 0.1
    out = F.masked_whiten(values, mask)
    assert torch.allclose(out[0, :3], torch.tensor([-1.0, 0.0, 1.0]), atol=1e-5)
    out = F.masked_whiten(values, mask, shift_mean=False)
    # (v - 0.6) / 0.1 + 0.6: unit variance, original mean kept
    assert torch.allclose(out[0, :3], torch.tensor([-0.4, 0.6, 1.6]), atol=1e-5)


def test_logprobs_from_logits_hand_values():
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]])  # (1, 2, vocab=2)
    labels = torch.tensor([[1, 0]])
    out = F.logprobs_from_logits(logits, labels)
    assert out.shape == (1, 2)
    assert torch.allclose(out, torch.tensor([[math.log(0.75), math.log(0.5)]]))


@pytest.mark.parametrize("chunk", [1 << 24, 7])  # 7 elements -> one row per chunk
def test_logprobs_and_entropy_match_log_softmax_and_gradients(monkeypatch, chunk):
    monkeypatch.setattr(F, "_CHUNK_ELEMENTS", chunk)
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 11, requires_grad=True)
    labels = torch.randint(0, 11, (3, 4))
    ref = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    out = F.logprobs_from_logits(logits, labels)
    assert torch.allclose(out, ref, atol=1e-6)
    (g_ref,) = torch.autograd.grad(ref.sum(), logits)
    (g_out,) = torch.autograd.grad(out.sum(), logits)
    assert torch.allclose(g_out, g_ref, atol=1e-6)
    p = torch.softmax(logits, -1)
    ent_ref = -(p * torch.log_softmax(logits, -1)).sum(-1)
    assert torch.allclose(F.entropy_from_logits(logits), ent_ref, atol=1e-5)


def test_non_contiguous_logits_slice(monkeypatch):
    monkeypatch.setattr(F, "_CHUNK_ELEMENTS", 16)
    torch.manual_seed(0)
    full = torch.randn(2, 6, 9)
    logits = full[:, 1:5]  # the usual logits[:, -L-1:-1] slice: not contiguous
    assert not logits.is_contiguous()
    labels = torch.randint(0, 9, (2, 4))
    ref = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(F.logprobs_from_logits(logits, labels), ref, atol=1e-6)
    ent = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    assert torch.allclose(F.entropy_from_logits(logits), ent, atol=1e-5)


def test_bf16_logits_are_computed_in_fp32():
    torch.manual_seed(0)
    logits = (torch.randn(2, 5, 50) * 5).to(torch.bfloat16)
    labels = torch.randint(0, 50, (2, 5))
    out = F.logprobs_from_logits(logits, labels)
    assert out.dtype == torch.float32
    ref = torch.log_softmax(logits.float(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(out, ref, atol=1e-5)
    assert F.entropy_from_logits(logits).dtype == torch.float32


def test_logprobs_label_shape_mismatch():
    with pytest.raises(AlgorithmInputError, match="labels shape"):
        F.logprobs_from_logits(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))


def test_entropy_hand_values():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3.0), -1e4, -1e4]])
    expected = [math.log(4.0), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))]
    assert torch.allclose(F.entropy_from_logits(logits), torch.tensor(expected), atol=1e-6)


def test_clip_by_value_with_tensor_and_scalar_bounds():
    x = torch.tensor([0.0, 1.0, 2.0])
    lo = torch.tensor([0.5, 0.5, 0.5])
    assert F.clip_by_value(x, lo, lo + 1.0).tolist() == [0.5, 1.0, 1.5]
    assert F.clip_by_value(x, 0.2, 1.5).tolist() == pytest.approx([0.2, 1.0, 1.5])
