from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hybridrl.algorithms import (
    ADV_ESTIMATOR_NEEDS_GROUP,
    ADV_ESTIMATOR_REGISTRY,
    AlgorithmInputError,
    UnknownAlgorithmError,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    get_adv_estimator_fn,
    register_adv_est,
)

BUILTIN = {
    "gae",
    "grpo",
    "grpo_passk",
    "rloo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "opo",
    "gpg",
}
# the built-in estimators that compare the responses to one prompt (ReMax is not one: its
# baseline is a separate greedy response)
GROUP_ESTIMATORS = {"grpo", "grpo_passk", "rloo", "reinforce_plus_plus_baseline", "opo", "gpg"}

REWARDS = torch.tensor([[0.0, 0.0, 1.0]])
VALUES = torch.tensor([[0.5, 0.4, 0.3]])
MASK = torch.ones(1, 3)


def _whiten(x):
    x = torch.tensor(x)
    return (x - x.mean()) / torch.sqrt(x.var() + 1e-8)


def test_gae_gamma_lam_one_by_hand():
    # gamma = lam = 1: A_t = (sum of future rewards) - V_t = 1 - V_t
    adv, ret = compute_gae_advantage_return(REWARDS, VALUES, MASK, gamma=1.0, lam=1.0)
    assert torch.allclose(ret, torch.tensor([[1.0, 1.0, 1.0]]))
    # raw advantages [0.5, 0.6, 0.7]: mean 0.6, std 0.1 -> [-1, 0, 1]
    assert torch.allclose(adv, torch.tensor([[-1.0, 0.0, 1.0]]), atol=1e-5)


def test_gae_discounted_by_hand():
    # delta_2 = 1 - 0.3 = 0.7;             A_2 = 0.7
    # delta_1 = 0.9*0.3 - 0.4 = -0.13;     A_1 = -0.13 + 0.72*0.7   = 0.374
    # delta_0 = 0.9*0.4 - 0.5 = -0.14;     A_0 = -0.14 + 0.72*0.374 = 0.12928
    adv, ret = compute_gae_advantage_return(REWARDS, VALUES, MASK, gamma=0.9, lam=0.8)
    raw = [0.12928, 0.374, 0.7]
    assert torch.allclose(ret, torch.tensor([[0.62928, 0.774, 1.0]]), atol=1e-6)
    assert torch.allclose(adv[0], _whiten(raw), atol=1e-5)


def test_gae_masked_middle_token_equals_gae_without_it():
    torch.manual_seed(0)
    r = torch.randn(2, 5)
    v = torch.randn(2, 5)
    mask = torch.tensor([[1, 1, 0, 1, 1], [1, 1, 1, 1, 0]], dtype=torch.float32)
    r[0, 2], v[0, 2] = 1000.0, -1000.0  # must not leak from the observation token
    keep = [0, 1, 3, 4]
    r2 = torch.stack([torch.cat([r[0, keep], torch.zeros(1)]), r[1]])
    v2 = torch.stack([torch.cat([v[0, keep], torch.zeros(1)]), v[1]])
    mask2 = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 0]], dtype=torch.float32)
    adv, ret = compute_gae_advantage_return(r, v, mask, gamma=0.95, lam=0.9)
    adv2, ret2 = compute_gae_advantage_return(r2, v2, mask2, gamma=0.95, lam=0.9)
    assert torch.allclose(adv[0, keep], adv2[0, :4], atol=1e-5)
    assert torch.allclose(ret[0, keep], ret2[0, :4], atol=1e-5)
    assert torch.allclose(adv[1], adv2[1], atol=1e-5)
    assert adv[0, 2] == 0 and ret[0, 2] == 0 and adv[1, 4] == 0


def test_gae_shape_mismatch_is_clear():
    with pytest.raises(AlgorithmInputError, match="values has shape"):
        compute_gae_advantage_return(REWARDS, torch.zeros(1, 4), MASK, 1.0, 1.0)


def test_grpo_hand_values_and_single_group():
    rewards = torch.zeros(7, 2)
    rewards[:, 1] = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 1.0, 1.0])
    index = np.array(["a", "a", "a", "a", "b", "c", "c"], dtype=object)
    mask = torch.ones(7, 2)
    mask[0, 1] = 0
    adv, ret = compute_grpo_outcome_advantage(rewards, mask, index)
    # group a: mean 0.5, unbiased std sqrt(1/3); (±0.5)/sqrt(1/3) = ±0.8660254
    k = 0.5 / (1.0 / 3.0) ** 0.5
    expected = torch.tensor([k, -k, -k, k, 2.0, 0.0, 0.0])
    assert torch.allclose(adv[:, 0], expected, atol=1e-5)
    assert adv[0, 1] == 0.0  # masked token
    assert torch.allclose(adv[1:, 1], expected[1:], atol=1e-5)
    assert torch.equal(adv, ret)


