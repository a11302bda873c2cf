"""Streaming generation with partial rollouts, for fully asynchronous training
(``trainer.v1.trainer_mode=colocate_async|separate_async``, docs/async.md).

A :class:`RolloutStream` keeps prompt groups in flight on the async vLLM engine
(:class:`~hybridrl.workers.rollout.vllm_async.AsyncVLLMRollout`): every sample is a request of
its own, and a group is handed out as soon as its last sample is done, whatever the rest of the
batch is doing. Between collections the engine keeps generating.

**Partial rollouts.** A weight sync pauses the engine with vLLM's
``pause_generation(mode="abort")``: the requests in flight stop where they are and return the
tokens they have, with their log-probs. Each sample then waits; after the new weights are in,
it continues as a new request whose prompt is the old prompt plus its tokens so far (the prefix
is prefilled again, with the new weights), for the tokens it has left. So a response may be
sampled by several policies, and every token's ``rollout_log_probs`` is under the policy that
sampled it (verl's fully-async ``partial_rollout``).

Which policy sampled which tokens is exact: no request enters the engine while a pause is in
progress (the pause first waits for submissions under way), so every request runs wholly under
the weights that were in the engine when it was submitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import numpy as np

from hybridrl.protocol import DataProto
from hybridrl.workers.rollout.base import RolloutEngineError, SampledIds, resolve_sampling
from hybridrl.workers.rollout.vllm import sampled_ids

__all__ = ["RolloutStream", "START_VERSION_KEY", "END_VERSION_KEY", "RESUMES_KEY"]

START_VERSION_KEY = "param_version"  # the policy that sampled a response's first token (verl's column)
END_VERSION_KEY = "param_version_end"  # ... and its last token
RESUMES_KEY = "rollout_resumes"  # how often a weight sync interrupted the response


class _Sample:
    """One response being sampled: its tokens and log-probs so far, and the policy of each piece."""

    def __init__(self, prompt_ids: list[int]) -> None:
        self.prompt_ids, self.ids, self.log_probs, self.versions = prompt_ids, [], [], []

    def extend(self, piece: SampledIds, version: int) -> None:
        self.ids += piece
        self.log_probs += piece.log_probs or [0.0] * len(piece)
        if piece:
            self.versions.append(version)

    def sampled(self) -> SampledIds:
        return SampledIds(self.ids, self.log_probs)


class RolloutStream:
    """Prompt groups in flight on an async vLLM engine, collected group by group.

    All state lives on the engine client's event loop; the public methods run there with the
    engine's deadline (``rollout.engine_timeout_s``) and may be called from any thread.

    Args:
        engine: an :class:`AsyncVLLMRollout` (it has ``llm``, its loop and ``rollout_rows``).
        version: the ``param_version`` of the weights in the engine now.
    """

    def __init__(self, engine, version: int) -> None:
        self.engine, self.version = engine, int(version)
        self._open: asyncio.Event | None = None  # set while requests may enter the engine
        self._submitting = 0  # requests on their way into the engine
        self._groups: dict[str, asyncio.Task] = {}  # uid -> the task sampling that group
        self._finished: list[DataProto] = []
        self._news: asyncio.Event | None = None  # set when a group finished or failed
        self._requests = 0  # requests in the engine now
        self._idle_s, self._idle_from = 0.0, time.monotonic()  # the engine's time with no request
        self.paused = False
        engine._wake_up()
        engine.sleep_mode = False  # its requests live across calls: the engine must not sleep between them
        engine._call(self._init(), "the rollout stream to start")

    async def _init(self) -> None:  # asyncio primitives are made on the loop that uses them
        self._open, self._news = asyncio.Event(), asyncio.Event()
        self._open.set()

    # ------------------------------------------------------------------ the public calls
    def submit(self, prompts: DataProto) -> None:
        """Starts sampling ``prompts``: the rows of a prompt group (same non-tensor ``uid``) are
        consecutive, one row per response to sample (``rollout.n`` per prompt).

        Raises:
            RolloutEngineError: a prompt does not fit ``max_model_len``; no answer within the deadline.
        """
        self.engine._call(self._submit(prompts), f"the engine to take {len(prompts)} prompts")

    def collect(self, wait_s: float) -> list[DataProto]:
        """The groups finished since the last call, waiting up to ``wait_s`` seconds for one
        when there is none. Each is in the :class:`BaseRollout` layout plus the non-tensor
        columns ``uid``, ``param_version`` (the policy of its first token),
        ``param_version_end`` (of its last) and ``rollout_resumes`` (int per row).

        Raises:
            RolloutEngineError: a group failed (the engine died, ...), or no answer in time.
        """
        return self.engine._call(self._collect(float(wait_s)), "the finished groups of the rollout stream")

    def pause(self) -> None:
        """Stops generation: the requests in flight return their tokens so far and wait for
        :meth:`resume`. Nothing enters the engine until then."""
        if not self.paused:
            self.engine._call(self._pause(), "the engine to pause the rollout stream")
            self.paused = True

    def resume(self, version: int) -> None:
        """Continues the paused samples (and starts the waiting ones) under ``version``'s weights."""
        self.engine._call(self._resume(int(version)), "the engine to resume the rollout stream")
        self.paused = False

    def idle_s(self) -> float:
        """Seconds since the start during which the engine had no request of this stream (nothing
        in flight, or paused for a weight sync)."""
        return self._idle_s + (time.monotonic() - self._idle_from if self._requests == 0 else 0.0)

    def in_flight(self) -> list[str]:
        """The ``uid`` of every group not finished yet."""
        return [uid for uid, task in self._groups.items() if not task.done()]

    def close(self) -> None:
        """Cancels every group in flight (their requests are aborted) and leaves the engine running."""
        self.engine._call(self._close(), "the rollout stream to stop")

    # ------------------------------------------------------------------ on the engine's loop
    async def _submit(self, prompts: DataProto) -> None:
        rows = zip(prompts.batch["input_ids"].cpu(), prompts.batch["attention_mask"].cpu())
        prompt_ids = [row[mask.bool()].tolist() for row, mask in rows]
        self.engine._check_prompt_lengths(prompt_ids)
        uids = prompts.non_tensor_batch["uid"]
        starts = [i for i in range(len(uids)) if i == 0 or uids[i] != uids[i - 1]]
        for start, end in zip(starts, starts[1:] + [len(uids)]):
            group = prompts[start:end]
            task = asyncio.ensure_future(self._group(group, prompt_ids[start:end]))
            task.add_done_callback(lambda _: self._news.set())
            self._groups[str(uids[start])] = task

    async def _group(self, prompts: DataProto, prompt_ids: list[list[int]]) -> DataProto:
        config = self.engine.config
        response_length = int(prompts.meta_info.get("response_length", config.response_length))
        sampling = resolve_sampling(prompts.meta_info, config)
        samples = await asyncio.gather(*(self._sample(_Sample(ids), sampling, response_length) for ids in prompt_ids))
        out = self.engine.rollout_rows(prompts, [s.sampled() for s in samples], response_length)
        out.non_tensor_batch.update(
            {
                "uid": np.array(prompts.non_tensor_batch["uid"], dtype=object),
                START_VERSION_KEY: np.array([s.versions[0] for s in samples], dtype=object),
                END_VERSION_KEY: np.array([s.versions[-1] for s in samples], dtype=object),
                RESUMES_KEY: np.array([len(s.versions) - 1 for s in samples], dtype=object),
            }
        )
        return out

    async def _sample(self, sample: _Sample, sampling: dict, response_length: int) -> _Sample:
        while True:
            await self._open.wait()
            version, left = self.version, response_length - len(sample.ids)
            self._count_request(+1)
            try:
                output = await self._request(
                    sample.prompt_ids + sample.ids, self.engine._sampling_params(sampling, left)
                )
            finally:
                self._count_request(-1)
            completion = output.outputs[0]
            piece = sampled_ids(completion)
            sample.extend(piece, version)
            if completion.finish_reason != "abort" or len(piece) >= left:
                if not sample.versions:  # an empty response: the policy that ended it
                    sample.versions.append(version)
                return sample

    def _count_request(self, delta: int) -> None:
        if self._requests == 0:
            self._idle_s += time.monotonic() - self._idle_from
        self._requests += delta
        if self._requests == 0:
            self._idle_from = time.monotonic()

    async def _request(self, prompt_ids: list[int], params):
        """The final output of one request (``RequestOutputKind.FINAL_ONLY``: there is one)."""
        from vllm.v1.engine.exceptions import EngineDeadError

        request_id = uuid.uuid4().hex
        try:
            self._submitting += 1  # a pause waits until the request is in the engine
            try:
                collector = await self.engine.llm.add_request(request_id, {"prompt_token_ids": prompt_ids}, params)
            finally:
                self._submitting -= 1
            while True:
                output = collector.get_nowait() or await collector.get()
                if output.finished:
                    return output
        except EngineDeadError as exc:
            raise self.engine._dead(exc, "streaming a rollout") from None
        except asyncio.CancelledError:
            await self.engine.llm.abort(request_id, internal=True)
            raise

    async def _collect(self, wait_s: float) -> list[DataProto]:
        if wait_s > 0 and not any(task.done() for task in self._groups.values()):
            self._news.clear()
            try:
                await asyncio.wait_for(self._news.wait(), wait_s)
            except asyncio.TimeoutError:
                pass
        done = [uid for uid, task in self._groups.items() if task.done()]
        tasks = [self._groups.pop(uid) for uid in done]
        for task in tasks:  # a failure is raised as it was (e.g. the dead engine's one line)
            if task.exception() is not None:
                raise task.exception()
        return [task.result() for task in tasks]

    async def _pause(self) -> None:
        self._open.clear()
        while self._submitting:  # requests on their way in would run on the next weights
            await asyncio.sleep(0.001)
        await self._engine(
            self.engine.llm.pause_generation(mode="abort", clear_cache=True), "pausing for a weight sync"
        )

    async def _resume(self, version: int) -> None:
        self.version = version
        if self.paused:
            await self._engine(self.engine.llm.resume_generation(), "resuming after a weight sync")
        self._open.set()

    async def _engine(self, call, what: str):
        """Awaits an engine call; a dead engine process is its one-line error."""
        from vllm.v1.engine.exceptions import EngineDeadError

        try:
            return await call
        except EngineDeadError as exc:
            raise self.engine._dead(exc, what) from None

    async def _close(self) -> None:
        tasks = list(self._groups.values())
        self._groups.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(RolloutEngineError):  # a dead engine has nothing left to resume
            await self._resume(self.version)
