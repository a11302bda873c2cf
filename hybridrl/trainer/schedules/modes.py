"""The PPO driver's training schedules: where a step's batch is generated and when the engines
get the actor's weights (docs/async.md). One class per mode, chosen once by :func:`make_schedule`
from the config; :class:`~hybridrl.trainer.ppo.ppo_trainer.PPOTrainer` calls its methods and never
tests which one it has, and :func:`hybridrl.trainer.run.loop.run_training` calls its loop hooks.

- :class:`SyncSchedule` (``trainer.v1.trainer_mode=sync``, the default): each step generates its
  batch; the actor's update pushes the new weights to the engine.
- :class:`OneStepOffSchedule` (``trainer.one_step_off_policy=true``): batch t+1 generates during
  step t (:class:`~hybridrl.trainer.schedules.one_step_off.OneStepOffRollout`); the next step syncs the weights;
  validation and checkpoints first wait for the prefetch (``timing_s/gen_next``).
- :class:`FullyAsyncSchedule` (``trainer.v1.trainer_mode=colocate_async|separate_async``): prompt
  groups stream through the engines (:class:`~hybridrl.trainer.schedules.fully_async.StreamingRollout`),
  which get the weights after every update. The two modes differ in their settings (colocated
  engines pause while the trainer trains) and in where the engines live (the actor's workers,
  or a rollout pool of their own).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Iterator, Protocol

from hybridrl.protocol import DataProto
from hybridrl.registry import Registry
from hybridrl.trainer.run.loop import LoopHooks
from hybridrl.trainer.run.metrics import marked_timer
from hybridrl.trainer.schedules.fully_async import DataExhausted, StreamingRollout, stream_settings
from hybridrl.trainer.schedules.one_step_off import VERSION_KEY, OneStepOffRollout, engine_deadline_s, staleness_metrics

__all__ = [
    "SCHEDULES",
    "FullyAsyncSchedule",
    "OneStepOffSchedule",
    "Schedule",
    "ScheduleHost",
    "SyncSchedule",
    "make_schedule",
    "schedule_name",
]

ONE_STEP_OFF = "one_step_off"  # trainer.one_step_off_policy=true; the other names are trainer.v1.trainer_mode's


class ScheduleHost(Protocol):
    """What a schedule uses of its trainer (:class:`~hybridrl.trainer.ppo.ppo_trainer.PPOTrainer`)."""

    config: Any
    tokenizer: Any
    train_dataloader: Any
    actor_rollout_wg: Any
    rollout_wg: Any  # the engines: the actor's group, or a rollout pool of its own

    def prepare_generation(self, batch_dict: dict) -> tuple[DataProto, DataProto]: ...

    def generate(self, batch_dict: dict) -> tuple[DataProto, DataProto, DataProto]: ...

    def join_responses(self, batch: DataProto, prompts: DataProto, responses: DataProto, timing_raw: dict) -> DataProto:
        """The prompts' rows repeated ``rollout.n`` times joined with the responses (and ReMax's baselines)."""
        ...


class Schedule(LoopHooks, ABC):
    """A training schedule of the PPO driver (module docstring).

    Args:
        trainer: the trainer it generates for (:class:`ScheduleHost`).

    Attributes:
        update_syncs_weights: whether the actor's update pushes its new weights to the engine
            itself (``update_actor(..., sync_rollout_weights=...)``); else the schedule does.
    """

    update_syncs_weights: bool = True

    def __init__(self, trainer: ScheduleHost) -> None:
        self.trainer = trainer

    @abstractmethod
    def rollout(self, batch_dict: Any, step: int, is_last: bool, metrics: dict, timing_raw: dict) -> DataProto:
        """Step ``step``'s generated batch: ``rollout.n`` responses per prompt joined with their rows
        (``uid`` group ids), generation timed as ``timing_s/gen``; the schedule's metrics go into ``metrics``.

        Args:
            batch_dict: the item the loop handed to the step (of :meth:`batches`).
            is_last: the run's last step (nothing to prefetch after it).
        """

    def after_update(self, timing_raw: dict) -> None:
        """Called after the step's updates. Default: nothing (the update synced the engine)."""

    def checkpoint_state(self) -> tuple[dict, dict]:
        """``(dataloader_state, trainer_state)`` a checkpoint saves: the dataloader position a resumed
        run continues from, and the schedule's entries of ``trainer_state.json``. Default: the
        dataloader's position now, no entries."""
        return self.trainer.train_dataloader.state_dict(), {}

    def restore(self, trainer_state: dict) -> None:
        """Takes the schedule's entries back from a checkpoint's ``trainer_state`` (before :meth:`batches`).
        Default: nothing."""

    def step_metrics(self, timing_raw: dict) -> dict[str, float]:
        """The schedule's metrics of a finished step (its ``timing_raw`` has ``gen`` and ``step``). Default: none."""
        return {}