def test_grpo_zero_mean_unit_std_per_group_and_dr_grpo():
    torch.manual_seed(0)
    rewards = torch.randn(12, 4)
    mask = torch.ones(12, 4)
    index = np.array([f"uid{i // 4}" for i in range(12)], dtype=object)
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, index, epsilon=0.0)
    scores = rewards.sum(-1)
    for g in range(3):
        a = adv[4 * g : 4 * g + 4, 0]
        assert a.mean().abs().item() < 1e-5
        assert a.std().item() == pytest.approx(1.0, abs=1e-5)
    adv_dr, _ = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    centred = scores - scores.view(3, 4).mean(-1).repeat_interleave(4)
    assert torch.allclose(adv_dr[:, 2], centred, atol=1e-6)


def test_grpo_index_errors():
    with pytest.raises(AlgorithmInputError, match="uid"):
        compute_grpo_outcome_advantage(torch.zeros(2, 3), torch.ones(2, 3), None)
    with pytest.raises(AlgorithmInputError, match="3 entries but the batch has 2"):
        compute_grpo_outcome_advantage(torch.zeros(2, 3), torch.ones(2, 3), np.array(["a", "b", "c"]))


def test_registry_driver_call_with_extra_kwargs():
    kwargs = dict(
        token_level_rewards=REWARDS,
        response_mask=MASK,
        values=VALUES,
        index=np.array(["x"]),
        gamma=1.0,
        lam=1.0,
        norm_adv_by_std_in_grpo=True,
        epsilon=1e-6,
    )
    adv, ret = get_adv_estimator_fn("gae")(**kwargs)
    assert torch.allclose(ret, torch.ones(1, 3))
    adv, ret = get_adv_estimator_fn("grpo")(**kwargs)
    assert torch.allclose(adv, torch.ones(1, 3))  # a group of one: advantage = score


def test_registry_unknown_name_and_custom_estimator():
    with pytest.raises(UnknownAlgorithmError, match="algorithm.adv_estimator") as err:
        get_adv_estimator_fn("nope")
    assert isinstance(err.value, ValueError)
    assert "gae" in str(err.value) and "grpo" in str(err.value)

    @register_adv_est("_test_zero")
    def zero(token_level_rewards, response_mask, **kwargs):
        return torch.zeros_like(token_level_rewards), torch.zeros_like(token_level_rewards)

    try:
        assert get_adv_estimator_fn("_test_zero") is zero
        with pytest.raises(ValueError, match="already registered"):
            register_adv_est("_test_zero")(lambda **kw: None)
    finally:
        ADV_ESTIMATOR_REGISTRY.pop("_test_zero")


def test_registry_lists_every_estimator_and_group_flags():
    assert BUILTIN <= set(ADV_ESTIMATOR_REGISTRY)
    assert BUILTIN & ADV_ESTIMATOR_NEEDS_GROUP == GROUP_ESTIMATORS
    assert not {"gae", "reinforce_plus_plus", "remax"} & ADV_ESTIMATOR_NEEDS_GROUP
    with pytest.raises(UnknownAlgorithmError) as err:
        get_adv_estimator_fn("grpo_typo")
    assert all(name in str(err.value) for name in BUILTIN)


def test_register_needs_group_for_user_estimators():
    @register_adv_est("_test_grouped", needs_group=True)
    def grouped(token_level_rewards, **kwargs):
        return token_level_rewards, token_level_rewards

    try:
        assert "_test_grouped" in ADV_ESTIMATOR_NEEDS_GROUP
        # The same function re-registered (a re-import) with the other flag updates the set.
        register_adv_est("_test_grouped")(grouped)
        assert "_test_grouped" not in ADV_ESTIMATOR_NEEDS_GROUP
    finally:
        ADV_ESTIMATOR_REGISTRY.pop("_test_grouped")  # ADV_ESTIMATOR_NEEDS_GROUP follows it


def test_gae_missing_values_says_what_to_do():
    with pytest.raises(AlgorithmInputError, match="values is None: the gae estimator needs the critic"):
        get_adv_estimator_fn("gae")(token_level_rewards=REWARDS, response_mask=MASK, values=None)


