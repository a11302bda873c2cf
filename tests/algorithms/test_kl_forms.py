"""The straight-through ``<name>+`` KL forms and the exact ``full`` KL over the vocabulary."""

import pytest
import torch

from hybridrl.algorithms import AlgorithmInputError, FixedKLController, apply_kl_penalty, kl_penalty
from hybridrl.algorithms.kl import FULL_KL, KL_PENALTY_REGISTRY, kl_full_from_logits, kl_penalty_names


def _logps(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return -torch.rand(3, 5, generator=gen) * 3, -torch.rand(3, 5, generator=gen) * 3


@pytest.mark.parametrize("base", ["kl", "k1", "abs", "low_var_kl", "k3", "mse"])
def test_straight_through_has_value_of_base_and_gradient_of_k2(base):
    logp, ref = _logps()
    logp_st = logp.clone().requires_grad_(True)
    value = kl_penalty(logp_st, ref, base + "+")
    torch.testing.assert_close(value.detach(), kl_penalty(logp, ref, base))
    value.sum().backward()
    # d/dlogp of 0.5 * (logp - ref)^2 is (logp - ref): the gradient an unbiased KL loss needs.
    torch.testing.assert_close(logp_st.grad, logp - ref)


def test_straight_through_gradient_differs_from_the_plain_form():
    logp, ref = _logps(1)
    plain = logp.clone().requires_grad_(True)
    kl_penalty(plain, ref, "k3").sum().backward()
    # k3 = exp(ref - logp) + (logp - ref) - 1: its gradient is 1 - exp(ref - logp), not logp - ref.
    torch.testing.assert_close(plain.grad, 1 - torch.exp(ref - logp))
    assert not torch.allclose(plain.grad, logp - ref)


def test_full_kl_equals_sum_of_p_log_p_over_q():
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 3, 11, generator=gen)
    ref_logits = torch.randn(2, 3, 11, generator=gen)
    p, q = torch.softmax(logits, -1), torch.softmax(ref_logits, -1)
    by_hand = (p * (p.log() - q.log())).sum(-1)
    torch.testing.assert_close(kl_full_from_logits(logits, ref_logits), by_hand)
    torch.testing.assert_close(kl_full_from_logits(logits, ref_logits, chunk_rows=4), by_hand)
    # An independent implementation: torch.distributions.
    dist = torch.distributions.kl_divergence(
        torch.distributions.Categorical(logits=logits), torch.distributions.Categorical(logits=ref_logits)
    )
    torch.testing.assert_close(kl_full_from_logits(logits, ref_logits), dist)
    assert (by_hand >= 0).all()
    assert kl_full_from_logits(logits, logits).abs().max() < 1e-6


def test_full_kl_two_point_distribution_by_hand():
    # p = (0.5, 0.5), q = (0.25, 0.75): KL = 0.5 ln 2 + 0.5 ln(2/3)
    logits = torch.log(torch.tensor([[[0.5, 0.5]]]))
    ref_logits = torch.log(torch.tensor([[[0.25, 0.75]]]))
    expected = 0.5 * torch.log(torch.tensor(2.0)) + 0.5 * torch.log(torch.tensor(2 / 3))
    torch.testing.assert_close(kl_full_from_logits(logits, ref_logits)[0, 0], expected)


def test_full_kl_gradient_flows_into_actor_logits_only():
    logits = torch.randn(1, 2, 7, requires_grad=True)
    ref_logits = torch.randn(1, 2, 7, requires_grad=True)
    kl_full_from_logits(logits, ref_logits.detach()).sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
    assert ref_logits.grad is None


def test_full_needs_logits_and_shapes_must_match():
    logp, ref = _logps()
    with pytest.raises(AlgorithmInputError, match="kl_full_from_logits"):
        kl_penalty(logp, ref, FULL_KL)
    with pytest.raises(AlgorithmInputError, match="same"):
        kl_full_from_logits(torch.zeros(1, 2, 5), torch.zeros(1, 2, 6))


def test_apply_kl_penalty_uses_the_precomputed_full_kl():
    scores = torch.tensor([[0.0, 0.0, 1.0]])
    mask = torch.tensor([[1, 1, 1]])
    full = torch.tensor([[0.5, 1.0, 2.0]])
    rewards, metrics = apply_kl_penalty(scores, scores, scores, mask, FixedKLController(0.1), FULL_KL, full_kl=full)
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, -0.1, 0.8]]))
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(3.5 / 3)
    with pytest.raises(AlgorithmInputError, match="full_kl"):
        apply_kl_penalty(scores, scores, scores, mask, FixedKLController(0.1), FULL_KL)


def test_kl_penalty_names_lists_every_accepted_form():
    names = kl_penalty_names()
    assert FULL_KL in names
    for base in KL_PENALTY_REGISTRY:
        assert base in names and base + "+" in names
