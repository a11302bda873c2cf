"""Token-budget micro batches: balanced Karmarkar-Karp partitions, budgets respected, results
restored to the row order, and the same micro-batch count on every data-parallel rank."""

import itertools

import pytest
import torch

from hybridrl.errors import ConfigError
from hybridrl.protocol import DataProto
from hybridrl.workers.micro_batches import (
    karmarkar_karp,
    restore_order,
    split_micro_batches,
    token_budget_partitions,
)


def _sums(sizes, parts):
    return [sum(sizes[i] for i in p) for p in parts]


def _is_partition(parts, n):
    return sorted(i for p in parts for i in p) == list(range(n))


def test_karmarkar_karp_two_way_hand_case():
    # Differencing by hand: (8 | 7) d=1, (6 | 5) d=1, (4 | -) d=4; merge the two largest
    # differences: (4 | -) + (8 | 7) -> (4+7 | 8) d=3; then + (6 | 5) -> (4+7+5 | 8+6) d=2.
    # (The classic case where differencing misses the perfect 8+7 | 6+5+4.)
    sizes = [8, 7, 6, 5, 4]
    parts = karmarkar_karp(sizes, 2)
    assert sorted(parts) == [[0, 2], [1, 3, 4]]


def test_karmarkar_karp_three_way_hand_case():
    sizes = [3, 3, 3, 3, 3, 3]
    parts = karmarkar_karp(sizes, 3)
    assert _is_partition(parts, 6) and _sums(sizes, parts) == [6, 6, 6]


@pytest.mark.parametrize("k,equal_size", [(2, False), (3, False), (4, True), (2, True)])
@pytest.mark.parametrize("seed", range(4))
def test_karmarkar_karp_is_balanced(k, equal_size, seed):
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 200, (16,), generator=gen).tolist()
    parts = karmarkar_karp(sizes, k, equal_size=equal_size)
    assert len(parts) == k and _is_partition(parts, 16) and all(parts)
    if equal_size:
        assert all(len(p) == 16 // k for p in parts)
    sums = _sums(sizes, parts)
    assert max(sums) - min(sums) <= max(sizes)  # differencing never leaves more than one item's worth
    if k == 2 and not equal_size:  # close to the best split (brute force over 2**16 subsets)
        total = sum(sizes)
        best = min(abs(total - 2 * sum(c)) for r in range(9) for c in itertools.combinations(sizes, r))
        assert max(sums) - min(sums) <= best + max(sizes) // 4


def test_karmarkar_karp_rejects_bad_arguments():
    with pytest.raises(ValueError):
        karmarkar_karp([1, 2, 3], 0)
    with pytest.raises(ValueError, match="equal size"):
        karmarkar_karp([1, 2, 3], 2, equal_size=True)


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
    from hybridrl.trainer.config_check import validate_ppo_config

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
