"""Client of a remote Sandbox Fusion service (verl's ``reward_model.sandbox_fusion.*`` keys).

Sandbox Fusion (github.com/bytedance/SandboxFusion) runs code in its own containers and answers
``POST <url>`` (its ``/run_code`` endpoint) with JSON. The request carries ``code``,
``language``, ``stdin``, ``run_timeout``, ``compile_timeout`` and ``memory_limit_MB``; the answer
has a top-level ``status`` (``Success`` | ``Failed`` | ``SandboxError``) and a ``run_result``
with ``status`` (``Finished`` | ``TimeLimitExceeded`` | ...), ``return_code``, ``stdout``,
``stderr`` and ``execution_time``. Only the standard library is used for the HTTP call.

The code scorer does not trust the run's exit status (a program can exit 0 before its tests
fail): its harness prints a nonce it read from ``stdin`` once the tests returned, and the scorer
looks for it in the ``stdout`` the service returns (:mod:`hybridrl.rewards.code`). So the service
must pass ``stdin`` to the program, as Sandbox Fusion does; one that drops it scores every
assert-style program 0, visibly, never 1. The service runs the program on its own machines, so
signals and limits are its business.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

from hybridrl.rewards.sandbox.base import SandboxConfigError, SandboxResult

__all__ = ["SandboxFusionClient"]

# Seconds a request may take beyond the program's own run timeout (queueing, container start).
_REQUEST_OVERHEAD_S = 30.0


class SandboxFusionClient:
    """Runs Python programs on a Sandbox Fusion service; the same interface as ``LocalSandbox``.

    Args:
        url: the service's run-code endpoint, e.g. ``http://host:8080/run_code``
            (``reward_model.sandbox_fusion.url``).
        max_concurrent: requests in flight at once from this process
            (``reward_model.sandbox_fusion.max_concurrent``).
        memory_limit_mb: memory of each run, MiB (``reward_model.sandbox_fusion.memory_limit_mb``).
        timeout_s: default run timeout, seconds (``reward_model.sandbox.timeout_s``).

    Raises:
        SandboxConfigError: a bad url, max_concurrent or memory_limit_mb.
    """

    def __init__(
        self, url: str, max_concurrent: int = 64, memory_limit_mb: int = 1024, timeout_s: float = 10.0
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise SandboxConfigError(
                f"reward_model.sandbox_fusion.url={url!r} must be an http(s) URL of the "
                "service's run_code endpoint, e.g. http://localhost:8080/run_code"
            )
        for key, value in (("max_concurrent", max_concurrent), ("memory_limit_mb", memory_limit_mb)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SandboxConfigError(f"reward_model.sandbox_fusion.{key}={value!r} must be a whole number >= 1")
        self.url, self.max_concurrent, self.memory_limit_mb = url, max_concurrent, memory_limit_mb
        self.timeout_s = float(timeout_s)
        self._slots = threading.BoundedSemaphore(max_concurrent)

    def __getstate__(self) -> dict:  # picklable for the scoring pool; each process gets its own slots
        return {k: v for k, v in self.__dict__.items() if k != "_slots"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._slots = threading.BoundedSemaphore(self.max_concurrent)

    def run(self, source: str, stdin: str = "", timeout_s: float | None = None) -> SandboxResult:
        """Run ``source`` on the service; see :meth:`hybridrl.rewards.sandbox.Sandbox.run`.

        A service that cannot be reached, answers with an HTTP error or with ``SandboxError``
        gives status ``sandbox_error`` (the program is not at fault).
        """
        timeout = float(timeout_s or self.timeout_s)
        payload = {
            "code": source,
            "language": "python",
            "stdin": stdin,
            "run_timeout": timeout,
            "compile_timeout": timeout,
            "memory_limit_MB": self.memory_limit_mb,
        }
        started = time.perf_counter()
        deadline = timeout + _REQUEST_OVERHEAD_S
        if not self._slots.acquire(timeout=deadline):
            return SandboxResult(
                "sandbox_error",
                None,
                "",
                "",
                time.perf_counter() - started,
                f"no free request slot within {deadline:g} s "
                f"(reward_model.sandbox_fusion.max_concurrent={self.max_concurrent})",
            )
        try:
            answer = self._post(payload, deadline)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            return SandboxResult(
                "sandbox_error",
                None,
                "",
                "",
                time.perf_counter() - started,
                f"Sandbox Fusion at {self.url} failed: {' '.join(str(exc).split())}",
            )
        finally:
            self._slots.release()
        return _to_result(answer, time.perf_counter() - started, timeout)

    def _post(self, payload: dict, timeout: float) -> dict:
        request = urllib.request.Request(
            self.url, data=json.dumps(payload).encode(), method="POST", headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer = json.loads(response.read().decode("utf-8"))
        if not isinstance(answer, dict):
            raise ValueError(f"answered {type(answer).__name__}, not a JSON object")
        return answer


def _to_result(answer: dict, wall: float, timeout: float) -> SandboxResult:
    run = answer.get("run_result") or {}
    stdout, stderr = str(run.get("stdout") or ""), str(run.get("stderr") or "")
    returncode = run.get("return_code")
    if answer.get("status") == "SandboxError" or not run:
        message = answer.get("message") or answer.get("status") or "no run_result"
        return SandboxResult("sandbox_error", None, stdout, stderr, wall, f"Sandbox Fusion: {message}")
    if run.get("status") == "TimeLimitExceeded":
        return SandboxResult("timeout", returncode, stdout, stderr, wall, f"ran over the time limit of {timeout:g} s")
    if returncode == 0 and run.get("status") == "Finished":
        return SandboxResult("ok", 0, stdout, stderr, wall)
    tail = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "")
    status = "memory" if "MemoryError" in stderr else "error"
    why = f"exit code {returncode}" + (f": {tail[:300]}" if tail else f" ({run.get('status')})")
    return SandboxResult(status, returncode, stdout, stderr, wall, why)
