"""Bradley-Terry reward loss and preference accuracy on hand-computed scores."""

import math

import pytest
import torch

from hybridrl.algorithms.errors import AlgorithmInputError
from hybridrl.algorithms.reward_loss import compute_bradley_terry_loss, compute_preference_accuracy


def _bt(diff: float) -> float:
    return -math.log(1.0 / (1.0 + math.exp(-diff)))


def test_loss_matches_hand_computed_values():
    chosen = torch.tensor([2.0, 0.0, -1.0])
    rejected = torch.tensor([1.0, 0.0, 1.0])  # gaps 1, 0, -2
    expected = (_bt(1.0) + math.log(2.0) + _bt(-2.0)) / 3  # 0.3133 + 0.6931 + 2.1269
    assert compute_bradley_terry_loss(chosen, rejected).item() == pytest.approx(expected, rel=1e-6)


def test_margin_is_subtracted_from_the_gap_per_pair_or_for_all():
    chosen, rejected = torch.tensor([3.0, 1.0]), torch.tensor([1.0, 1.0])  # gaps 2, 0
    per_pair = compute_bradley_terry_loss(chosen, rejected, margin=torch.tensor([1.0, 0.5]))
    assert per_pair.item() == pytest.approx((_bt(1.0) + _bt(-0.5)) / 2, rel=1e-6)
    constant = compute_bradley_terry_loss(chosen, rejected, margin=2.0)
    assert constant.item() == pytest.approx((_bt(0.0) + _bt(-2.0)) / 2, rel=1e-6)
    # a margin makes the same scores cost more: the model must win by at least that much
    assert constant > compute_bradley_terry_loss(chosen, rejected)


def test_loss_is_stable_for_large_gaps_and_depends_only_on_the_gap():
    big = compute_bradley_terry_loss(torch.tensor([-500.0]), torch.tensor([500.0]))
    assert big.item() == pytest.approx(1000.0, rel=1e-6)  # -log sigmoid(-1000) = 1000 (+ e^-1000)
    assert compute_bradley_terry_loss(torch.tensor([500.0]), torch.tensor([-500.0])).item() == 0.0
    a, b = torch.randn(8), torch.randn(8)
    assert torch.allclose(compute_bradley_terry_loss(a, b), compute_bradley_terry_loss(a + 7.0, b + 7.0))


def test_gradient_is_sigmoid_of_minus_the_gap_over_pairs():
    chosen = torch.tensor([0.5, -0.2], requires_grad=True)
    rejected = torch.tensor([0.0, 0.3], requires_grad=True)
    compute_bradley_terry_loss(chosen, rejected).backward()
    expected = -torch.sigmoid(-(chosen - rejected).detach()) / 2
    assert torch.allclose(chosen.grad, expected)
    assert torch.allclose(rejected.grad, -expected)


def test_accuracy_counts_ties_as_half():
    chosen = torch.tensor([1.0, 0.0, 2.0, 5.0])
    rejected = torch.tensor([0.0, 0.0, 3.0, 4.0])  # win, tie, loss, win
    assert compute_preference_accuracy(chosen, rejected).item() == pytest.approx(2.5 / 4)
    zeros = torch.zeros(6)
    assert compute_preference_accuracy(zeros, zeros).item() == 0.5  # an untrained zero head: chance


@pytest.mark.parametrize(
    "chosen, rejected, margin",
    [
        (torch.zeros(3), torch.zeros(2), None),
        (torch.zeros(2, 1), torch.zeros(2, 1), None),
        (torch.zeros(0), torch.zeros(0), None),
        (torch.zeros(3), torch.zeros(3), torch.zeros(2)),
    ],
)
def test_bad_shapes_are_refused(chosen, rejected, margin):
    with pytest.raises(AlgorithmInputError, match="num_pairs|0 pairs"):
        compute_bradley_terry_loss(chosen, rejected, margin)
