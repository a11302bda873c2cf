import torch

from hybridrl.protocol import DataProto
from hybridrl.trainer.ppo.stages import trim_left_padding


def _gen_batch(mask):
    mask = torch.tensor(mask)
    ids = torch.arange(mask.numel()).reshape(mask.shape) * mask
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": mask, "position_ids": pos}, non_tensors={"uid": ["a", "b"]}
    )


def test_trim_left_padding_drops_only_columns_that_are_padding_everywhere():
    batch = _gen_batch([[0, 0, 0, 1, 1], [0, 0, 1, 1, 1]])
    trimmed = trim_left_padding(batch)
    assert trimmed.batch["input_ids"].shape == (2, 3)
    assert torch.equal(trimmed.batch["input_ids"], batch.batch["input_ids"][:, 2:])
    assert torch.equal(trimmed.batch["position_ids"], torch.tensor([[0, 0, 1], [0, 1, 2]]))
    assert list(trimmed.non_tensor_batch["uid"]) == ["a", "b"]


def test_trim_left_padding_keeps_a_batch_without_common_padding():
    batch = _gen_batch([[1, 1], [0, 1]])
    assert trim_left_padding(batch) is batch


def test_compute_advantage_stops_on_non_finite_input_naming_tensor_and_step():
    import pytest

    from hybridrl.algorithms.errors import NonFiniteError
    from hybridrl.trainer.ppo.stages import compute_advantage

    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    values = torch.tensor([[0.1, float("inf"), 0.0], [0.2, 0.0, 0.0]])  # a broken critic
    data = DataProto.from_dict(
        tensors={
            "token_level_rewards": torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]),
            "response_mask": mask,
            "values": values,
        },
        non_tensors={"uid": ["a", "b"]},
        meta_info={"global_steps": 3},
    )
    with pytest.raises(NonFiniteError, match="step 3: values"):
        compute_advantage(data, "gae")
    values[0, 1] = 0.3  # finite again: advantages fill in, padding included as zeros
    out = compute_advantage(data, "gae")
    assert torch.isfinite(out.batch["advantages"]).all()
    assert out.batch["advantages"][0, 2] == 0


def test_reuses_update_log_probs_only_for_a_single_on_policy_step():
    from hybridrl.algorithms.config import algo_config
    from hybridrl.config import load_config
    from hybridrl.trainer.ppo.step_plan import reuses_update_log_probs

    def reuses(config):
        return reuses_update_log_probs(config, algo_config(config))

    base = ["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8"]
    assert reuses(load_config(base))
    assert not reuses(load_config(base + ["actor_rollout_ref.actor.ppo_epochs=2"]))
    assert not reuses(load_config(["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4"]))
    assert not reuses(load_config(base + ["algorithm.use_kl_in_reward=true"]))
    assert not reuses(load_config(base + ["actor_rollout_ref.actor.skip_on_policy_old_log_prob=false"]))
