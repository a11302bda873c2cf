"""The agent loops' only way to generate: an async front for the rollout engine.

:class:`RequestEngine` serves an engine with its own scheduler (``rollout.mode=async``): each
turn is one request. :class:`AsyncBatchEngine` serves an engine that takes whole batches
(``generate_token_ids``): every loop of a batch awaits its ``generate`` for the next turn; it
collects the requests of all loops that are ready and runs them as ONE batched ``generate``
(left padding + attention mask, ``HFRollout.generate_token_ids``) in a worker thread, so tool
calls of other loops go on meanwhile. A batch goes out as soon as every live loop is waiting
in ``generate``, or ``max_wait_s`` after the first request when some loops are still busy
with tools (they join the next batch).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
from dataclasses import dataclass

logger = logging.getLogger(__name__)

_SAMPLING_KEYS = ("do_sample", "temperature", "top_p", "top_k")


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: tuple
    max_new_tokens: int
    stop: tuple
    future: asyncio.Future


class AsyncBatchEngine:
    """Batches the concurrent ``generate`` calls of agent loops.

    Args:
        rollout: an object with ``generate_token_ids(prompt_ids, max_new_tokens,
            sampling_kwargs, stop_strings) -> list[SampledIds]`` (``HFRollout``, ``VLLMRollout``).
        max_wait_s: how long a batch waits for loops that are busy elsewhere (tools), seconds.

    Use one engine per event loop run; :meth:`session` counts the live loops.
    """

    def __init__(self, rollout, max_wait_s: float = 0.05) -> None:
        self.rollout = rollout
        self.max_wait_s = float(max_wait_s)
        self._pending: list[_Request] = []
        self._live = 0
        self._arrived: asyncio.Event | None = None
        self._drainer: asyncio.Task | None = None
        # One generation at a time: the module is not re-entrant; tools use the default pool.
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent-generate")
        self.num_batches = 0
        self.num_requests = 0

    def session(self) -> _Session:
        """``async with engine.session():`` around one loop's run, so batches wait for it."""
        return _Session(self)

    async def generate(
        self, prompt_ids: list[int], sampling_params: dict | None, max_new_tokens: int, stop: list[str] | None = None
    ) -> list[int]:
        """Sample a continuation of ``prompt_ids``.

        Args:
            prompt_ids: the whole context so far (prompt + response ids), unpadded.
            sampling_params: ``do_sample`` / ``temperature`` / ``top_p`` / ``top_k`` overrides.
            max_new_tokens: at most this many ids are returned; <= 0 returns ``[]``.
            stop: stop strings; the turn ends with the token that completes one.

        Returns:
            The new ids (``SampledIds``: with their log-probs), ending with EOS, a stop string,
            or at ``max_new_tokens``.

        Raises:
            Whatever the rollout's ``generate_token_ids`` raised for this batch.
        """
        if max_new_tokens <= 0:
            return []
        loop = asyncio.get_running_loop()
        sampling = tuple(sorted((k, v) for k, v in (sampling_params or {}).items() if k in _SAMPLING_KEYS))
        request = _Request(list(prompt_ids), sampling, int(max_new_tokens), tuple(stop or ()), loop.create_future())
        self._pending.append(request)
        self._notify()
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.ensure_future(self._drain())
        return await request.future

    def _notify(self) -> None:
        if self._arrived is None:
            self._arrived = asyncio.Event()
        self._arrived.set()

    async def _wait_for_ready_loops(self) -> None:
        """Until every live loop waits here, at most ``max_wait_s`` after the first request."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait_s
        while len(self._pending) < self._live:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except asyncio.TimeoutError:
                return

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            await self._wait_for_ready_loops()
            batch, self._pending = self._pending, []
            groups: dict[tuple, list[_Request]] = {}
            for request in batch:  # one generate per sampling setting and stop set
                groups.setdefault((request.sampling, request.stop), []).append(request)
            for (sampling, stop), requests in groups.items():
                call = functools.partial(
                    self.rollout.generate_token_ids,
                    [r.prompt_ids for r in requests],
                    max(r.max_new_tokens for r in requests),
                    dict(sampling),
                    list(stop) or None,
                )
                self.num_batches += 1
                self.num_requests += len(requests)
                try:
                    outputs = await loop.run_in_executor(self._executor, call)
                except Exception as exc:  # noqa: BLE001 - handed to every waiting loop
                    for r in requests:
                        if not r.future.done():
                            r.future.set_exception(exc)
                    continue
                for r, ids in zip(requests, outputs):
                    if not r.future.done():
                        # Sampling is left to right: the first k ids of a longer run are a valid sample.
                        r.future.set_result(
                            ids.head(r.max_new_tokens) if hasattr(ids, "head") else list(ids[: r.max_new_tokens])
                        )

    def close(self) -> None:
        """Stop the generation thread."""
        self._executor.shutdown(wait=False)


class _Session:
    def __init__(self, engine: AsyncBatchEngine) -> None:
        self.engine = engine

    async def __aenter__(self) -> _Session:
        self.engine._live += 1
        return self

    async def __aexit__(self, *exc) -> None:
        self.engine._live -= 1
        self.engine._notify()  # a batch waiting for this loop can go now


class RequestEngine:
    """The front for an engine that schedules requests itself (``rollout.mode=async``: vLLM's
    ``AsyncLLM`` through ``rollout.agenerate``). Each turn of each loop goes out at once as its
    own request; the engine batches whatever is in flight, and a turn returns as soon as it is
    done, so a finished sample or a short turn never waits for the batch's longest.

    Same interface as :class:`AsyncBatchEngine`; ``generate`` raises what ``agenerate`` raised
    (``RolloutEngineError``: deadline, dead engine, prompt too long).
    """

    def __init__(self, rollout) -> None:
        self.rollout = rollout
        self.num_requests = 0

    def session(self):
        """Nothing to count: no batch waits for a loop."""
        return contextlib.nullcontext()

    async def generate(
        self, prompt_ids: list[int], sampling_params: dict | None, max_new_tokens: int, stop: list[str] | None = None
    ) -> list[int]:
        """As :meth:`AsyncBatchEngine.generate`."""
        if max_new_tokens <= 0:
            return []
        self.num_requests += 1
        sampling = {k: v for k, v in (sampling_params or {}).items() if k in _SAMPLING_KEYS}
        return await self.rollout.agenerate(list(prompt_ids), sampling, int(max_new_tokens), list(stop or ()) or None)

    def close(self) -> None:
        """Nothing to stop: the rollout owns the engine."""
