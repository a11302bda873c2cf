"""Where scoring calls run: one at a time in the driver (a thread per call, for its deadline), or
in a pool of ``reward.num_workers`` worker processes.

The reward manager hands a batch's calls to :func:`serial_calls` or :meth:`RewardPool.calls` and
gets each call's outcome back in order; what a failure does (``reward_model.on_error``) is the
manager's business, the same for both.

The deadline ``reward_model.timeout_s`` of one call means different things in the two places:
in the driver a late call keeps running in its thread (Python cannot stop a thread), nobody
waits for it; in the pool the worker process running it is killed and replaced (by pebble), so
a scorer stuck in a loop or in C code stops using a core.

Workers start with the ``forkserver`` method (``spawn`` where it is missing): the driver has
threads (Ray, torch, the async reward thread), and forking such a process can deadlock the
child. A worker therefore imports what the scoring function needs itself: the file of
``custom_reward_function.path`` (under the same module name as in the driver, so the function
unpickles), the modules of ``actor_rollout_ref.model.external_lib`` (where a user registers
scorers), and runs the ``worker_init`` callables (e.g. the code sandbox setting).
"""

from __future__ import annotations

import functools
import importlib
import logging
import math
import multiprocessing
import os
import pickle
import threading
import time
import weakref
from concurrent.futures import CancelledError
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Iterable, Iterator, Sequence

from pebble import ProcessExpired, ProcessPool

from hybridrl.errors import UserError
from hybridrl.rewards.custom import RewardConfigError, import_reward_file
from hybridrl.rewards.sandbox import current_sandbox, set_sandbox

__all__ = [
    "ScoreTimeoutError",
    "RewardPoolError",
    "ScoringProcessDied",
    "call_with_deadline",
    "timeout_limit",
    "serial_calls",
    "RewardPool",
    "check_num_workers",
    "build_reward_pool",
    "inherited_settings",
]

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0  # workers importing the scorers' modules, the first time and after a kill
CLOSE_TIMEOUT_S = 10.0  # the end of training: calls still running after this are killed
CLOSED_POLL_S = 0.5  # how often a wait for a call's result looks whether the pool was closed


class ScoreTimeoutError(TimeoutError):
    """A scoring call did not return within ``reward_model.timeout_s``."""


class RewardPoolError(UserError, RuntimeError):
    """The scoring processes did not start, cannot load the reward function, or did not answer
    within the batch's deadline."""


class ScoringProcessDied(RuntimeError):
    """The process running one scoring call died (the call crashed it); that sample fails."""


def check_num_workers(value: Any) -> int:
    """``reward.num_workers`` as a number of processes; 0 (from null, 0 or 1) means the driver.

    Raises:
        RewardConfigError: not null or a whole number >= 0.
    """
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RewardConfigError(
            f"reward.num_workers={value!r} must be a whole number >= 0 (null, 0 or 1: score in "
            "the driver; N > 1: N scoring processes, at most the cores you can spare)"
        )
    return 0 if value <= 1 else value


def call_with_deadline(fn: Callable[..., Any], timeout_s: float, **kwargs) -> Any:
    """``fn(**kwargs)`` in a daemon thread, waited for at most ``timeout_s`` seconds.

    A call that overruns keeps running in its thread (Python cannot stop it) but nobody waits
    for it, and being a daemon it does not hold the process at exit.

    Raises:
        ScoreTimeoutError: no result in time. Whatever ``fn`` raised, re-raised here.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = fn(**kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=run, name="reward-fn", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise ScoreTimeoutError(f"no result within reward_model.timeout_s={timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["result"]


def timeout_limit(seconds: float, use_signals: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator (verl's ``verl.utils.py_functional.timeout_limit``): each call of the decorated
    function gets at most ``seconds``, with :func:`call_with_deadline`'s mechanism.

    The call runs in a daemon thread, so the decorator works on closures and lambdas, in the main
    thread and in others; a late call keeps running in its thread (it is not killed, unlike verl's
    child process: for a scorer that can hang in C code use ``reward.num_workers``, whose pool
    kills the process). ``use_signals`` is accepted for verl's signature and changes nothing
    (verl deprecated it: signals work in the main thread only).

    Raises (from the decorated function):
        ScoreTimeoutError (a TimeoutError): no result within ``seconds``; the message says
            ``<function> timed out after <seconds> seconds``.
        Whatever the function raised, re-raised as is.
    """
    del use_signals

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return call_with_deadline(lambda: fn(*args, **kwargs), seconds)
            except ScoreTimeoutError:
                raise ScoreTimeoutError(
                    f"{getattr(fn, '__name__', 'the call')} timed out after {seconds} seconds"
                ) from None

        return wrapper

    return decorator


