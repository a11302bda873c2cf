"""One call running in a daemon thread of the driver, waited for with a deadline.

The driver overlaps work this way where the work waits on something else (an engine process,
scoring processes): the prefetched generation of one-step-off training
(:mod:`hybridrl.trainer.schedules.one_step_off`) and asynchronous scoring (:mod:`hybridrl.trainer.ppo.async_reward`).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

__all__ = ["BackgroundCall"]


class BackgroundCall:
    """``fn()`` in a daemon thread, started at construction.

    A call that overruns its deadline keeps running unwatched (a thread cannot be stopped); being
    a daemon it does not hold the process at exit.

    Args:
        fn: the call; its return value is :meth:`result`'s.
        name: the thread's name.
        deadline_s: the longest :meth:`result` waits, counted from the construction, seconds.
    """

    def __init__(self, fn: Callable[[], Any], name: str, deadline_s: float) -> None:
        self.deadline_s = float(deadline_s)
        self.launched = time.monotonic()
        self.started: float | None = None  # monotonic seconds, set by the thread
        self.ended: float | None = None
        self._box: dict[str, Any] = {}
        self._done = threading.Event()
        threading.Thread(target=self._run, args=(fn,), name=name, daemon=True).start()

    def _run(self, fn: Callable[[], Any]) -> None:
        self.started = time.monotonic()
        try:
            self._box["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised by result() in the driver's thread
            self._box["error"] = exc
        finally:
            self.ended = time.monotonic()
            self._done.set()

    @property
    def duration_s(self) -> float:
        """Seconds the call ran (so far, while it runs)."""
        return (self.ended or time.monotonic()) - (self.started or self.launched)

    def result(self, late: Callable[[], BaseException]) -> Any:
        """Waits for the call and returns its result.

        Args:
            late: builds the exception raised when the deadline passes first (it says what was
                waited for).

        Raises:
            BaseException: ``late()``, or what ``fn`` raised, re-raised as it was.
        """
        if not self._done.wait(max(0.0, self.deadline_s - (time.monotonic() - self.launched))):
            raise late()
        if "error" in self._box:
            raise self._box["error"]
        return self._box["result"]
