"""The one training loop of ``hybridrl train``, ``sft`` and ``rm``: resume, validation and
checkpoints on schedule, logging, epochs, early stop.

A trainer (:class:`Trainable`: :class:`~hybridrl.trainer.ppo.ppo_trainer.PPOTrainer`,
:class:`~hybridrl.trainer.jobs.supervised.SupervisedTrainer`) gives what differs: a ``step(batch)``,
``validate()``, ``save_checkpoint()``, ``load_checkpoint()``; the PPO schedules
(:mod:`hybridrl.trainer.schedules.modes`) hook in through :class:`LoopHooks`. :func:`run_training`
is the rest, the same for every trainer:

1. ``load_checkpoint()`` (the trainer resumes, or starts fresh);
2. validation before training (``trainer.val_before_train``, fresh runs only); then nothing more
   with ``trainer.val_only`` or when a resumed run is already at its last step;
3. one ``step`` per batch (epoch after epoch, a resumed epoch's rest first) until
   ``total_training_steps``; after a step, validation every ``trainer.test_freq`` steps and a
   checkpoint every ``trainer.save_freq`` (:func:`is_due`), each timed into
   ``timing_s/testing`` / ``timing_s/save_checkpoint`` and into ``perf/time_per_step``;
   then the step's metrics go to the tracker.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Protocol

from hybridrl.controller import cpu_threads
from hybridrl.trainer.run import checkpoint
from hybridrl.trainer.run.metrics import marked_timer

__all__ = ["LoopHooks", "LoopSettings", "Trainable", "epoch_batches", "is_due", "run_training"]


def is_due(step: int, freq: int, is_last: bool, always_on_last: bool = False) -> bool:
    """Whether a ``*_freq`` event (validation, checkpoint) happens after step ``step``: every
    ``freq`` steps and at the last step; ``freq`` <= 0: never, unless ``always_on_last`` and this
    is the last step."""
    if is_last and always_on_last:
        return True
    return freq > 0 and (is_last or step % freq == 0)


@dataclass(frozen=True)
class LoopSettings:
    """The ``trainer`` keys the loop reads.

    Attributes:
        test_freq: validate every ``test_freq`` steps and at the last (<= 0: never).
        save_freq: checkpoint every ``save_freq`` steps and at the last (<= 0: never).
        val_before_train: validate once before the first step of a fresh run.
        val_only: stop after that validation (``trainer.val_only``).
        always_on_last: the last step validates and saves whatever the frequencies (``hybridrl rm``).
    """

    test_freq: int
    save_freq: int
    val_before_train: bool
    val_only: bool = False
    always_on_last: bool = False


class LoopHooks:
    """What a training schedule changes in the loop; these defaults change nothing (the
    synchronous schedule, SFT and RM). :class:`~hybridrl.trainer.schedules.modes.Schedule` overrides them.

    Attributes:
        early_stop: exception types a step raises when the data ran out before the last step
            (fully async training after dropped groups): the run stops there, cleanly.
    """

    early_stop: tuple[type[BaseException], ...] = ()

    def batches(self, batches: Iterator[dict]) -> Iterable[Any]:
        """The items the loop hands to ``step``, made from the dataloader's ``batches`` (fully async:
        ``None`` per step, which takes its groups from the stream); starts the schedule (a prefetch,
        a stream). Default: the batches as they are."""
        return batches

    def before_validation_or_save(self, what: str, timing: dict) -> None:
        """Called after a step that validates or saves, before it does; ``what`` is "validation"
        or "a checkpoint", ``timing`` the step's event timings (``timing_s/<name>``). Default: nothing."""

    def close(self, quiet: bool) -> None:
        """The end of training (``quiet``: after an error, which closing must not replace). Default: nothing."""


class Trainable(Protocol):
    """What :func:`run_training` needs from a trainer."""

    global_steps: int  # the last step done (0: none); the loop advances it
    total_training_steps: int
    train_dataloader: Any  # iterated once per epoch

    def load_checkpoint(self) -> Iterator[dict] | None:
        """Restores the checkpoint to resume from, if any; returns the rest of its epoch (None: a fresh start)."""
        ...

    def has_validation(self) -> bool: ...

    def validate(self) -> dict: ...

    def step(self, batch: Any) -> dict | None:
        """One training step; None when the step is not complete yet (more batches to collect first)."""
        ...

    def save_checkpoint(self) -> str: ...


def epoch_batches(dataloader, resumed: Iterator[dict] | None = None) -> Iterator[dict]:
    """Dataloader batches epoch after epoch, starting with ``resumed`` (the rest of a resumed
    epoch); ends only when an epoch yields nothing (an empty dataloader)."""
    yield from resumed or ()
    while True:
        drawn = False
        for batch in iter(dataloader):
            drawn = True
            yield batch
        if not drawn:
            return


def run_training(trainer: Trainable, tracker, settings: LoopSettings, hooks: LoopHooks | None = None) -> None:
    """Trains ``trainer`` until ``total_training_steps`` (module docstring); a run resumed at (or
    past) its last step trains nothing.

    Raises:
        Exception: whatever the trainer's methods or the hooks raise (after ``hooks.close(quiet=True)``
            once training started), but ``hooks.early_stop``, which ends the run.
    """
    hooks = hooks or LoopHooks()
    cpu_threads.apply_torch_threads("torch in the driver")  # the cores free at start-up (issue 33 item 7)
    resumed = trainer.load_checkpoint()
    if trainer.has_validation() and settings.val_before_train and trainer.global_steps == 0:
        tracker.log(trainer.validate(), step=trainer.global_steps)
    if settings.val_only or checkpoint.run_is_complete(trainer.global_steps, trainer.total_training_steps):
        return
    trainer.global_steps += 1
    batches = hooks.batches(epoch_batches(trainer.train_dataloader, resumed))
    try:
        _train(trainer, tracker, settings, hooks, batches)
    finally:
        hooks.close(quiet=sys.exc_info()[0] is not None)


def _train(trainer: Trainable, tracker, settings: LoopSettings, hooks: LoopHooks, batches: Iterable) -> None:
    watch = cpu_threads.StepWatch()  # a step far slower than the last: re-sample the free cores
    started = time.monotonic()
    for batch in batches:
        try:
            metrics = trainer.step(batch)
        except hooks.early_stop as exc:
            print(f"hybridrl: stopping at step {trainer.global_steps}: the data ran out ({exc})", flush=True)
            return
        if metrics is None:  # dynamic sampling: more groups to collect first
            continue
        watch.after_step(time.monotonic() - started, trainer.global_steps)
        is_last = trainer.global_steps >= trainer.total_training_steps
        timing: dict = {}
        validating = trainer.has_validation() and is_due(
            trainer.global_steps, settings.test_freq, is_last, settings.always_on_last
        )
        saving = is_due(trainer.global_steps, settings.save_freq, is_last, settings.always_on_last)
        if validating or saving:
            hooks.before_validation_or_save("validation" if validating else "a checkpoint", timing)
        if validating:
            with marked_timer("testing", timing):
                metrics.update(trainer.validate())
        if saving:
            with marked_timer("save_checkpoint", timing):
                trainer.save_checkpoint()
        metrics.update({f"timing_s/{name}": seconds for name, seconds in timing.items()})
        metrics["perf/time_per_step"] += sum(timing.values())  # the step's wall time, as verl counts it
        tracker.log(metrics, step=trainer.global_steps)
        if is_last:
            return
        trainer.global_steps += 1
        started = time.monotonic()