# ----------------------------------------------------------------------------- REINFORCE++
def test_reinforce_plus_plus_by_hand():
    # gamma = 0.5: G = [0 + 0.5 * 0.5, 0 + 0.5 * 1, 1] = [0.25, 0.5, 1.0]
    # mean 7/12, deviations [-4, -1, 5] / 12, unbiased var = 42 / 144 / 2 = 21 / 144
    adv, ret = compute_reinforce_plus_plus_outcome_advantage(REWARDS, MASK, gamma=0.5)
    assert torch.allclose(ret, torch.tensor([[0.25, 0.5, 1.0]]))
    assert torch.allclose(adv, torch.tensor([[-4.0, -1.0, 5.0]]) / 21**0.5, atol=1e-5)


def test_reinforce_plus_plus_masks_by_hand():
    # Trailing padding (reward 5 there) is ignored; gamma = 1 sums the future valid rewards.
    r = torch.tensor([[0.0, 1.0, 0.0, 2.0, 5.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    _, ret = compute_reinforce_plus_plus_outcome_advantage(r, m, gamma=1.0)
    assert torch.equal(ret, torch.tensor([[3.0, 3.0, 2.0, 2.0, 0.0]]))
    # An observation token inside the response: its reward 7 is ignored and no discount step is
    # taken there: G_2 = 2, G_0 = 1 + 0.5 * 2 = 2.
    _, ret = compute_reinforce_plus_plus_outcome_advantage(
        torch.tensor([[1.0, 7.0, 2.0]]), torch.tensor([[1.0, 0.0, 1.0]]), gamma=0.5
    )
    assert torch.equal(ret, torch.tensor([[2.0, 0.0, 2.0]]))


def test_reinforce_plus_plus_masked_middle_token_equals_deleting_it():
    torch.manual_seed(1)
    r = torch.randn(2, 5)
    mask = torch.tensor([[1, 1, 0, 1, 1], [1, 1, 1, 1, 0]], dtype=torch.float32)
    r[0, 2] = 1000.0
    r2 = torch.stack([torch.cat([r[0, [0, 1, 3, 4]], torch.zeros(1)]), r[1]])
    mask2 = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 0]], dtype=torch.float32)
    adv, ret = compute_reinforce_plus_plus_outcome_advantage(r, mask, gamma=0.9)
    adv2, ret2 = compute_reinforce_plus_plus_outcome_advantage(r2, mask2, gamma=0.9)
    assert torch.allclose(ret[0, [0, 1, 3, 4]], ret2[0, :4], atol=1e-6)
    assert torch.allclose(adv[0, [0, 1, 3, 4]], adv2[0, :4], atol=1e-5)
    assert adv[0, 2] == 0 and ret[0, 2] == 0 and adv[1, 4] == 0


def test_reinforce_plus_plus_gamma_is_a_plain_argument():
    _, ret = compute_reinforce_plus_plus_outcome_advantage(REWARDS, MASK, gamma=0.5)
    assert torch.allclose(ret, torch.tensor([[0.25, 0.5, 1.0]]))
    _, ret = compute_reinforce_plus_plus_outcome_advantage(REWARDS, MASK, gamma=1.0)
    assert torch.allclose(ret, torch.ones(1, 3))
    _, ret = compute_reinforce_plus_plus_outcome_advantage(REWARDS, MASK)
    assert torch.allclose(ret, torch.ones(1, 3))  # default gamma 1
    # a verl-style ``config`` keyword is swallowed by **kwargs, never read: gamma stays the argument
    _, ret = compute_reinforce_plus_plus_outcome_advantage(REWARDS, MASK, config=SimpleNamespace(gamma=0.5))
    assert torch.allclose(ret, torch.ones(1, 3))


# ----------------------------------------------------------------------------- ReMax
def test_remax_subtracts_greedy_baseline_by_hand():
    r = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    m = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = compute_remax_outcome_advantage(r, torch.tensor([0.5, 3.0]), m)
    assert torch.equal(ret, torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]]))
    assert torch.equal(adv, torch.tensor([[0.5, 0.5, 0.5], [-1.0, -1.0, 0.0]]))


def test_remax_baseline_errors():
    r, m = torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(AlgorithmInputError, match="trainer must generate the greedy baseline"):
        get_adv_estimator_fn("remax")(token_level_rewards=r, response_mask=m, reward_baselines=None)
    with pytest.raises(AlgorithmInputError, match=r"reward_baselines has shape \(2, 1\); it must be \(2,\)"):
        compute_remax_outcome_advantage(r, torch.zeros(2, 1), m)
    with pytest.raises(AlgorithmInputError, match="reward_baselines has NaN/inf at 1 positions"):
        compute_remax_outcome_advantage(r, torch.tensor([0.0, float("inf")]), m)


