"""Start-up checks of the asynchronous trainers (docs/async.md): ``trainer.one_step_off_policy``
and ``trainer.v1.trainer_mode=colocate_async|separate_async``.

One-step-off-policy training generates batch t+1 while the actor trains on batch t, with the
weights from before update t; fully asynchronous training streams prompt groups through the
async engine and trains on them as they finish. Both need an engine holding its own copy of the
weights, and both refuse the features whose meaning the schedule would change silently.
"""

from __future__ import annotations

from hybridrl.algorithms.advantages import estimator_needs
from hybridrl.algorithms.rollout_corr import SECTION, RolloutCorrectionConfig
from hybridrl.config.key_tables import ACTOR, ROLLOUT
from hybridrl.errors import ConfigError
from hybridrl.trainer.ppo.config import TRAINER_MODES, V1Config

__all__ = ["check_async_modes", "check_trainer_mode", "check_one_step_off", "check_rollout_pool_without_async"]

KEY = "trainer.one_step_off_policy"
MODE_KEY = "trainer.v1.trainer_mode"
assert TRAINER_MODES[0] == "sync"  # the one mode that is not asynchronous


def check_async_modes(config, corr: RolloutCorrectionConfig) -> list[str]:
    """Checks ``trainer.one_step_off_policy`` and ``trainer.v1.*``; returns the start-up notes.
    ``corr`` is the run's typed ``algorithm.rollout_correction`` (whether something corrects for
    the samples' age).

    Raises:
        ConfigError: as :func:`check_one_step_off` and :func:`check_trainer_mode`.
    """
    return check_one_step_off(config, corr) + check_trainer_mode(config, corr)


def check_trainer_mode(config, corr: RolloutCorrectionConfig) -> list[str]:
    """Checks ``trainer.v1.trainer_mode`` and, for the fully asynchronous modes, what they run with
    (``corr``: the typed ``algorithm.rollout_correction``).

    Returns:
        list[str]: a note when nothing corrects for the samples' age.

    Raises:
        ConfigError: an unknown mode; with an async mode: one-step-off as well, an engine that
            cannot serve async requests (not ``rollout.name=vllm`` with ``rollout.mode=async``),
            a staleness bound that is not an integer >= 1, an unknown strategy, a negative
            ``num_warmup_batches``, a ``parameter_sync_step`` that disagrees with the batch
            sizes, dynamic sampling, ReMax, or agent loops; a rollout pool of its own
            (``rollout.nnodes`` > 0) outside ``separate_async``, without workers, or on the
            local backend.
    """
    mode = config.trainer.v1.trainer_mode  # one of TRAINER_MODES: checked when typed
    check_rollout_pool_without_async(config)
    if mode == "sync":
        return []
    if config.trainer.one_step_off_policy:
        raise ConfigError(f"{MODE_KEY}={mode} with {KEY}=true: these are two asynchronous trainers; choose one")
    rollout = config.actor_rollout_ref.rollout
    if rollout.name != "vllm" or rollout.mode != "async":
        raise ConfigError(
            f"{MODE_KEY}={mode} with {ROLLOUT}.name={rollout.name} {ROLLOUT}.mode={rollout.mode}: fully asynchronous "
            f"training streams prompt groups through an engine that serves async requests and pauses for weight "
            f"syncs; set {ROLLOUT}.name=vllm {ROLLOUT}.mode=async (pip install -e '.[vllm]')"
        )
    V1Config.validate(config.trainer.v1)  # the run's section is a structured DictConfig
    _check_parameter_sync_step(config, mode)
    _check_rollout_pool(config, mode)
    for key, value, why in (
        (
            "algorithm.filter_groups.enable",
            config.algorithm.filter_groups.enable,
            "DAPO's dynamic sampling draws batches until groups pass its "
            "filter; the stream keeps its own batches in flight",
        ),
        (
            f"{ROLLOUT}.multi_turn.enable",
            rollout.multi_turn.enable,
            "agent loops do not stream yet (use trainer.one_step_off_policy=true)",
        ),
    ):
        if value:
            raise ConfigError(f"{MODE_KEY}={mode} with {key}=True: {why}; set {MODE_KEY}=sync or change {key}")
    estimator = config.algorithm.adv_estimator
    if estimator_needs(estimator, "needs_reward_baselines"):
        raise ConfigError(
            f"{MODE_KEY}={mode} with algorithm.adv_estimator={estimator}: its greedy baselines would "
            f"come from other weights than its samples; set {MODE_KEY}=sync or change algorithm.adv_estimator"
        )
    return _correction_notes(corr, f"{MODE_KEY}={mode}: samples may be several updates old")