def serial_calls(fn: Callable[..., Any], jobs: Sequence[dict], timeout_s: float) -> Iterator[tuple[Any, float]]:
    """``fn(**job)`` for each job, one after the other in this process, each with its deadline.

    Yields, lazily and in order, ``(result or the exception it raised, seconds)``: a caller that
    stops iterating makes no further call.
    """
    for job in jobs:
        started = time.perf_counter()
        try:
            outcome = call_with_deadline(fn, timeout_s, **job)
        except Exception as exc:  # noqa: BLE001 - an outcome like any other
            outcome = exc
        yield outcome, time.perf_counter() - started


# ------------------------------------------------------------------ inside a worker process
_INIT_ERROR: list[str] = []  # why this worker's start failed; every call then fails with it
_FUNCTIONS: dict[bytes, Callable[..., Any]] = {}  # the pickled scoring functions seen, unpickled


def _init_worker(reward_files: tuple[str, ...], modules: tuple[str, ...], worker_init: tuple) -> None:
    """Pool initializer: import what the scoring function needs, run the hooks. Never raises (a
    raising initializer only says "workers expired"); the first call reports the reason instead."""
    try:
        for path in reward_files:
            import_reward_file(path)
        for name in modules:
            importlib.import_module(name)
        for hook in worker_init:
            hook()
    except BaseException as exc:  # noqa: BLE001 - reported by _load_function
        _INIT_ERROR.append(f"{type(exc).__name__}: {' '.join(str(exc).split())}")


def _load_function(fn_bytes: bytes) -> Callable[..., Any]:
    """The scoring function from its pickle (sent as bytes: a failure to unpickle it inside pebble
    would kill the worker without a word). Raises RewardPoolError when it cannot be loaded."""
    if _INIT_ERROR:
        raise RewardPoolError(f"the scoring process did not start: {_INIT_ERROR[0]}")
    fn = _FUNCTIONS.get(fn_bytes)
    if fn is None:
        try:
            fn = pickle.loads(fn_bytes)
        except Exception as exc:  # noqa: BLE001 - one line for the driver
            raise RewardPoolError(
                f"the scoring process cannot load the reward function: {type(exc).__name__}: {exc}; a function "
                "registered or defined at run time must live in custom_reward_function.path or in a module of "
                "actor_rollout_ref.model.external_lib, which every scoring process imports"
            ) from None
        _FUNCTIONS[fn_bytes] = fn
    return fn


def _run_call(fn_bytes: bytes, kwargs: dict) -> tuple[Any, BaseException | None, float]:
    """One scoring call in a worker → ``(result, None, seconds)`` or ``(None, exception, seconds)``."""
    fn = _load_function(fn_bytes)
    started = time.perf_counter()
    try:
        result = fn(**kwargs)
        pickle.dumps(result)  # what cannot travel back would kill the worker on the way
        return result, None, time.perf_counter() - started
    except Exception as exc:  # noqa: BLE001 - returned so the driver applies reward_model.on_error
        try:
            pickle.dumps(exc)
        except Exception:  # noqa: BLE001 - an exception that cannot travel becomes its text
            exc = RuntimeError(f"{type(exc).__name__}: {exc}")
        return None, exc, time.perf_counter() - started


# ------------------------------------------------------------------ in the driver
def _start_method() -> str:
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


