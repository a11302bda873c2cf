"""The step plan: which passes a step runs, from the config and the estimators' registered needs."""

import pytest

from hybridrl.algorithms.advantages import ADV_ESTIMATORS, register_adv_est
from hybridrl.algorithms.config import algo_config
from hybridrl.config import ConfigError, load_config
from hybridrl.trainer.ppo.async_checks import check_async_modes, check_one_step_off
from hybridrl.trainer.ppo.step_plan import make_step_plan

ON_POLICY = ["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8"]


def _plan(*overrides):
    config = load_config([*ON_POLICY, *overrides])
    return make_step_plan(config, algo_config(config))


def test_grpo_on_policy_runs_no_critic_no_reference_and_reuses_the_update_log_probs():
    plan = _plan("algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=false")
    assert (plan.use_critic, plan.reward_baselines, plan.use_reference_policy, plan.ref_log_prob) == (False,) * 4
    assert plan.old_log_probs == "update" and plan.on_policy


@pytest.mark.parametrize(
    "overrides, source",
    [
        (["actor_rollout_ref.actor.ppo_mini_batch_size=4"], "compute"),  # two mini batches: off policy after the first
        (["trainer.one_step_off_policy=true"], "compute"),
        (["algorithm.rollout_correction.bypass_mode=true"], "rollout"),
    ],
)
def test_where_old_log_probs_come_from(overrides, source):
    plan = _plan("algorithm.adv_estimator=grpo", *overrides)
    assert plan.old_log_probs == source and plan.on_policy is (source == "update")


def test_kl_forms_decide_the_reference_passes():
    in_reward = _plan("algorithm.use_kl_in_reward=true", "algorithm.kl_penalty=full")
    assert in_reward.ref_log_prob and in_reward.ref_full_kl and in_reward.use_reference_policy
    full_loss = _plan("actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_type=full")
    assert full_loss.use_reference_policy and not full_loss.ref_log_prob  # the update reads the reference's logits
    low_var = _plan("actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_type=low_var_kl")
    assert low_var.ref_log_prob and not low_var.ref_full_kl


@pytest.fixture
def estimator():
    """Registers a test estimator with the given needs; forgotten afterwards."""
    names = []

    def make(name, **needs):
        register_adv_est(name, **needs)(lambda **kwargs: None)
        names.append(name)
        return name

    yield make
    for name in names:
        ADV_ESTIMATORS.unregister(name)


def test_needs_come_from_the_registry_not_from_names(estimator):
    assert _plan("algorithm.adv_estimator=gae").use_critic
    assert _plan("algorithm.adv_estimator=remax").reward_baselines
    critic_one = estimator("my_value_baseline", needs_values=True)
    greedy_one = estimator("my_greedy_baseline", needs_reward_baselines=True)
    assert _plan(f"algorithm.adv_estimator={critic_one}").use_critic
    plan = _plan(f"algorithm.adv_estimator={greedy_one}")
    assert plan.reward_baselines and not plan.use_critic


def test_asynchronous_modes_refuse_any_estimator_that_needs_greedy_baselines(estimator):
    name = estimator("my_greedy_baseline", needs_reward_baselines=True)
    off = load_config(
        ["trainer.one_step_off_policy=true", "actor_rollout_ref.rollout.name=vllm", f"algorithm.adv_estimator={name}"]
    )
    with pytest.raises(ConfigError, match=f"algorithm.adv_estimator={name}: its greedy baselines"):
        check_one_step_off(off, algo_config(off).rollout_correction)
    stream = load_config(
        [
            "trainer.v1.trainer_mode=separate_async",
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.mode=async",
            f"algorithm.adv_estimator={name}",
        ]
    )
    with pytest.raises(ConfigError, match=f"algorithm.adv_estimator={name}: its greedy baselines"):
        check_async_modes(stream, algo_config(stream).rollout_correction)
