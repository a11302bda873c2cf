"""Token-budget micro batches: budgets respected, results restored to the row order, and the
same micro-batch count on every data-parallel rank (the partitions: tests/data/test_partition.py)."""

import pytest
import torch

from hybridrl.errors import ConfigError
from hybridrl.protocol import DataProto
from hybridrl.workers.micro_batches import (
    restore_order,
    split_micro_batches,
    token_budget_partitions,
)


def _sums(sizes, parts):
    return [sum(sizes[i] for i in p) for p in parts]


def _is_partition(parts, n):
    return sorted(i for p in parts for i in p) == list(range(n))


def test_token_budget_partitions_respect_the_budget():
    seqlens = [900, 100, 500, 500, 300, 700, 50, 950]  # 4000 tokens
    parts = token_budget_partitions(seqlens, 1000, key="k")
    assert _is_partition(parts, 8)
    assert all(s <= 1000 for s in _sums(seqlens, parts))
    assert len(parts) == 4  # the volume bound, reached
    assert _sums(seqlens, parts) == sorted(_sums(seqlens, parts), reverse=True)  # longest first


def test_token_budget_smaller_than_a_row_is_a_config_error():
    with pytest.raises(ConfigError, match="actor.ppo_max_token_len_per_gpu=100 is smaller than a 120-token"):
        token_budget_partitions([50, 120], 100, key="actor.ppo_max_token_len_per_gpu")


def test_split_and_restore_order_round_trip():
    mask = (torch.arange(10)[None] < torch.tensor([3, 10, 1, 7, 5, 2])[:, None]).long()
    data = DataProto.from_dict(tensors={"attention_mask": mask, "row": torch.arange(6)})
    micros, order = split_micro_batches(data, None, use_dynamic_bsz=True, max_token_len=10)
    assert all(int(m.batch["attention_mask"].sum()) <= 10 for m in micros)
    concatenated = torch.cat([m.batch["row"] for m in micros])
    assert torch.equal(restore_order(concatenated, order), torch.arange(6))
    fixed, none = split_micro_batches(data, 4)
    assert none is None and [len(m) for m in fixed] == [4, 2]


def test_every_rank_runs_the_same_number_of_micro_batches(monkeypatch):
    """FSDP's collectives are lock-step: a rank whose rows fit in 1 micro batch runs as many as
    the rank that needs 3 (the all-reduce MAX is stubbed with the other rank's count)."""
    import hybridrl.workers.micro_batches as mb

    seen = []

    def other_rank_needs_three(count, device):
        seen.append(count)
        return max(count, 3)

    monkeypatch.setattr(mb, "max_across_ranks", other_rank_needs_three)
    seqlens = [100, 200, 150, 50]
    parts = mb.token_budget_partitions(seqlens, 1000, key="k")
    assert seen == [1] and len(parts) == 3 and _is_partition(parts, 4)


def test_startup_check_refuses_a_budget_below_the_longest_row():
    from hybridrl.config import load_config
    from hybridrl.trainer.ppo.config_check import validate_ppo_config

    base = [
        "data.max_prompt_length=300",
        "data.max_response_length=200",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
    ]
    validate_ppo_config(load_config(base + ["actor_rollout_ref.actor.ppo_max_token_len_per_gpu=500"]))
    with pytest.raises(ConfigError, match=r"rollout.log_prob_max_token_len_per_gpu=499 is smaller than .* = 500"):
        validate_ppo_config(
            load_config(
                base
                + [
                    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=600",
                    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=499",
                ]
            )
        )