def check_rollout_pool_without_async(config) -> None:
    """A rollout pool of its own (``rollout.nnodes`` > 0) is for ``separate_async`` only.

    Raises:
        ConfigError: ``rollout.nnodes`` set with another trainer mode.
    """
    nnodes = config.actor_rollout_ref.rollout.nnodes
    if nnodes and config.trainer.v1.trainer_mode != "separate_async":
        raise ConfigError(
            f"{ROLLOUT}.nnodes={nnodes}: a rollout pool of its own generates while the trainer trains, "
            f"which only {MODE_KEY}=separate_async does; set that, or {ROLLOUT}.nnodes=0"
        )


def _check_rollout_pool(config, mode: str) -> None:
    nnodes, per_node = config.actor_rollout_ref.rollout.nnodes, config.actor_rollout_ref.rollout.n_gpus_per_node
    for key, value in (("nnodes", nnodes), ("n_gpus_per_node", per_node)):
        if value < 0:
            raise ConfigError(f"{ROLLOUT}.{key}={value!r} must be an integer >= 0")
    if not nnodes:
        return
    if per_node < 1:
        raise ConfigError(
            f"{ROLLOUT}.nnodes={nnodes} with {ROLLOUT}.n_gpus_per_node={per_node} leaves the rollout "
            f"pool no workers; set n_gpus_per_node >= 1, or {ROLLOUT}.nnodes=0 to generate in the "
            "trainer's workers"
        )
    if config.trainer.backend == "local":
        raise ConfigError(
            f"{ROLLOUT}.nnodes={nnodes}: a rollout pool of its own runs on Ray workers; set "
            f"trainer.backend=ray (or auto), or {ROLLOUT}.nnodes=0"
        )


def _check_parameter_sync_step(config, mode: str) -> None:
    """``separate_async.parameter_sync_step``: verl's count of mini batches per weight sync."""
    sync_step = config.trainer.v1.separate_async.parameter_sync_step
    if mode == "separate_async" and sync_step is not None:
        batch, mini = config.data.train_batch_size, config.actor_rollout_ref.actor.ppo_mini_batch_size
        if sync_step * mini != batch:
            raise ConfigError(
                f"trainer.v1.separate_async.parameter_sync_step={sync_step!r}: the weights are synced once per step, "
                f"after data.train_batch_size={batch} prompts in mini-batches of {ACTOR}.ppo_mini_batch_size={mini}, "
                f"so it must be {batch // mini if mini else '?'} (verl asserts the same); or leave it null"
            )


def check_one_step_off(config, corr: RolloutCorrectionConfig) -> list[str]:
    """Checks ``trainer.one_step_off_policy`` and what it runs with (``corr``: the typed
    ``algorithm.rollout_correction``).

    Returns:
        list[str]: a note when nothing corrects for the samples' age (no rollout correction).

    Raises:
        ConfigError: an engine that generates with the actor's own module (``hf``,
            and the engines that fall back to it); DAPO's dynamic sampling; ReMax.
    """
    if not config.trainer.one_step_off_policy:
        return []
    name = config.actor_rollout_ref.rollout.name
    if name != "vllm":
        raise ConfigError(
            f"{KEY}=true with {ROLLOUT}.name={name}: the next batch is generated while the actor trains, so the "
            f"engine needs its own copy of the weights, and the HF engine generates with the actor's module; set "
            f"{ROLLOUT}.name=vllm (sync or async mode; pip install -e '.[vllm]') or {KEY}=false"
        )
    if config.algorithm.filter_groups.enable:
        raise ConfigError(
            f"{KEY}=true with algorithm.filter_groups.enable=true: DAPO's dynamic sampling generates a varying "
            "number of batches per step, and this schedule prefetches exactly one; set one of them to false"
        )
    estimator = config.algorithm.adv_estimator
    if estimator_needs(estimator, "needs_reward_baselines"):
        raise ConfigError(
            f"{KEY}=true with algorithm.adv_estimator={estimator}: its greedy baselines would come from weights one "
            "update newer than its samples; use grpo, rloo or reinforce_plus_plus, or set "
            f"{KEY}=false"
        )
    return _correction_notes(corr, f"{KEY}=true: every batch after the first was sampled by weights one update old")


def _correction_notes(corr: RolloutCorrectionConfig, what: str) -> list[str]:
    if corr.corrects or corr.bypass_mode:
        return []
    return [
        f"{what} and nothing corrects "
        f"for it; verl's asynchronous recipes set {SECTION}.bypass_mode=true (or add {SECTION}.rollout_is=token "
        "for decoupled PPO; docs/async.md)"
    ]