class RewardPool:
    """``num_workers`` processes that run scoring calls, each call with a deadline that kills it.

    Built once per run (:func:`hybridrl.trainer.main_ppo.run_ppo` builds it from the config) and
    shared by the training and validation reward managers; :meth:`close` at the end of training.

    Args:
        num_workers: processes (>= 2; ``reward.num_workers``).
        reward_files: ``.py`` files to import in each worker, as
            :func:`hybridrl.rewards.custom.import_reward_file` does in the driver
            (``custom_reward_function.path``).
        modules: module names to import in each worker (``actor_rollout_ref.model.external_lib``).
        worker_init: picklable callables each worker runs once at start (the code sandbox
            setting: :func:`inherited_settings`).
        start_method: ``forkserver`` (default where available, else ``spawn``) or ``spawn``;
            ``fork`` is refused (the driver has threads: a forked child can deadlock).

    Raises:
        RewardConfigError: ``num_workers`` < 2 or not a whole number, or a bad ``start_method``.
    """

    def __init__(
        self,
        num_workers: int,
        reward_files: Iterable[str] = (),
        modules: Iterable[str] = (),
        worker_init: Iterable[Callable[[], Any]] = (),
        start_method: str | None = None,
    ) -> None:
        if check_num_workers(num_workers) < 2:
            raise RewardConfigError(
                f"RewardPool(num_workers={num_workers!r}) needs 2 or more processes; "
                "with fewer, score in the driver (no pool)"
            )
        start_method = start_method or _start_method()
        if start_method not in ("forkserver", "spawn") or start_method not in multiprocessing.get_all_start_methods():
            raise RewardConfigError(f"RewardPool(start_method={start_method!r}): use forkserver or spawn")
        self.num_workers, self.closed = num_workers, False
        initargs = (tuple(reward_files), tuple(modules), tuple(worker_init))
        self._pool = ProcessPool(
            max_workers=num_workers,
            initializer=_init_worker,
            initargs=initargs,
            context=multiprocessing.get_context(start_method),
        )
        self._finalizer = weakref.finalize(self, _stop, self._pool)  # a pool never closed still ends

    def check_started(self, fn: Callable[..., Any], timeout_s: float = START_TIMEOUT_S) -> None:
        """Starts the workers and waits (at most ``timeout_s``) until each has loaded ``fn``, the
        scoring function, so that a function the workers cannot load stops the run at start-up.

        Raises:
            RewardPoolError: ``fn`` cannot be pickled or loaded in a worker, a worker failed to
                import a file or module, or a worker did not answer in time.
        """
        fn_bytes = self._pickled(fn)
        futures = [
            self._pool.schedule(_load_function, args=(fn_bytes,), timeout=timeout_s) for _ in range(self.num_workers)
        ]
        deadline = time.monotonic() + timeout_s
        for future in futures:
            try:
                future.result(timeout=max(0.0, deadline - time.monotonic()))
            except RewardPoolError:
                raise
            except Exception as exc:  # TimeoutError, BrokenProcessPool, ...
                raise RewardPoolError(
                    f"reward.num_workers={self.num_workers}: the scoring processes did not "
                    f"answer within {timeout_s:g} s of their start ({type(exc).__name__}: {exc})"
                ) from exc

    def calls(self, fn: Callable[..., Any], jobs: Sequence[dict], timeout_s: float) -> Iterator[tuple[Any, float]]:
        """``fn(**job)`` for every job in the workers, each killed after ``timeout_s`` seconds of running.

        All jobs are sent at once; outcomes are yielded in job order as ``(result or exception,
        seconds)``, a late call's exception being :class:`ScoreTimeoutError` and a call that
        killed its worker (a crash, ``os._exit``) :class:`ScoringProcessDied`. A caller that stops iterating
        cancels the calls not yet done.

        Raises:
            RewardPoolError: ``fn`` cannot be sent to the workers, or the whole batch had no result
                within ``ceil(len(jobs) / num_workers) x timeout_s`` plus :data:`START_TIMEOUT_S`
                (workers that keep dying on start).
        """
        fn_bytes = self._pickled(fn)
        futures = [self._pool.schedule(_run_call, args=(fn_bytes, job), timeout=timeout_s) for job in jobs]
        budget = math.ceil(len(jobs) / self.num_workers) * timeout_s + START_TIMEOUT_S
        deadline = time.monotonic() + budget
        try:
            for future in futures:
                yield self._outcome(future, deadline, budget, timeout_s, len(jobs))
        finally:
            for future in futures:
                future.cancel()  # a running call's worker is killed and replaced

    def _pickled(self, fn: Callable[..., Any]) -> bytes:
        try:
            return pickle.dumps(fn)
        except Exception as exc:  # PicklingError, AttributeError, TypeError
            raise RewardPoolError(
                f"the reward function {fn!r} cannot be sent to the scoring processes (reward.num_workers="
                f"{self.num_workers}): {type(exc).__name__}: {exc}; define it at the top level of a module or of "
                "custom_reward_function.path, or score in the driver (reward.num_workers=null)"
            ) from exc

    def _outcome(self, future, deadline: float, budget: float, timeout_s: float, n: int) -> tuple[Any, float]:
        try:
            result, error, seconds = self._result(future, deadline)
        except TimeoutError as exc:
            if not future.done():  # our wait ran out, not the call's own deadline
                raise RewardPoolError(
                    f"reward.num_workers={self.num_workers}: the batch of {n} scoring calls had no result "
                    f"after {budget:g} s (ceil({n}/{self.num_workers}) x reward_model.timeout_s={timeout_s:g} s "
                    f"+ {START_TIMEOUT_S:g} s to start workers); the processes may fail to start, see the log"
                ) from exc
            return ScoreTimeoutError(
                f"no result within reward_model.timeout_s={timeout_s:g} s (its scoring process was killed)"
            ), timeout_s
        except RewardPoolError:
            raise
        except BrokenProcessPool as exc:
            if self.closed:
                raise self._closed_error() from exc
            raise RewardPoolError(
                f"reward.num_workers={self.num_workers}: no result for a scoring call: the scoring processes "
                f"keep dying on start ({exc}); see the log above"
            ) from exc
        except (ProcessExpired, CancelledError) as exc:
            if self.closed:  # close() killed the worker or cancelled the call: not this sample's doing
                raise self._closed_error() from exc
            if isinstance(exc, CancelledError):
                return exc, 0.0
            # the call killed its worker (a crash, os._exit): this sample fails
            return ScoringProcessDied(f"the scoring process died (exit code {exc.exitcode})"), 0.0
        except Exception as exc:  # noqa: BLE001 - an outcome like any other
            return exc, 0.0
        return (error if error is not None else result), seconds

    def _result(self, future, deadline: float):
        """``future.result()`` by the ``deadline``, in short waits: a call the pool's closing left
        pending (pebble does not always settle it) must not hold its caller until the deadline.

        Raises:
            RewardPoolError: the pool was closed while the call had no result.
            TimeoutError: the deadline passed, or the call's own timeout (``future.done()`` then).
        """
        while True:
            remaining = deadline - time.monotonic()
            try:
                return future.result(timeout=max(0.0, min(remaining, CLOSED_POLL_S)))
            except TimeoutError:
                if future.done() or remaining <= CLOSED_POLL_S:
                    raise
                if self.closed:
                    raise self._closed_error() from None

    def _closed_error(self) -> RewardPoolError:
        return RewardPoolError(
            f"reward.num_workers={self.num_workers}: no result for a scoring call: the pool was closed"
        )

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Lets running calls finish for at most ``timeout_s`` seconds, then kills the workers."""
        self.closed = True
        self._pool.close()
        try:
            self._pool.join(timeout=timeout_s)
        except TimeoutError:
            logger.warning(
                "reward pool: calls still running %g s after the end of training; killing its %d processes",
                timeout_s,
                self.num_workers,
            )
            _stop(self._pool)
        self._finalizer.detach()

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _stop(pool) -> None:
    pool.stop()
    try:
        pool.join(timeout=CLOSE_TIMEOUT_S)
    except TimeoutError:
        logger.warning("reward pool: its processes did not stop within %g s", CLOSE_TIMEOUT_S)


def inherited_settings() -> list[Callable[[], Any]]:
    """What every scoring process takes over from the driver, as picklable callables it runs at
    start: the code sandbox (``set_sandbox(current_sandbox())`` of the driver, as it is when the
    pool is built)."""
    return [functools.partial(set_sandbox, current_sandbox())]


def build_reward_pool(
    num_workers: Any, reward_file: str | None = None, external_lib: str | None = None
) -> RewardPool | None:
    """The pool ``reward.num_workers`` asks for, or None (null, 0, 1: score in the driver).

    Build it after the driver's code sandbox is set: the workers take over the setting of that
    moment (:func:`inherited_settings`).

    Args:
        num_workers: ``reward.num_workers`` (also spelled ``reward_model.num_workers``).
        reward_file: ``custom_reward_function.path``, imported in each worker.
        external_lib: ``actor_rollout_ref.model.external_lib``, imported in each worker (where
            scorers registered with ``@register_scorer`` live).

    Raises:
        RewardConfigError: ``num_workers`` is not null or a whole number >= 0.
    """
    workers = check_num_workers(num_workers)
    if workers == 0:
        return None
    files = [os.path.abspath(os.path.expanduser(str(reward_file)))] if reward_file else []
    return RewardPool(
        workers, reward_files=files, modules=[external_lib] if external_lib else [], worker_init=inherited_settings()
    )
