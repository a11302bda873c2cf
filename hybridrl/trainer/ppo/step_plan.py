"""The step plan: which passes one PPO step runs, decided once from the config.

The driver builds a :class:`StepPlan` when it starts and follows it; the worker methods get what
it decided as explicit arguments (``update_actor(batch, on_policy=...)``,
``compute_ref_log_prob(batch, full_kl=...)``). What an advantage estimator needs comes from its
registry entry (``needs_values``, ``needs_reward_baselines``), never from its name.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridrl.algorithms.advantages import estimator_needs
from hybridrl.algorithms.config import AlgoConfig
from hybridrl.algorithms.kl import FULL_KL

__all__ = [
    "StepPlan",
    "make_step_plan",
    "needs_critic",
    "needs_reference_policy",
    "reuses_update_log_probs",
    "OLD_LOG_PROB_SOURCES",
]

# Where old_log_probs come from: the actor's own pass before the update; the rollout's log-probs
# (rollout correction's bypass mode); the update's own, detached (on policy, the pass skipped).
OLD_LOG_PROB_SOURCES = ("compute", "rollout", "update")


@dataclass(frozen=True)
class StepPlan:
    """What one training step runs.

    Attributes:
        use_critic: a critic computes ``values`` and is updated (the estimator ``needs_values``: GAE).
        reward_baselines: the greedy responses are generated and scored for ``reward_baselines``
            (the estimator ``needs_reward_baselines``: ReMax).
        use_reference_policy: a reference policy is loaded (KL in the reward or as a loss).
        ref_log_prob: the reference pass runs (KL in the reward, or a KL loss other than ``full``,
            which reads the reference's logits inside the update).
        ref_full_kl: the reference pass also returns ``full_kl``, the exact per-token KL over the
            vocabulary (``algorithm.kl_penalty=full`` in the reward).
        old_log_probs: one of :data:`OLD_LOG_PROB_SOURCES`.
        teacher: the distillation teachers score the responses (``distillation.enabled``;
            ``timing_s/teacher``) and the actor trains on the distillation loss.
    """

    use_critic: bool
    reward_baselines: bool
    use_reference_policy: bool
    ref_log_prob: bool
    ref_full_kl: bool
    old_log_probs: str
    teacher: bool = False

    @property
    def on_policy(self) -> bool:
        """The update uses its own log-probs as the old ones (``old_log_probs == "update"``)."""
        return self.old_log_probs == "update"


def needs_critic(config) -> bool:
    """The estimator needs a learned value baseline (``needs_values``: GAE); the group-based ones do not.

    The one place that decides whether a run builds and trains a critic: the start-up check, the
    memory plan, the worker groups and :attr:`StepPlan.use_critic` all ask it."""
    return estimator_needs(config.algorithm.adv_estimator, "needs_values")


def needs_reference_policy(config) -> bool:
    """A reference policy is loaded when KL is used, in the reward or as a loss."""
    return bool(config.algorithm.use_kl_in_reward or config.actor_rollout_ref.actor.use_kl_loss)


def reuses_update_log_probs(config, algo: AlgoConfig) -> bool:
    """True when each batch makes exactly one optimizer step and nothing reads the old log-probs
    before it: then ``old_log_probs`` equal the update's own log-probs (detached), and the
    separate ``compute_log_prob`` pass is skipped (``actor.skip_on_policy_old_log_prob``).

    On policy means ``ppo_epochs == 1`` and one mini batch per batch
    (``ppo_mini_batch_size >= data.train_batch_size``); a KL penalty in the reward reads
    ``old_log_probs`` before the update, and so do rollout correction's weights and rejection
    (decoupled mode), so they need the pass, as does the optimal token baseline (``sum_pi_squared``
    comes from it). Bypass mode needs it never (see :func:`make_step_plan`). With
    ``trainer.one_step_off_policy`` or an asynchronous ``trainer.v1.trainer_mode`` no batch is on
    policy (its samples are one or more updates old), so the pass always runs.

    Args:
        config: the run's ``ppo_trainer`` config.
        algo: its typed ``algorithm`` section (:func:`~hybridrl.algorithms.config.algo_config`).
    """
    actor = config.actor_rollout_ref.actor
    corrects_before_update = algo.rollout_correction.corrects  # weights/rejection read old_log_probs
    if config.trainer.one_step_off_policy or config.trainer.v1.trainer_mode != "sync":
        return False
    return bool(
        actor.skip_on_policy_old_log_prob
        and int(actor.ppo_epochs) == 1
        and int(actor.ppo_mini_batch_size) >= int(config.data.train_batch_size)
        and not algo.use_kl_in_reward
        and not corrects_before_update
        and not actor.calculate_sum_pi_squared
    )  # the pass makes sum_pi_squared


def make_step_plan(config, algo: AlgoConfig) -> StepPlan:
    """The plan of a run's steps.

    Args:
        config: a resolved ``ppo_trainer`` config.
        algo: its typed ``algorithm`` section (``run_ppo`` types it once).
    """
    actor = config.actor_rollout_ref.actor
    if algo.rollout_correction.bypass_mode:
        old_log_probs = "rollout"
    elif reuses_update_log_probs(config, algo):
        old_log_probs = "update"
    else:
        old_log_probs = "compute"
    return StepPlan(
        use_critic=needs_critic(config),
        reward_baselines=estimator_needs(algo.adv_estimator, "needs_reward_baselines"),
        use_reference_policy=needs_reference_policy(config),
        ref_log_prob=bool(algo.use_kl_in_reward or (actor.use_kl_loss and actor.kl_loss_type != FULL_KL)),
        ref_full_kl=bool(algo.use_kl_in_reward and algo.kl_penalty == FULL_KL),
        old_log_probs=old_log_probs,
        teacher=bool(config.distillation.enabled),
    )
