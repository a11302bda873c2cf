"""The driver's side of rollout correction: the weights join the batch, rejection edits
response_mask, bypass mode swaps in the rollout log-probs, and a batch without them is one line."""

import pytest
import torch
from omegaconf import open_dict

from hybridrl.algorithms.rollout_corr import RolloutCorrectionConfig
from hybridrl.protocol import DataProto
from hybridrl.trainer.ppo.correction_stage import (
    RolloutCorrectionError,
    apply_bypass_mode,
    compute_rollout_correction_and_add_to_batch,
    share_rollout_correction,
)
from tests.tiny_models import ppo_config_with


def _batch(with_rollout=True):
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.1, -4.0]])
    tensors = {"old_log_probs": old, "response_mask": torch.tensor([[1, 1, 0], [1, 1, 1]])}
    if with_rollout:
        tensors["rollout_log_probs"] = old - torch.tensor([[0.1, 1.5, 0.0], [0.0, -0.2, 0.05]])
    return DataProto.from_dict(tensors=tensors)


def test_weights_join_the_batch_and_rejection_edits_the_mask():
    batch = _batch()
    corr = RolloutCorrectionConfig(rollout_is="token", rollout_rs="token_k1", rollout_rs_threshold=2.0)
    batch, metrics = compute_rollout_correction_and_add_to_batch(batch, corr)
    assert torch.equal(batch.batch["response_mask"], torch.tensor([[1, 0, 0], [1, 1, 1]]))  # e^1.5 > 2
    expected = torch.exp(torch.tensor([[0.1, 1.5, 0.0], [0.0, -0.2, 0.05]])).clamp(max=2.0)
    assert torch.allclose(batch.batch["rollout_is_weights"], expected * torch.tensor([[1, 1, 0], [1, 1, 1]]))
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1 / 5)


def test_bypass_mode_uses_the_rollout_log_probs_as_old_ones():
    batch = _batch()
    apply_bypass_mode(batch)
    assert torch.equal(batch.batch["old_log_probs"], batch.batch["rollout_log_probs"])


@pytest.mark.parametrize(
    "call",
    [
        apply_bypass_mode,
        lambda b: compute_rollout_correction_and_add_to_batch(b, RolloutCorrectionConfig(rollout_is="token")),
    ],
)
def test_a_batch_without_rollout_log_probs_names_the_engine_key(call):
    with pytest.raises(RolloutCorrectionError, match=r"set actor_rollout_ref.rollout.calculate_log_probs=true"):
        call(_batch(with_rollout=False))


def test_the_actor_gets_the_section_and_bypass_selects_its_loss():
    config = ppo_config_with(
        {
            "algorithm": {"rollout_correction": {"bypass_mode": True, "loss_type": "reinforce"}},
            "actor_rollout_ref": {"actor": {"policy_loss": {"loss_mode": "vanilla"}}},
        }
    )
    with open_dict(config):  # as run_ppo calls it
        share_rollout_correction(config)
    policy_loss = config.actor_rollout_ref.actor.policy_loss
    assert policy_loss.loss_mode == "bypass_mode" and policy_loss.rollout_correction.loss_type == "reinforce"
