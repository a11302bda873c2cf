"""Group-based outcome estimators: hand-computed cases, loop references, group-of-one rules."""

from collections import defaultdict

import numpy as np
import pytest
import torch

from hybridrl.algorithms import (
    AlgorithmConfigError,
    AlgorithmInputError,
    compute_gpg_outcome_advantage,
    compute_group_stats,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_rloo_outcome_advantage,
)


def _outcome(scores, length=2):
    """Rewards with each score on the last token, and a full mask: ``(bs, length)``."""
    rewards = torch.zeros(len(scores), length)
    rewards[:, -1] = torch.tensor(scores, dtype=torch.float32)
    return rewards, torch.ones(len(scores), length)


def _uids(*names):
    return np.array(names, dtype=object)


def _random_batch(seed, bs=23, n_prompts=6):
    """Random scores with interleaved uids and unequal group sizes (at least 2 per group)."""
    gen = torch.Generator().manual_seed(seed)
    groups = [i % n_prompts for i in range(bs)]
    perm = torch.randperm(bs, generator=gen).tolist()
    index = _uids(*[f"uid{groups[p]}" for p in perm])
    rewards = torch.randn(bs, 5, generator=gen)
    mask = (torch.rand(bs, 5, generator=gen) > 0.3).float()
    mask[:, 0] = 1
    return rewards, mask, index


def _groups(index):
    members = defaultdict(list)
    for i, uid in enumerate(index):
        members[uid].append(i)
    return members.values()


def test_group_stats_by_hand():
    stats = compute_group_stats(torch.tensor([1.0, 2.0, 3.0, 10.0]), _uids("x", "y", "x", "z"))
    assert stats.group.tolist() == [0, 1, 0, 2] and stats.num_groups == 3
    assert stats.count.tolist() == [2, 1, 2, 1]
    assert stats.mean.tolist() == [2, 2, 2, 10]
    # group x: deviations ±1, unbiased var 2; groups of one have std 0
    assert torch.allclose(stats.std, torch.tensor([2**0.5, 0.0, 2**0.5, 0.0]))


# ----------------------------------------------------------------------------- GRPO
def test_grpo_zero_mean_per_group_on_uneven_groups():
    rewards, mask, index = _random_batch(0)
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, index)
    seq = rewards.sum(-1)
    for members in _groups(index):
        a = torch.stack([adv[i][mask[i] > 0][0] for i in members])
        assert a.sum().abs() < 1e-4
        expected = (seq[members] - seq[members].mean()) / (seq[members].std() + 1e-6)
        assert torch.allclose(a, expected, atol=1e-5)


# ----------------------------------------------------------------------------- Pass@k
def test_passk_by_hand():
    # group a (positions 0, 2, 4) scores [0, 4, 2]: best is position 2, margin 4 - 2 = 2,
    # group std: mean 2, deviations [-2, 2, 0], unbiased var 8 / 2 = 4 -> std 2.
    # group b (positions 1, 3, 5) scores [1, 1, 0]: tie for the best -> all 0.
    rewards, mask = _outcome([0.0, 1.0, 4.0, 1.0, 2.0, 0.0])
    index = _uids("a", "b", "a", "b", "a", "b")
    adv, ret = compute_grpo_passk_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    assert torch.equal(adv[:, 0], torch.tensor([0.0, 0.0, 2.0, 0.0, 0.0, 0.0]))
    assert torch.equal(adv, ret)
    adv, _ = compute_grpo_passk_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=True)
    assert torch.allclose(adv[:, 1], torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0, 0.0]), atol=1e-6)


def test_passk_norm_flag_is_a_plain_argument():
    rewards, mask = _outcome([0.0, 4.0, 2.0])
    index = _uids("a", "a", "a")
    adv, _ = compute_grpo_passk_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    assert adv[1, 0] == 2.0
    adv, _ = compute_grpo_passk_outcome_advantage(rewards, mask, index)
    assert adv[1, 0] == pytest.approx(1.0, abs=1e-6)  # default: divide by std 2


def test_passk_one_nonzero_per_group_matches_loop():
    rewards, mask, index = _random_batch(1)
    adv, _ = compute_grpo_passk_outcome_advantage(rewards, mask, index, epsilon=1e-6)
    seq = rewards.sum(-1)
    for members in _groups(index):
        s = seq[members]
        a = adv[members, 0]  # token 0 is always valid
        top2 = sorted(s.tolist(), reverse=True)[:2]
        expected = torch.zeros(len(members))
        expected[int(s.argmax())] = (top2[0] - top2[1]) / (s.std().item() + 1e-6)
        assert (a != 0).sum() == 1
        assert torch.allclose(a, expected, atol=1e-5)


def test_passk_group_of_one_raises():
    rewards, mask = _outcome([1.0, 0.0, 1.0])
    msg = r"1 prompt\(s\) have one \(e.g. uid 'lonely'\).*rollout.n >= 2"
    with pytest.raises(AlgorithmInputError, match=msg):
        compute_grpo_passk_outcome_advantage(rewards, mask, _uids("a", "a", "lonely"))


# ----------------------------------------------------------------------------- RLOO
def test_rloo_by_hand_with_group_of_one():
    # a: [1, 0, 0, 1] -> 4/3 * (r - 0.5) = ±2/3 (e.g. 1 - mean(0, 0, 1) = 2/3)
    # b: [2, 5] -> 2 - 5 = -3, 5 - 2 = 3;  c: [3] alone -> no baseline, advantage = score
    rewards, mask = _outcome([1.0, 0.0, 0.0, 1.0, 2.0, 5.0, 3.0])
    adv, ret = compute_rloo_outcome_advantage(rewards, mask, _uids(*"aaaabbc"))
    t = 2.0 / 3.0
    assert torch.allclose(adv[:, 0], torch.tensor([t, -t, -t, t, -3.0, 3.0, 3.0]), atol=1e-6)
    assert torch.equal(adv, ret)


