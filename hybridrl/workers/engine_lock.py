"""One user of the rollout engine at a time: a generation, or a weight sync.

With ``trainer.one_step_off_policy`` the driver generates the next batch in a thread while the
worker trains on the current one, so two calls may reach the actor/rollout worker at once. A
weight sync during a generation would reload the engine's weights under it (part of a batch
sampled by one policy, the rest by another), and the engines are not thread-safe. The worker
therefore takes :class:`EngineLock` around both: a sync waits for an in-flight generation to
finish, a generation waits for a sync in progress, and two generations (a prefetch and a
validation) run one after the other. Every wait has a deadline and says what it waited for.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator

from hybridrl.workers.rollout.base import RolloutEngineError
from hybridrl.workers.rollout.vllm_async import DEFAULT_ENGINE_TIMEOUT_S


class EngineLock:
    """A mutex with a deadline around the rollout engine's generations and weight syncs.

    Args:
        timeout_s: the longest :meth:`hold` waits for the engine (``rollout.engine_timeout_s``), > 0.

    Attributes:
        last_wait_s: seconds the latest :meth:`hold` waited before it got the engine.
    """

    def __init__(self, timeout_s: float = DEFAULT_ENGINE_TIMEOUT_S) -> None:
        if not timeout_s > 0:
            raise ValueError(f"EngineLock: timeout_s={timeout_s!r} must be > 0")
        self.timeout_s = float(timeout_s)
        self.last_wait_s = 0.0
        self._lock = threading.Lock()
        self._holder: str | None = None
        self._since = 0.0

    @contextlib.contextmanager
    def hold(self, what: str) -> Iterator[None]:
        """Runs the block as the engine's only user; ``what`` names it in a waiter's error.

        Raises:
            RolloutEngineError: the engine stayed busy for ``timeout_s`` (one line naming what
                held it, for how long, and the key that raises the deadline).
        """
        start = time.monotonic()
        if not self._lock.acquire(timeout=self.timeout_s):
            holder, busy_s = self._holder or "another call", time.monotonic() - self._since
            raise RolloutEngineError(
                f"rollout engine: {what} waited actor_rollout_ref.rollout.engine_timeout_s={self.timeout_s:g} s for "
                f"{holder} to finish (busy for {busy_s:.0f} s); raise the deadline for long generations, or check "
                "the engine"
            )
        self.last_wait_s = time.monotonic() - start
        self._holder, self._since = what, time.monotonic()
        try:
            yield
        finally:
            self._holder = None
            self._lock.release()
