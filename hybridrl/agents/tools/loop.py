"""The event loop tools run on, apart from the agent loops' own.

A tool is user code, and its ``async execute`` may block: ``time.sleep``, a CPU-bound parse, a
synchronous HTTP client. On the agent loops' event loop that would stall every episode of the
batch and defeat ``asyncio.wait_for``, whose timer needs that very loop to run. So every tool
coroutine (``create``, ``execute``, ``calc_reward``, ``release``) runs on one long-lived loop in a
daemon thread, and the agent side waits for it with a deadline that holds whatever the tool does.

One loop for all tools and all steps: a tool may keep loop-bound state (an HTTP session) from
call to call. A tool that blocks this loop past its deadline delays the other tools' calls, which
then time out with their own messages, but never holds the batch longer than the deadlines.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine

__all__ = ["ToolLoopTimeout", "run_on_tool_loop"]

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_owner_pid: int | None = None  # a forked child inherits the object but not the thread


def _tool_loop() -> asyncio.AbstractEventLoop:
    global _loop, _owner_pid
    with _lock:
        if _loop is None or _owner_pid != os.getpid():
            _loop = asyncio.new_event_loop()
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