def test_rloo_equals_explicit_leave_one_out_loop():
    rewards, mask, index = _random_batch(2)
    adv, _ = compute_rloo_outcome_advantage(rewards, mask, index)
    seq = rewards.sum(-1)
    for members in _groups(index):
        for i in members:
            others = [seq[j] for j in members if j != i]
            expected = seq[i] - sum(others) / len(others)
            assert torch.allclose(adv[i][mask[i] > 0], expected.expand(int(mask[i].sum())), atol=1e-5)
            assert (adv[i][mask[i] == 0] == 0).all()


# ----------------------------------------------------------------------------- REINFORCE++ baseline
def test_reinforce_plus_plus_baseline_by_hand():
    # centred [0.5, -0.5] on 2 tokens each: token values [.5, .5, -.5, -.5], mean 0,
    # unbiased var 4 * 0.25 / 3 = 1/3 -> 0.5 / sqrt(1/3) = sqrt(3) / 2
    rewards, mask = _outcome([1.0, 0.0])
    adv, ret = compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, _uids("a", "a"))
    k = 3**0.5 / 2
    assert torch.allclose(adv, torch.tensor([[k, k], [-k, -k]]), atol=1e-5)
    assert torch.equal(adv, ret)


def test_reinforce_plus_plus_baseline_group_of_one_and_mask():
    # a: [1, 0] -> [0.5, -0.5]; b: [2] alone -> no baseline, 2. One valid token each (the
    # second column is padding). Whitening [0.5, -0.5, 2]: mean 2/3, deviations
    # [-1/6, -7/6, 8/6], unbiased var (1 + 49 + 64) / 36 / 2 = 57/36.
    rewards, _ = _outcome([1.0, 0.0, 2.0])
    rewards = rewards.flip(-1)
    mask = torch.tensor([[1.0, 0.0]] * 3)
    adv, _ = compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, _uids("a", "a", "b"))
    expected = torch.tensor([-1.0, -7.0, 8.0]) / 6 / (57 / 36) ** 0.5
    assert torch.allclose(adv[:, 0], expected, atol=1e-5)
    assert (adv[:, 1] == 0).all()


# ----------------------------------------------------------------------------- OPO
def test_opo_length_weighted_baseline_by_hand():
    # a: scores [1, 0] with lengths [3, 1]: b = (3 * 1 + 1 * 0) / 4 = 0.75 (a plain mean would be
    # 0.5) -> [0.25, -0.75]. b: a group of one (score 2): baseline 0 -> 2.
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    rewards = torch.zeros(3, 4)
    rewards[0, 2], rewards[2, 1] = 1.0, 2.0
    adv, ret = compute_opo_outcome_advantage(rewards, mask, _uids("a", "a", "b"))
    expected = torch.tensor([[0.25, 0.25, 0.25, 0.0], [-0.75, 0.0, 0.0, 0.0], [2.0, 2.0, 0.0, 0.0]])
    assert torch.allclose(adv, expected)
    assert torch.equal(adv, ret)


def test_opo_with_equal_lengths_is_dr_grpo():
    rewards, _, index = _random_batch(3)
    mask = torch.ones_like(rewards)
    opo, _ = compute_opo_outcome_advantage(rewards, mask, index)
    dr_grpo, _ = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    assert torch.allclose(opo, dr_grpo, atol=1e-5)


# ----------------------------------------------------------------------------- GPG
def test_gpg_by_hand():
    # 6 responses, 2 with a non-zero score -> alpha = 6 / 2 = 3.
    # a: [1, 0, 0, 1] -> 3 * (r - 0.5) = ±1.5;  b: [0, 0] -> 0.
    rewards, mask = _outcome([1.0, 0.0, 0.0, 1.0, 0.0, 0.0])
    index = _uids(*"aaaabb")
    adv, ret = compute_gpg_outcome_advantage(rewards, mask, index)
    assert torch.allclose(adv[:, 0], torch.tensor([1.5, -1.5, -1.5, 1.5, 0.0, 0.0]))
    assert torch.equal(adv, ret)
    # norm_adv_by_std_in_grpo is ignored (as in verl); f_norm divides.
    same, _ = compute_gpg_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    assert torch.equal(adv, same)
    half, _ = compute_gpg_outcome_advantage(rewards, mask, index, f_norm=2.0)
    assert torch.allclose(half, adv / 2)


def test_gpg_group_of_one_and_all_zero_batch():
    # 3 responses, 2 non-zero -> alpha 1.5; a: [1, 0] -> ±0.75; c alone: 1.5 * 2 = 3.
    rewards, mask = _outcome([1.0, 0.0, 2.0])
    adv, _ = compute_gpg_outcome_advantage(rewards, mask, _uids("a", "a", "c"))
    assert torch.allclose(adv[:, 1], torch.tensor([0.75, -0.75, 3.0]))
    rewards, mask = _outcome([0.0, 0.0])
    adv, _ = compute_gpg_outcome_advantage(rewards, mask, _uids("a", "a"))
    assert torch.equal(adv, torch.zeros(2, 2))


def test_gpg_rejects_bad_f_norm():
    rewards, mask = _outcome([1.0, 0.0])
    with pytest.raises(AlgorithmConfigError, match="f_norm=0.0 must be a positive number"):
        compute_gpg_outcome_advantage(rewards, mask, _uids("a", "a"), f_norm=0.0)
