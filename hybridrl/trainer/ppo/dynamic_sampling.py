"""DAPO's dynamic sampling (``algorithm.filter_groups``): a prompt group whose responses all got
the same reward has zero advantage under GRPO and teaches nothing, so such groups are dropped
and more batches are generated (``data.gen_batch_size`` prompts each) until
``data.train_batch_size`` groups with different rewards are collected.

Source: "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", arXiv 2503.14476,
section 3.2; verl's keys (``enable``, ``metric``, ``max_num_gen_batches``) and metric
``train/num_gen_batches``. With verl's ``max_num_gen_batches=0`` (no limit) a reward that never
varies would generate forever in silence: a progress line every ``PROGRESS_EVERY`` generation
batches says how far the batch is, and ``timeout_s`` (hybridrl's key) ends the wait.
"""

from __future__ import annotations

import logging
import time
from typing import NoReturn

import numpy as np

from hybridrl.algorithms.errors import AlgorithmInputError
from hybridrl.protocol import DataProto, concat_padded

__all__ = ["DynamicSampler", "DynamicSamplingError", "kept_group_rows", "TENSOR_METRICS"]

logger = logging.getLogger(__name__)

SECTION = "algorithm.filter_groups"
PROGRESS_EVERY = 10  # generation batches between two progress lines of a batch that is slow to fill
# metrics read from the batch's tensors; any other name is a reward function output (extra info)
TENSOR_METRICS = {"seq_reward": "token_level_scores", "seq_final_reward": "token_level_scores"}
_SCORE_NAMES = ("acc", "score")  # fall back to the sequence score when the scorer returned a float


class DynamicSamplingError(AlgorithmInputError):
    """The batch could not be filled within ``max_num_gen_batches`` or ``timeout_s``, or the metric
    is missing."""


def kept_group_rows(values, uids) -> list[int]:
    """Rows of the groups whose ``values`` are not all equal (or that have one row), in order.

    Args:
        values: ``(bs,)`` one number per response.
        uids: ``(bs,)`` the group (prompt) id of each response.
    """
    groups: dict = {}
    for row, uid in enumerate(uids):
        groups.setdefault(uid, []).append(row)
    kept = {
        uid
        for uid, rows in groups.items()
        if len(rows) == 1 or np.std(np.asarray([values[r] for r in rows], dtype=np.float64)) > 0
    }
    return [row for row, uid in enumerate(uids) if uid in kept]


class DynamicSampler:
    """Collects kept groups over generation batches until a training batch is full.

    Args:
        metric: ``seq_reward`` / ``seq_final_reward`` (the sum of ``token_level_scores``; KL is
            not in the reward before filtering, see docs) or a key of the reward function's extra
            output (``acc``, ``score``, ...; ``acc`` / ``score`` fall back to the sequence score
            when the scorer returns a float).
        max_num_gen_batches: stop with an error after this many generation batches; <= 0: never.
        train_batch_size: prompt groups per training batch.
        pad_token_id: pads prompts to a common width when batches are joined.
        timeout_s: stop with an error when a training batch is not full this many seconds after
            its first generation batch was scored; <= 0: never.
    """

    def __init__(
        self,
        metric: str,
        max_num_gen_batches: int,
        train_batch_size: int,
        pad_token_id: int,
        timeout_s: float = 0.0,
    ) -> None:
        self.metric = metric
        self.max_num_gen_batches = int(max_num_gen_batches)
        self.train_batch_size = int(train_batch_size)
        self.pad_token_id = int(pad_token_id)
        self.timeout_s = float(timeout_s)
        self._reset()

    def _reset(self) -> None:
        self.parts: list[DataProto] = []
        self.num_groups = 0
        self.num_gen_batches = 0
        self.started: float | None = None  # time.monotonic() at the batch's first generation batch

    def _values(self, batch: DataProto) -> np.ndarray:
        if self.metric in TENSOR_METRICS:
            return batch.batch[TENSOR_METRICS[self.metric]].sum(-1).numpy()
        if self.metric in batch.non_tensor_batch:
            return np.asarray(batch.non_tensor_batch[self.metric], dtype=np.float64)
        if self.metric in _SCORE_NAMES:
            return batch.batch["token_level_scores"].sum(-1).numpy()
        raise DynamicSamplingError(
            f"{SECTION}.metric={self.metric!r} is not in the reward function's output (it gave: "
            f"{sorted(k for k in batch.non_tensor_batch if k not in ('uid',)) or 'only the score'}); use "
            "seq_reward, acc, or a key the reward function returns in its dict"
        )

    def _give_up(self, after: str) -> NoReturn:
        """Drops the groups collected so far and raises :class:`DynamicSamplingError` (one line)."""
        found = self.num_groups
        self._reset()
        raise DynamicSamplingError(
            f"{SECTION}: after {after} only {found} of data.train_batch_size={self.train_batch_size} prompt "
            f"groups had responses with different {self.metric}; raise {SECTION}.max_num_gen_batches or "
            f"{SECTION}.timeout_s (<= 0: no limit) or data.gen_batch_size, raise actor_rollout_ref.rollout.n, "
            "or use data the model solves sometimes"
        )

    def collect(self, batch: DataProto) -> tuple[DataProto | None, dict[str, float]]:
        """Adds a scored generation batch (with ``uid`` and ``token_level_scores``).

        Returns:
            ``(None, {})`` while fewer than ``train_batch_size`` groups are kept; then the training
            batch (the first ``train_batch_size`` kept groups, in order; the rest are dropped, as
            verl does) and ``train/num_gen_batches``.

        Raises:
            DynamicSamplingError: ``max_num_gen_batches`` batches or ``timeout_s`` seconds did not
                fill it (the message has the numbers and the keys to change), or the metric is missing.
        """
        if self.started is None:
            self.started = time.monotonic()
        self.num_gen_batches += 1
        uids = batch.non_tensor_batch["uid"]
        rows = kept_group_rows(self._values(batch), uids)
        if rows:
            self.parts.append(batch[rows])
            self.num_groups += len(dict.fromkeys(uids[rows]))
        if self.num_groups < self.train_batch_size:
            elapsed = time.monotonic() - self.started
            if 0 < self.max_num_gen_batches <= self.num_gen_batches:
                self._give_up(f"{self.num_gen_batches} generation batches (max_num_gen_batches)")
            if 0 < self.timeout_s <= elapsed:
                self._give_up(f"{elapsed:.0f} s and {self.num_gen_batches} generation batches (timeout_s)")
            progress = (
                f"dynamic sampling: {self.num_groups} of data.train_batch_size={self.train_batch_size} prompt "
                f"groups kept after {self.num_gen_batches} generation batches ({elapsed:.0f} s)"
            )
            if self.num_gen_batches % PROGRESS_EVERY == 0:  # a batch this slow to fill may never fill: say so
                print(f"hybridrl: {progress}", flush=True)
            else:
                logger.info(progress)
            return None, {}
        full = concat_padded(self.parts, self.pad_token_id)
        first = list(dict.fromkeys(full.non_tensor_batch["uid"]))[: self.train_batch_size]
        chosen = set(first)
        full = full[[i for i, uid in enumerate(full.non_tensor_batch["uid"]) if uid in chosen]]
        metrics = {"train/num_gen_batches": float(self.num_gen_batches)}
        self._reset()
        return full, metrics