# ----------------------------------------------------------------------------- every estimator
def _driver_kwargs(rewards, mask, requires_grad=False):
    bs = rewards.shape[0]
    values = torch.randn(rewards.shape, requires_grad=requires_grad)
    return dict(
        token_level_rewards=rewards,
        response_mask=mask,
        values=values,
        index=np.array([f"p{i // 4}" for i in range(bs)], dtype=object),
        reward_baselines=torch.rand(bs),
        gamma=0.99,
        lam=0.95,
        norm_adv_by_std_in_grpo=True,
        epsilon=1e-6,
        config=None,
    )


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_every_estimator_driver_call_shapes_masks_no_grad(name):
    torch.manual_seed(0)
    rewards = torch.randn(8, 6, requires_grad=True)
    mask = torch.ones(8, 6)
    mask[0, 4:] = 0  # padding
    mask[1, 2] = 0  # an observation token inside the response
    adv, ret = get_adv_estimator_fn(name)(**_driver_kwargs(rewards, mask, requires_grad=True))
    assert adv.shape == ret.shape == (8, 6)
    assert not adv.requires_grad and not ret.requires_grad
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert (adv[mask == 0] == 0).all() and (ret[mask == 0] == 0).all()
    assert adv[mask == 1].abs().sum() > 0


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_every_estimator_rejects_nonfinite_rewards(name):
    rewards = torch.zeros(8, 3)
    rewards[2, 1], rewards[5, 2] = float("nan"), float("inf")
    with pytest.raises(AlgorithmInputError, match="token_level_rewards has NaN/inf at 2 positions"):
        get_adv_estimator_fn(name)(**_driver_kwargs(rewards, torch.ones(8, 3)))


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_every_estimator_rejects_bad_shapes(name):
    kwargs = _driver_kwargs(torch.zeros(8, 3), torch.ones(8, 3))
    with pytest.raises(AlgorithmInputError, match=r"token_level_rewards has shape \(8, 4\)"):
        get_adv_estimator_fn(name)(**{**kwargs, "token_level_rewards": torch.zeros(8, 4)})
    with pytest.raises(AlgorithmInputError, match="response_mask is .*2-D"):
        get_adv_estimator_fn(name)(**{**kwargs, "response_mask": torch.ones(8)})


@pytest.mark.parametrize("name", sorted(GROUP_ESTIMATORS))
def test_group_estimators_need_index(name):
    kwargs = _driver_kwargs(torch.zeros(8, 3), torch.ones(8, 3))
    with pytest.raises(AlgorithmInputError, match=r"index is None.*uid"):
        get_adv_estimator_fn(name)(**{**kwargs, "index": None})
    with pytest.raises(AlgorithmInputError, match="index has 3 entries but the batch has 8"):
        get_adv_estimator_fn(name)(**{**kwargs, "index": np.array(["a", "a", "b"], dtype=object)})


def test_verl_enum_members_and_vectorized_names_select_estimators():
    from enum import Enum

    from hybridrl.algorithms import (
        ADV_ESTIMATOR_NEEDS_GROUP,
        compute_grpo_outcome_advantage,
        compute_rloo_outcome_advantage,
        get_adv_estimator_fn,
        register_adv_est,
    )

    class AdvantageEstimator(str, Enum):  # as verl's
        GRPO = "grpo"
        MINE = "enum_registered_estimator"

    assert get_adv_estimator_fn(AdvantageEstimator.GRPO) is compute_grpo_outcome_advantage

    def mine(**kwargs):
        return None

    try:
        assert register_adv_est(AdvantageEstimator.MINE)(mine) is mine
        assert get_adv_estimator_fn("enum_registered_estimator") is mine
    finally:
        from hybridrl.algorithms.advantages import ADV_ESTIMATOR_REGISTRY

        ADV_ESTIMATOR_REGISTRY.pop("enum_registered_estimator")
    assert get_adv_estimator_fn("grpo_vectorized") is compute_grpo_outcome_advantage
    assert get_adv_estimator_fn("rloo_vectorized") is compute_rloo_outcome_advantage
    assert {"grpo_vectorized", "rloo_vectorized"} <= ADV_ESTIMATOR_NEEDS_GROUP
    # the registry's function takes gamma as the driver passes it, a plain keyword
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 2.0]])
    mask = torch.ones(2, 3)
    fn = get_adv_estimator_fn("reinforce_plus_plus")
    half, _ = fn(token_level_rewards=rewards, response_mask=mask, gamma=0.5)
    again, _ = fn(token_level_rewards=rewards, response_mask=mask, gamma=0.5, config=None)
    plain, _ = fn(token_level_rewards=rewards, response_mask=mask, gamma=1.0)
    assert torch.equal(half, again) and not torch.equal(half, plain)
