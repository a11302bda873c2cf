"""The optimal token baseline against its definition (a reference written step by step on small
groups): per-step weighted baselines, the zero tail, multi-turn step counting, rollout weights."""

import numpy as np
import pytest
import torch

from hybridrl.algorithms import get_adv_estimator_fn
from hybridrl.algorithms.errors import AlgorithmInputError

OTB = get_adv_estimator_fn("optimal_token_baseline")


def reference(rewards, mask, index, old_log_probs, spi2, rho=None, zero_tail=True):
    """B_t = sum_i G_t,i W_t,i / sum_i W_t,i over the group's responses that reach step t."""
    bs = rewards.shape[0]
    steps = [[t for t in range(mask.shape[1]) if mask[i, t]] for i in range(bs)]
    G = [[float((rewards[i] * mask[i])[t:].sum()) for t in steps[i]] for i in range(bs)]
    w = 1 - 2 * torch.exp(old_log_probs) + spi2
    if rho is not None:
        w = w * rho**2
    W = [list(np.cumsum([float(w[i, t]) for t in steps[i]])) for i in range(bs)]
    adv = torch.zeros_like(rewards)
    for i in range(bs):
        group = [j for j in range(bs) if index[j] == index[i]]
        lengths = sorted(len(steps[j]) for j in group)
        for k, t in enumerate(steps[i]):
            if len(group) == 1:
                base = 0.0
            elif (
                zero_tail
                and len(steps[i]) == lengths[-1] > lengths[-2]
                and k >= lengths[-2]
                and sum(len(steps[j]) == lengths[-1] for j in group) == 1
            ):
                base = 0.0
            else:
                reach = [j for j in group if len(steps[j]) > k]
                base = sum(G[j][k] * W[j][k] for j in reach) / (sum(W[j][k] for j in reach) + 1e-8)
            adv[i, t] = G[i][k] - base
    return adv


def batch(mask, seed=0):
    gen = torch.Generator().manual_seed(seed)
    mask = torch.tensor(mask, dtype=torch.float32)
    rewards = torch.zeros_like(mask)
    for i in range(mask.shape[0]):  # an outcome reward on the last generated token
        rewards[i, int(mask[i].nonzero().max())] = float(torch.rand(1, generator=gen))
    old_log_probs = -torch.rand(mask.shape, generator=gen) * 3
    spi2 = torch.rand(mask.shape, generator=gen) * 0.5 + 0.1
    return rewards, mask, old_log_probs, spi2


@pytest.mark.parametrize(
    "mask, index",
    [
        ([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 0]], ["a", "a", "a"]),  # two equally long: no tail
        ([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]], ["a", "a", "a", "b"]),  # tail; group of one
        ([[1, 1, 0, 0, 1, 1], [1, 0, 0, 1, 1, 0], [1, 1, 1, 1, 0, 0]], ["a", "a", "a"]),  # observation tokens
    ],
)
def test_matches_the_definition(mask, index):
    rewards, mask, old, spi2 = batch(mask)
    adv, returns = OTB(
        token_level_rewards=rewards,
        response_mask=mask,
        index=np.array(index, dtype=object),
        old_log_probs=old,
        sum_pi_squared=spi2,
    )
    assert torch.allclose(adv, reference(rewards, mask, index, old, spi2), atol=1e-5)
    assert torch.equal(adv * (1 - mask), torch.zeros_like(adv))
    assert torch.allclose(returns, (rewards * mask).flip(-1).cumsum(-1).flip(-1))


def test_rollout_weights_rescale_the_path_weights_and_the_tail_switch_works():
    rewards, mask, old, spi2 = batch([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]], seed=1)
    index = np.array(["a"] * 3, dtype=object)
    rho = torch.tensor([[2.0], [0.5], [1.0]]).expand_as(mask)
    adv, _ = OTB(
        token_level_rewards=rewards,
        response_mask=mask,
        index=index,
        old_log_probs=old,
        sum_pi_squared=spi2,
        rollout_is_weights=rho,
    )
    assert torch.allclose(adv, reference(rewards, mask, index, old, spi2, rho=rho), atol=1e-5)
    no_tail, _ = OTB(
        token_level_rewards=rewards,
        response_mask=mask,
        index=index,
        old_log_probs=old,
        sum_pi_squared=spi2,
        handle_zero_tail=False,
    )
    assert torch.allclose(no_tail, reference(rewards, mask, index, old, spi2, zero_tail=False), atol=1e-5)
    assert not torch.allclose(no_tail[0, 3], adv[0, 3])


def test_the_multi_turn_name_and_a_missing_input():
    assert get_adv_estimator_fn("tir_optimal_token_baseline") is OTB
    rewards, mask, old, _ = batch([[1, 1], [1, 0]])
    with pytest.raises(AlgorithmInputError, match=r"set actor_rollout_ref.actor.calculate_sum_pi_squared=true"):
        OTB(token_level_rewards=rewards, response_mask=mask, index=np.array(["a", "a"]), old_log_probs=old)
