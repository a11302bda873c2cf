"""Fully asynchronous training: ``trainer.v1.trainer_mode=colocate_async|separate_async``.

The driver keeps prompt groups in flight on the actor/rollout workers' streaming engines
(:class:`~hybridrl.workers.rollout.stream.RolloutStream`) and trains on groups as they finish,
as verl's v1 trainer (``verl/trainer/ppo/v1``) does over its replay buffer:

- **In flight**: ``1 + num_warmup_batches`` dataloader batches of prompts are kept live
  (submitted and not trained or dropped); after each step takes its groups the driver tops
  them up, so the engine has work while the trainer trains.
- **A step** waits until ``data.train_batch_size`` groups have finished and takes the oldest
  (by the policy that started them, then by draw order); the rest wait for the next step.
- **Staleness bound** (``trainer.v1.sampler.max_off_policy_threshold``, T, policy versions): a
  group started by the weights of version ``v`` and trained by version ``V`` has staleness
  ``V - v`` and verl's age ``V - v + 1``; it is trained only if its age is at most T. With
  ``max_off_policy_strategy=drop`` a finished group over the bound is dropped (and refilled);
  with ``wait`` the step first waits for every unfinished group that would be over the bound
  after it, so it is trained in time (groups over the bound even so are dropped).
- **Weights** go to the engine after every update (``sync_rollout_weights``): the engine pauses,
  the samples in flight keep their tokens and continue on the new weights (partial rollouts).
  ``colocate_async`` also pauses generation while the trainer works (verl: the replicas sleep
  during training), ``separate_async`` generates throughout.
- **Checkpoints** save the dataloader position from before the oldest batch that still has
  groups neither trained nor dropped, and which rows of the batches drawn since then are done.
  A resumed run draws those batches again and submits only the rest: the groups in flight and
  finished-but-untrained ones at the checkpoint are regenerated, none is lost, none trains twice.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from hybridrl.protocol import DataProto, concat_padded
from hybridrl.trainer.run.metrics import marked_timer
from hybridrl.workers.rollout.base import RolloutEngineError

__all__ = ["ASYNC_MODES", "DataExhausted", "StreamingRollout", "StreamSettings", "stream_settings"]

logger = logging.getLogger(__name__)

ASYNC_MODES = ("colocate_async", "separate_async")
_POLL_S = 0.5  # the longest one collection waits on the workers before the driver looks again


class DataExhausted(Exception):
    """The dataloader ran out with fewer groups left than a step trains on (some were dropped)."""


@dataclass(frozen=True)
class StreamSettings:
    """What the driver needs from the config (checked at start-up by :mod:`hybridrl.trainer.ppo.async_checks`).

    Attributes:
        mode: ``colocate_async`` | ``separate_async``.
        groups_per_step: ``data.train_batch_size`` (prompt groups a step trains on).
        threshold: ``max_off_policy_threshold``, >= 1: the oldest age (staleness + 1) trained.
        strategy: ``drop`` | ``wait``.
        warmup_batches: ``num_warmup_batches``, >= 0: dataloader batches in flight beyond the step's.
        deadline_s: ``rollout.engine_timeout_s``: the longest a step waits without a group finishing.
        pad_token_id: pads prompts when groups of differently trimmed batches are joined.
    """

    mode: str
    groups_per_step: int
    threshold: int
    strategy: str
    warmup_batches: int
    deadline_s: float
    pad_token_id: int


@dataclass(eq=False)
class _Drawn:
    """One dataloader batch: its draw number, the position before it was drawn, and its rows
    trained or dropped."""

    number: int
    state_before: dict
    size: int
    done: set[int] = field(default_factory=set)


@dataclass(eq=False)
class _Group:
    uid: str
    drawn: _Drawn
    row: int
    version: int  # the weights in the engine when it was submitted
    rows: DataProto  # its prompt's dataloader row
    output: DataProto | None = None  # the finished responses, once collected


class StreamingRollout:
    """The driver's side of fully asynchronous training (module docstring).

    Args:
        batches: dataloader batches, across epochs (a resumed run: from the checkpoint's position).
        prepare: ``prepare(batch_dict) -> (rows, prompts)``: the rows with their ``uid`` and the
            generation input, one row per prompt (:meth:`PPOTrainer.prepare_generation`).
        worker_group: the workers that run the engines (``stream_submit``, ``stream_collect``,
            ``stream_idle_s``, ``stream_pause``, ``stream_close``): the actor/rollout group, or a
            rollout pool of its own.
        sync_weights: ``sync_weights() -> int``: brings the engines up to the actor's weights and
            returns their ``param_version``.
        dataloader_state: the dataloader's ``state_dict``.
        settings: :class:`StreamSettings`.
        n: ``rollout.n``, responses per prompt.
        version: the ``param_version`` of the weights in the engine now.
        done_rows: from a checkpoint: the rows already trained or dropped of the batches drawn
            again first (:meth:`checkpoint_state`).
    """

    def __init__(
        self,
        batches: Iterator[dict],
        prepare: Callable[[dict], tuple[DataProto, DataProto]],
        worker_group,
        sync_weights: Callable[[], int],
        dataloader_state: Callable[[], dict],
        settings: StreamSettings,
        n: int,
        version: int,
        done_rows: list[list[int]] | None = None,
    ) -> None:
        self._batches, self._prepare, self.wg, self._sync = batches, prepare, worker_group, sync_weights
        self._dataloader_state, self.settings, self.n, self.version = dataloader_state, settings, int(n), int(version)
        self._done_rows = [set(rows) for rows in done_rows or []]
        self._drawn: list[_Drawn] = []  # every batch with rows not done yet, in draw order
        self._groups: dict[str, _Group] = {}  # live groups: in flight or finished, not taken
        self._exhausted = False
        self._dropped = 0  # since the last step's metrics
        self._next_rank = 0
        self._draws = 0
        self._last_take: tuple[float, float] | None = None  # (time, the engines' idle seconds) at the last take

    def __iter__(self) -> StreamingRollout:
        return self

    def __next__(self) -> None:  # the training loop's item: the step takes its batch in take()
        self._top_up()
        if self._exhausted and len(self._groups) < self.settings.groups_per_step:
            raise StopIteration
        return None

    # ------------------------------------------------------------------ a step's batch
    def take(self, metrics: dict, timing_raw: dict) -> DataProto:
        """The next ``groups_per_step`` finished groups, oldest first: their dataloader rows repeated
        ``n`` times joined with the responses (``param_version``, ``param_version_end`` and
        ``rollout_resumes`` per row). Tops up the groups in flight before and after.

        Raises:
            RolloutEngineError: no group finished within ``deadline_s``; a worker's stream failed.
            DataExhausted: the dataloader is exhausted and, after drops, too few groups are left.
        """
        with marked_timer("gen", timing_raw):  # verl's timing_s/gen: the time the trainer waited
            chosen = self._wait_for_batch()
        if self.settings.mode == "colocate_async":  # the cores are the trainer's until the sync
            self.wg.stream_pause()
        batch = concat_padded(
            [g.rows.repeat(self.n, interleave=True).union(g.output) for g in chosen], self.settings.pad_token_id
        )
        for group in chosen:
            self._finish(group)
        self._top_up()  # the engine's work while the trainer trains
        metrics.update(self._metrics(batch))
        metrics.update(self._engine_idle())
        return batch

    def _engine_idle(self) -> dict[str, float]:
        """verl's ``fully_async/rollouter/{version_time,idle_ratio}``: the time since the previous
        step took its groups, and the share of it the engines (mean over workers) had no request."""
        now, idle = time.monotonic(), float(np.mean(self.wg.stream_idle_s()))
        last, self._last_take = self._last_take, (now, idle)
        if last is None:
            return {}
        version_time = now - last[0]
        return {
            "fully_async/rollouter/version_time": version_time,
            "fully_async/rollouter/idle_ratio": min(1.0, max(0.0, (idle - last[1]) / version_time)),
        }

    def sync_weights(self, timing_raw: dict) -> int:
        """After an update: the engine gets the new weights; samples in flight continue on them."""
        with marked_timer("sync_rollout_weights", timing_raw):
            self.version = int(self._sync())
        return self.version

    def close(self, quiet: bool = False) -> None:
        """Cancels the groups in flight (the end of training); ``quiet``: after an error, whatever
        goes wrong here (e.g. the worker that caused it is gone) is only logged."""
        self._groups.clear()
        try:
            self.wg.stream_close()
        except Exception as exc:
            if not quiet:
                raise
            logger.warning("closing the rollout stream after an error failed too: %s", exc)

    # ------------------------------------------------------------------ waiting
    def _wait_for_batch(self) -> list[_Group]:
        need, limit = self.settings.groups_per_step, self.settings.threshold
        last_progress = time.monotonic()
        while True:
            self._top_up()
            if self._receive():
                last_progress = time.monotonic()
            self._drop_over_bound()
            ready = sorted((g for g in self._groups.values() if g.output is not None), key=self._age_order)
            blocking = [
                g
                for g in self._groups.values()
                if g.output is None and self.settings.strategy == "wait" and self._age(g) >= limit
            ]
            if len(ready) >= need and not blocking:
                return ready[:need]
            if self._exhausted and not any(g.output is None for g in self._groups.values()):
                raise DataExhausted(f"{len(ready)} finished groups left, a step trains on {need}")
            waited = time.monotonic() - last_progress
            if waited > self.settings.deadline_s:
                raise RolloutEngineError(
                    f"trainer.v1.trainer_mode={self.settings.mode}: waited {waited:.0f} s for finished prompt groups "
                    f"({len(ready)} of {need} ready, {len(self._groups) - len(ready)} in flight"
                    f"{f', {len(blocking)} over the staleness bound awaited' if blocking else ''}) and none finished "
                    f"within actor_rollout_ref.rollout.engine_timeout_s={self.settings.deadline_s:g}; raise it for "
                    "long generations, or check the engine"
                )

    def _receive(self) -> bool:
        """Attaches the outputs the workers finished; True when there were any."""
        outputs = [group for rank in self.wg.stream_collect(_POLL_S) for group in rank]
        for output in outputs:
            uid = str(output.non_tensor_batch["uid"][0])
            if uid in self._groups:  # else a group closed in the meantime
                self._groups[uid].output = output
        return bool(outputs)

    def _age(self, group: _Group) -> int:
        """verl's age: staleness + 1, counting the update this step makes."""
        return self.version - group.version + 1

    def _age_order(self, group: _Group):
        return group.version, group.drawn.number, group.row

    def _drop_over_bound(self) -> None:
        for group in [
            g for g in self._groups.values() if g.output is not None and self._age(g) > self.settings.threshold
        ]:
            self._finish(group)
            self._dropped += 1

    def _finish(self, group: _Group) -> None:
        """The group leaves: trained or dropped. A batch whose rows are all done is forgotten."""
        del self._groups[group.uid]
        group.drawn.done.add(group.row)
        while self._drawn and len(self._drawn[0].done) == self._drawn[0].size:
            self._drawn.pop(0)

    # ------------------------------------------------------------------ submitting
    def _top_up(self) -> None:
        """Draws and submits batches until ``1 + warmup_batches`` steps' worth of groups are live."""
        target = (1 + self.settings.warmup_batches) * self.settings.groups_per_step
        while not self._exhausted and len(self._groups) < target:
            self._submit_next()

    def _submit_next(self) -> None:
        state_before = self._dataloader_state()
        batch_dict = next(self._batches, None)
        if batch_dict is None:
            self._exhausted = True
            return
        rows, prompts = self._prepare(batch_dict)
        self._draws += 1
        drawn = _Drawn(self._draws, state_before, len(rows), self._done_rows.pop(0) if self._done_rows else set())
        self._drawn.append(drawn)
        keep = [i for i in range(len(rows)) if i not in drawn.done]
        uids = rows.non_tensor_batch["uid"]
        for i in keep:
            self._groups[str(uids[i])] = _Group(str(uids[i]), drawn, i, self.version, rows[i : i + 1])
        if len(drawn.done) == drawn.size:
            self._drawn.remove(drawn)
        if not keep:
            return
        world = self.wg.world_size  # whole groups to each rank, in turn
        per_rank: list[list[int]] = [[] for _ in range(world)]
        for i in keep:
            per_rank[self._next_rank].extend(range(i * self.n, (i + 1) * self.n))
            self._next_rank = (self._next_rank + 1) % world
        repeated = prompts.repeat(self.n, interleave=True)
        self.wg.stream_submit([repeated[idx] if idx else None for idx in per_rank])

    # ------------------------------------------------------------------ checkpoints and metrics
    def checkpoint_state(self) -> tuple[dict, list[list[int]]]:
        """``(dataloader_state, done_rows)`` for a checkpoint: the position before the oldest batch
        with rows not done, and the done rows of every batch drawn since (module docstring)."""
        if not self._drawn:
            return self._dataloader_state(), []
        return self._drawn[0].state_before, [sorted(d.done) for d in self._drawn]

    def _metrics(self, batch: DataProto) -> dict[str, float]:
        columns = batch.non_tensor_batch
        start = np.asarray(columns["param_version"], dtype=np.float64)
        end = np.asarray(columns["param_version_end"], dtype=np.float64)
        resumed = np.asarray(columns["rollout_resumes"], dtype=np.float64) > 0
        staleness = self.version - start
        metrics = {
            "fully_async/staleness/mean": float(staleness.mean()),
            "fully_async/staleness/max": float(staleness.max()),
            "fully_async/count/current_param_version": float(self.version),
            "fully_async/queue_size": float(sum(g.output is not None for g in self._groups.values())),
            "fully_async/in_flight": float(sum(g.output is None for g in self._groups.values())),
            "fully_async/dropped": float(self._dropped),
            "fully_async/partial/total_partial_num": float(resumed.sum()),
            "fully_async/partial/partial_ratio": float(resumed.mean()),
            "fully_async/partial/max_partial_span": float((end - start).max() + 1),
        }
        self._dropped = 0
        return metrics


def stream_settings(config, pad_token_id: int) -> StreamSettings:
    """:class:`StreamSettings` of a validated config (``trainer.v1``)."""
    v1 = config.trainer.v1
    mode = str(v1.trainer_mode)
    return StreamSettings(
        mode=mode,
        groups_per_step=int(config.data.train_batch_size),
        threshold=int(v1.sampler.max_off_policy_threshold),
        strategy=str(v1.sampler.max_off_policy_strategy),
        warmup_batches=int(v1[mode].num_warmup_batches),
        deadline_s=float(config.actor_rollout_ref.rollout.engine_timeout_s),
        pad_token_id=int(pad_token_id),
    )
