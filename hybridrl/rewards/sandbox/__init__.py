"""Where model-written code runs: a local isolated sandbox (default) or a Sandbox Fusion service.

Code scorers call ``current_sandbox().run(source, stdin)`` and read the :class:`SandboxResult`.
The trainer sets the process's sandbox from the config once (:func:`build_sandbox` then
:func:`set_sandbox`); the scoring pool passes it to its workers. Without a setting, the local
sandbox with default limits is used.

Config (``reward_model.sandbox.*`` is hybridrl's; ``reward_model.sandbox_fusion.*`` is verl's,
also spelled ``reward.sandbox_fusion.*``)::

    reward_model.sandbox: {timeout_s, cpu_time_s, memory_limit_mb, max_processes,
                           max_file_size_mb, unsafe_no_isolation}
    reward_model.sandbox_fusion: {url, max_concurrent, memory_limit_mb}   # url set: use the service
"""

from __future__ import annotations

import threading
from typing import Any, Mapping

from hybridrl.rewards.sandbox.base import (RUN_STATUSES, Sandbox, SandboxConfigError, SandboxLimits,
                                           SandboxResult, SandboxUnavailableError)
from hybridrl.rewards.sandbox.fusion import SandboxFusionClient
from hybridrl.rewards.sandbox.local import LocalSandbox

__all__ = ["RUN_STATUSES", "Sandbox", "SandboxConfigError", "SandboxLimits", "SandboxResult",
           "SandboxUnavailableError", "SandboxFusionClient", "LocalSandbox", "build_sandbox",
           "current_sandbox", "set_sandbox"]

_lock = threading.Lock()
_current: Sandbox | None = None


def current_sandbox() -> Sandbox:
    """The sandbox of this process: the one last given to :func:`set_sandbox`, else a default
    :class:`LocalSandbox`."""
    global _current
    with _lock:
        if _current is None:
            _current = LocalSandbox()
        return _current


def set_sandbox(sandbox: Sandbox | None) -> None:
    """Make ``sandbox`` this process's sandbox (``None``: back to the default)."""
    global _current
    with _lock:
        _current = sandbox


def build_sandbox(sandbox_cfg: Mapping[str, Any] | None, fusion_cfg: Mapping[str, Any] | None = None) -> Sandbox:
    """The sandbox a config asks for.

    Args:
        sandbox_cfg: ``reward_model.sandbox`` (limits; ``unsafe_no_isolation``); missing keys
            take :class:`SandboxLimits`' defaults.
        fusion_cfg: ``reward_model.sandbox_fusion``; with a ``url`` the service is used.

    Raises:
        SandboxConfigError: an unknown key or a bad value (one line naming the key).
    """
    sandbox_cfg = dict(sandbox_cfg or {})
    unsafe = sandbox_cfg.pop("unsafe_no_isolation", False)
    if not isinstance(unsafe, bool):
        raise SandboxConfigError(f"reward_model.sandbox.unsafe_no_isolation={unsafe!r} must be true or false")
    known = set(SandboxLimits.__dataclass_fields__)
    unknown = sorted(set(sandbox_cfg) - known)
    if unknown:
        raise SandboxConfigError(f"reward_model.sandbox.{unknown[0]} is not a sandbox setting; known: "
                                 f"{', '.join(sorted(known | {'unsafe_no_isolation'}))}")
    limits = SandboxLimits(**{k: v for k, v in sandbox_cfg.items() if v is not None or k == "cpu_time_s"})
    fusion_cfg = dict(fusion_cfg or {})
    if fusion_cfg.get("url"):
        return SandboxFusionClient(fusion_cfg["url"], max_concurrent=fusion_cfg.get("max_concurrent") or 64,
                                   memory_limit_mb=fusion_cfg.get("memory_limit_mb") or 1024,
                                   timeout_s=limits.timeout_s)
    return LocalSandbox(limits, unsafe_no_isolation=unsafe)
