"""reward_model.on_error on the driver: mask_sample masks the failed sample, drop_group its whole
prompt group (removed when dynamic sampling refills the batch), with the counts as metrics."""

import numpy as np
import pytest
import torch

from hybridrl.protocol import DataProto
from hybridrl.trainer.ppo.stages import apply_reward_failures


def scored(errors, timeouts=None):
    rows = len(errors)
    return DataProto.from_dict(
        tensors={"response_mask": torch.ones(rows, 3, dtype=torch.long), "token_level_scores": torch.zeros(rows, 3)},
        non_tensors={
            "uid": np.array([f"g{i // 2}" for i in range(rows)], dtype=object),
            "reward_error": np.array(errors, dtype=object),
            "reward_timeout": np.array(timeouts or [0.0] * rows, dtype=object),
        },
    )


def test_mask_sample_masks_only_the_failed_sample():
    batch, metrics = apply_reward_failures(scored([0.0, 1.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]), "mask_sample", False)
    assert batch.batch["response_mask"].sum(-1).tolist() == [3, 0, 3, 3]
    assert metrics == {"reward/error_count": 1.0, "reward/timeout_count": 1.0, "reward/masked_samples": 1.0}


def test_drop_group_masks_the_group_or_removes_it_for_dynamic_sampling():
    batch, metrics = apply_reward_failures(scored([0.0, 1.0, 0.0, 0.0]), "drop_group", drop_rows=False)
    assert batch.batch["response_mask"].sum(-1).tolist() == [0, 0, 3, 3] and metrics["reward/dropped_groups"] == 1.0
    batch, _ = apply_reward_failures(scored([0.0, 1.0, 0.0, 0.0]), "drop_group", drop_rows=True)
    assert list(batch.non_tensor_batch["uid"]) == ["g1", "g1"]


@pytest.mark.parametrize("policy", ["zero", "raise", "retry"])
def test_other_policies_only_count(policy):
    batch, metrics = apply_reward_failures(scored([1.0, 0.0]), policy, False)
    assert batch.batch["response_mask"].sum().item() == 6 and metrics["reward/error_count"] == 1.0