def _idle_ratio(timing_raw: dict) -> dict[str, float]:
    """verl's ``fully_async/trainer/idle_ratio``: the share of the step spent waiting for generation."""
    return {"fully_async/trainer/idle_ratio": timing_raw["gen"] / timing_raw["step"]}


class SyncSchedule(Schedule):
    """Each step generates its own batch, then trains on it; the update syncs the engine."""

    def rollout(self, batch_dict: Any, step: int, is_last: bool, metrics: dict, timing_raw: dict) -> DataProto:
        with marked_timer("gen", timing_raw):
            batch, prompts, responses = self.trainer.generate(batch_dict)
        return self.trainer.join_responses(batch, prompts, responses, timing_raw)


class OneStepOffSchedule(Schedule):
    """``trainer.one_step_off_policy``: batch t+1 generates in a driver thread while step t trains
    (:mod:`hybridrl.trainer.schedules.one_step_off`); the engine gets the weights at the start of each step."""

    update_syncs_weights = False

    def __init__(self, trainer: ScheduleHost) -> None:
        super().__init__(trainer)
        self._prefetch: OneStepOffRollout | None = None

    def batches(self, batches: Iterator[dict]) -> OneStepOffRollout:
        """The batches, each drawn (and its generation launched) one step early."""
        trainer = self.trainer
        self._prefetch = OneStepOffRollout(
            batches,
            trainer.generate,
            lambda: trainer.actor_rollout_wg.sync_rollout_weights()[0],
            trainer.train_dataloader.state_dict,
            engine_deadline_s(trainer.config),
        )
        return self._prefetch

    def _started(self) -> OneStepOffRollout:
        if self._prefetch is None:
            raise RuntimeError("OneStepOffSchedule: iterate over batches() before a step takes its batch")
        return self._prefetch

    def rollout(self, batch_dict: Any, step: int, is_last: bool, metrics: dict, timing_raw: dict) -> DataProto:
        """The prefetched batch (``fully_async/staleness/*``), once the engine has the weights the
        step trains; the next batch starts generating (not after the last step).

        Raises:
            RolloutEngineError: the generation failed or missed ``rollout.engine_timeout_s``.
            RuntimeError: :meth:`batches` was not started.
        """
        (batch, prompts, responses), version = self._started().take(step, is_last, metrics, timing_raw)
        metrics.update(staleness_metrics(responses.non_tensor_batch[VERSION_KEY], version))
        return self.trainer.join_responses(batch, prompts, responses, timing_raw)

    def before_validation_or_save(self, what: str, timing: dict) -> None:
        """Waits for the prefetched generation (``timing_s/gen_next``; its result is kept for the
        next step), so validation and checkpoints run with the engine idle and the next batch is
        one update old like every other.

        Raises:
            RolloutEngineError: the generation failed or missed its deadline.
        """
        with marked_timer("gen_next", timing):
            self._started().settle(what)

    def checkpoint_state(self) -> tuple[dict, dict]:
        """The position before the prefetch drew the next batch: a resumed run generates it again."""
        if self._prefetch is None:
            return super().checkpoint_state()
        return self._prefetch.dataloader_state(), {}

    def step_metrics(self, timing_raw: dict) -> dict[str, float]:
        return _idle_ratio(timing_raw)


