import pytest
import torch

from hybridrl.algorithms import AlgorithmConfigError, compute_value_loss


def test_clipped_value_loss_by_hand():
    vpreds = torch.tensor([[1.0, 2.0, 0.0, 50.0]], requires_grad=True)
    values = torch.full((1, 4), 0.5)
    returns = torch.ones(1, 4)
    mask = torch.tensor([[1, 1, 1, 0]])
    # t0: clip 1.0 -> 0.7: max(0, 0.09) = 0.09 (clipped term wins)
    # t1: clip 2.0 -> 0.7: max(1, 0.09) = 1;  t2: clip 0 -> 0.3: max(1, 0.49) = 1
    loss, clipfrac = compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.2)
    assert loss.item() == pytest.approx(0.5 * (0.09 + 1.0 + 1.0) / 3)
    assert clipfrac.item() == pytest.approx(1.0 / 3.0)
    loss.backward()
    # t0 is clipped (no gradient); t1: 0.5*2*(2-1)/3; t2: 0.5*2*(0-1)/3; t3 masked
    assert torch.allclose(vpreds.grad, torch.tensor([[0.0, 1 / 3, -1 / 3, 0.0]]))


def test_value_loss_seq_mode_and_error():
    vpreds = torch.tensor([[2.0, 2.0], [3.0, 0.0]])
    loss, _ = compute_value_loss(
        vpreds, torch.zeros(2, 2), vpreds, torch.tensor([[1, 1], [1, 0]]), 0.5, loss_agg_mode="seq-mean-token-sum"
    )
    assert loss.item() == pytest.approx(0.5 * (8.0 + 9.0) / 2)
    with pytest.raises(AlgorithmConfigError, match="cliprange_value"):
        compute_value_loss(vpreds, vpreds, vpreds, torch.ones(2, 2), -1.0)
