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
from typing import Any

from hybridrl.rewards.sandbox.base import (
    RUN_STATUSES,
    Sandbox,
    SandboxConfigError,
    SandboxLimits,
    SandboxResult,
    SandboxUnavailableError,
)
from hybridrl.rewards.sandbox.fusion import SandboxFusionClient
from hybridrl.rewards.sandbox.local import LocalSandbox

__all__ = [
    "RUN_STATUSES",
    "Sandbox",
    "SandboxConfigError",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailableError",
    "SandboxFusionClient",
    "LocalSandbox",
    "build_sandbox",
    "current_sandbox",
    "set_sandbox",
]

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


def build_sandbox(sandbox_cfg: Any, fusion_cfg: Any) -> Sandbox:
    """The sandbox a config asks for.

    Args:
        sandbox_cfg: ``reward_model.sandbox`` of the typed PPO config (limits; ``unsafe_no_isolation``).
        fusion_cfg: ``reward_model.sandbox_fusion`` of the typed PPO config; with a ``url`` the
            service is used.

    Raises:
        SandboxConfigError: a limit that is not > 0, or a ``url`` that is not http(s) (one line
            naming the key).
    """
    limits = SandboxLimits(
        timeout_s=sandbox_cfg.timeout_s,
        cpu_time_s=sandbox_cfg.cpu_time_s,
        memory_limit_mb=sandbox_cfg.memory_limit_mb,
        max_processes=sandbox_cfg.max_processes,
        max_file_size_mb=sandbox_cfg.max_file_size_mb,
    )
    if fusion_cfg.url:
        return SandboxFusionClient(
            fusion_cfg.url,
            max_concurrent=fusion_cfg.max_concurrent,
            memory_limit_mb=fusion_cfg.memory_limit_mb,
            timeout_s=limits.timeout_s,
        )
    return LocalSandbox(limits, unsafe_no_isolation=sandbox_cfg.unsafe_no_isolation)