class FullyAsyncSchedule(Schedule):
    """``trainer.v1.trainer_mode=colocate_async|separate_async``: finished prompt groups stream in
    (:mod:`hybridrl.trainer.schedules.fully_async`), the engines get the weights after every update. The mode
    is in :func:`~hybridrl.trainer.schedules.fully_async.stream_settings`; the engines are the actor's
    workers or a rollout pool of their own (``trainer.rollout_wg``)."""

    update_syncs_weights = False
    early_stop = (DataExhausted,)  # groups were dropped: the last step cannot fill

    def __init__(self, trainer: ScheduleHost) -> None:
        super().__init__(trainer)
        self._stream: StreamingRollout | None = None
        self._done_rows: list[list[int]] | None = None  # from a checkpoint

    def restore(self, trainer_state: dict) -> None:
        self._done_rows = trainer_state.get("stream_done_rows")

    def batches(self, batches: Iterator[dict]) -> StreamingRollout:
        """Starts the stream over ``batches`` (the engines get the actor's weights first); a resumed
        run skips the rows its checkpoint had done."""
        trainer = self.trainer
        self._stream = StreamingRollout(
            batches,
            trainer.prepare_generation,
            trainer.rollout_wg,
            self.sync_engines,
            trainer.train_dataloader.state_dict,
            stream_settings(trainer.config, trainer.tokenizer.pad_token_id),
            trainer.config.actor_rollout_ref.rollout.n,
            self.sync_engines(),
            self._done_rows,
        )
        return self._stream

    def _started(self) -> StreamingRollout:
        if self._stream is None:
            raise RuntimeError("FullyAsyncSchedule: iterate over batches() before a step takes its batch")
        return self._stream

    def sync_engines(self) -> int:
        """Brings the engines up to the actor's weights; returns their ``param_version``."""
        trainer = self.trainer
        if trainer.rollout_wg is trainer.actor_rollout_wg:
            return trainer.actor_rollout_wg.sync_rollout_weights()[0]
        state, version = trainer.actor_rollout_wg.engine_weights()[0]  # rank 0 holds the gathered weights
        return trainer.rollout_wg.update_weights(state, version)[0]

    def rollout(self, batch_dict: Any, step: int, is_last: bool, metrics: dict, timing_raw: dict) -> DataProto:
        """The oldest finished groups, joined with their rows (:meth:`StreamingRollout.take`).

        Raises:
            RolloutEngineError: no group finished within the deadline; a worker's stream failed.
            DataExhausted: the data ran out with too few groups left for the step.
            RuntimeError: :meth:`batches` was not started.
        """
        return self._started().take(metrics, timing_raw)

    def after_update(self, timing_raw: dict) -> None:
        """The engines get the new weights (``timing_s/sync_rollout_weights``); samples in flight continue on them."""
        self._started().sync_weights(timing_raw)

    def checkpoint_state(self) -> tuple[dict, dict]:
        """The position before the oldest batch with groups not done, and ``stream_done_rows``: a
        resumed run regenerates the groups not trained yet, and none twice."""
        if self._stream is None:
            return super().checkpoint_state()
        dataloader_state, done_rows = self._stream.checkpoint_state()
        return dataloader_state, {"stream_done_rows": done_rows}

    def step_metrics(self, timing_raw: dict) -> dict[str, float]:
        return _idle_ratio(timing_raw)

    def close(self, quiet: bool) -> None:
        """Cancels the groups in flight; ``quiet``: after an error, a failure here is only logged."""
        if self._stream is not None:
            self._stream.close(quiet=quiet)


SCHEDULES = Registry("training schedule", "trainer.v1.trainer_mode")
SCHEDULES.register("sync", SyncSchedule)
SCHEDULES.register(ONE_STEP_OFF, OneStepOffSchedule)
SCHEDULES.register("colocate_async", FullyAsyncSchedule)
SCHEDULES.register("separate_async", FullyAsyncSchedule)


def schedule_name(trainer_cfg) -> str:
    """The schedule of a ``trainer`` section: ``one_step_off`` with ``one_step_off_policy``, else
    ``v1.trainer_mode`` (the start-up check refuses both at once)."""
    return ONE_STEP_OFF if trainer_cfg.one_step_off_policy else str(trainer_cfg.v1.trainer_mode)


def make_schedule(config, trainer: ScheduleHost) -> Schedule:
    """The schedule of a typed PPO config, for ``trainer``; it starts when the loop iterates its
    :meth:`~Schedule.batches`.

    Raises:
        RegistryError: an unknown ``trainer.v1.trainer_mode`` (one line with the known ones).
    """
    return SCHEDULES.get(schedule_name(config.trainer))(trainer)
