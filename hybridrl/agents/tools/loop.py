"""The event loop tools run on, apart from the agent loops' own.

A tool is user code, and its ``async execute`` may block: ``time.sleep``, a CPU-bound parse, a
synchronous HTTP client. On the agent loops' event loop that would stall every episode of the
batch and defeat ``asyncio.wait_for``, whose timer needs that very loop to run. So every tool
coroutine (``create``, ``execute``, ``calc_reward``, ``release``) runs on one long-lived loop in a
daemon thread, and the agent side waits for it with a deadline that holds whatever the tool does.

One loop for all tools and all steps: a tool may keep loop-bound state (an HTTP session) from
call to call. A tool that blocks this loop past its deadline delays the other tools' calls, which
then time out with their own messages, but never holds the batch longer than the deadlines.

Nothing a tool leaves running keeps the process from exiting (issue 33, item 3): the loop's thread
is a daemon, and so is every thread of its default executor (``asyncio.to_thread``,
``run_in_executor(None, ...)``), which a ``ThreadPoolExecutor`` would join at exit, forever for a
call that never returns.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine

__all__ = ["DaemonThreadExecutor", "ToolLoopTimeout", "run_on_tool_loop"]

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_owner_pid: int | None = None  # a forked child inherits the object but not the thread


class DaemonThreadExecutor(concurrent.futures.ThreadPoolExecutor):
    """The tools' loop's default executor: each call runs in a daemon thread of its own, which
    interpreter exit neither joins nor waits for (a ``ThreadPoolExecutor``'s workers are joined
    at exit). A subclass only because ``loop.set_default_executor`` takes nothing else."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="hybridrl-tool-call")

    def submit(self, fn, /, *args, **kwargs) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting tool
                future.set_exception(exc)
            else:
                future.set_result(result)

        threading.Thread(target=run, name="hybridrl-tool-call", daemon=True).start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Nothing to join: a call still running is left to end (or die) with the process."""


def _tool_loop() -> asyncio.AbstractEventLoop:
    global _loop, _owner_pid
    with _lock:
        if _loop is None or _owner_pid != os.getpid():
            _loop = asyncio.new_event_loop()
            _loop.set_default_executor(DaemonThreadExecutor())
            _owner_pid = os.getpid()
            threading.Thread(target=_loop.run_forever, name="hybridrl-tools", daemon=True).start()
        return _loop


class ToolLoopTimeout(asyncio.TimeoutError):
    """A tool coroutine gave no result within its deadline; the message is one line saying which
    call, and which earlier call still blocks the tools' loop if one does."""


_overrunning: list[tuple[str, threading.Event]] = []  # timed-out calls, set once each really ends


def _blocker() -> str | None:
    """The first timed-out call whose coroutine still has not ended (it blocks the loop)."""
    with _lock:
        _overrunning[:] = [(what, ended) for what, ended in _overrunning if not ended.is_set()]
        return _overrunning[0][0] if _overrunning else None


async def _tracked(coro: Coroutine, ended: threading.Event):
    try:
        return await coro
    finally:
        ended.set()


async def run_on_tool_loop(coro: Coroutine, timeout_s: float, what: str):
    """Awaits ``coro`` run on the tools' loop, for at most ``timeout_s`` seconds.

    On timeout the tool's task is cancelled: it stops at its next ``await``. A tool stuck in a
    blocking call finishes that call in the background, where nobody waits for it, and the calls
    queued behind it time out in turn, each naming it.

    Args:
        what: the call in messages, e.g. ``"tool 'search': its execute"``.

    Raises:
        ToolLoopTimeout: no result within ``timeout_s`` seconds.
        Exception: whatever the tool raised.
    """
    ended = threading.Event()
    future = asyncio.run_coroutine_threadsafe(_tracked(coro, ended), _tool_loop())
    try:
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)
    except asyncio.TimeoutError:
        blocker = _blocker()
        with _lock:
            _overrunning.append((what, ended))
        reason = f"{what} did not finish within {timeout_s:g} s"
        if blocker is not None:
            reason += (
                f": the tools' event loop is still blocked by {blocker}, which overran its timeout "
                "(blocking code such as time.sleep inside async def; run it with await asyncio.to_thread)"
            )
        raise ToolLoopTimeout(reason) from None
    finally:
        future.cancel()  # no-op once done; else the task on the tools' loop is cancelled
