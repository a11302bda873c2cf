"""The profiler sections of the PPO config, typed (verl's ``ProfilerConfig`` and
``TorchProfilerToolConfig``): ``global_profiler`` (which steps, which tool, where) and each role's
``profiler`` (whether the role's workers take part, on which ranks, what the trace records).

verl's ``torch`` (``torch.profiler`` traces), ``torch_memory`` (CUDA memory snapshots) and ``nsys``
(Nsight Systems capture ranges) tools are here (:mod:`hybridrl.workers.profiler`); ``npu`` (Ascend
NPUs) and ``precision_debugger`` are refused naming the tool, and the other tools'
``tool_config`` / ``global_tool_config`` keys are answered by :mod:`hybridrl.config.verl_compat`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from hybridrl.config.rules import at_least, is_unresolved
from hybridrl.config.typed import refused
from hybridrl.errors import ConfigError

__all__ = [
    "TORCH_CONTENTS",
    "GlobalProfilerConfig",
    "ProfilerConfig",
    "ToolConfig",
    "TorchToolConfig",
    "check_profiler",
    "check_tool",
    "chosen",
    "reward_model_profiler",
    "rollout_profiler",
    "starts",
    "stops",
]

# what a torch trace may record (verl's TorchProfilerToolConfig.contents); none: CPU and CUDA activity
TORCH_CONTENTS = ("cpu", "cuda", "memory", "shapes", "stack")
TOOLS = ("torch", "torch_memory", "nsys")
OTHER_TOOLS = ("npu", "precision_debugger")
GLOBAL = "${oc.select:global_profiler."
ACTOR_PROFILER = "${oc.select:actor_rollout_ref.actor.profiler."
_ACTOR_KEYS = {"enable": "false", "all_ranks": "false", "ranks": "[]", "tool_config": "null"}  # the rollout's defaults


def check_tool(key: str, tool) -> None:
    """``tool`` is None (no profiling) or one of :data:`TOOLS`.

    Raises:
        ConfigError: one line naming ``key`` and the tool.
    """
    if tool is None or tool in TOOLS or is_unresolved(tool):
        return
    if tool == "npu":
        raise ConfigError(
            f"{key}=npu: verl's npu profiler records Ascend NPUs, which hybridrl does not run on; set {key}=torch "
            "(torch.profiler traces) or nsys (CUDA), docs/logging_and_inspection.md"
        )
    if tool in OTHER_TOOLS:
        raise ConfigError(
            f"{key}={tool}: verl's {tool} profiler is not in hybridrl; set {key}=torch "
            "(torch.profiler traces, docs/logging_and_inspection.md)"
        )
    raise ConfigError(f"{key}={tool!r} is not a profiler; set one of {', '.join(TOOLS)} (or null: no profiling)")


@dataclass
class TorchToolConfig:
    """``<role>.profiler.tool_config.torch``: ``contents`` picks what the trace records (``cpu``,
    ``cuda``: the activities, both when none is named; ``shapes``: record_shapes; ``memory``:
    profile_memory; ``stack``: with_stack)."""

    contents: List[str] = field(default_factory=list)
    discrete: bool = refused(False, "discrete torch traces (one per worker call); hybridrl writes one per step")


@dataclass
class ToolConfig:
    """``<role>.profiler.tool_config``: the torch tool's settings (the other tools' keys are verl's only)."""

    torch: TorchToolConfig = field(default_factory=TorchToolConfig)


@dataclass
class ProfilerConfig:
    """``<role>.profiler``: whether this role's workers write traces in the steps of
    ``global_profiler.steps`` (``enable``), on which ranks (``all_ranks``, else ``ranks``, else rank 0),
    with which ``tool`` (``global_profiler.tool`` by default) under ``save_path``."""

    tool: Optional[str] = GLOBAL + "tool,null}"
    enable: bool = False
    all_ranks: bool = False
    ranks: List[int] = field(default_factory=list)
    save_path: Optional[str] = GLOBAL + "save_path,null}"
    tool_config: ToolConfig = field(default_factory=ToolConfig)


def check_profiler(key: str, section) -> None:
    """A role's ``profiler`` section (``key``: its full key): the tool, the contents, the ranks.

    Raises:
        ConfigError: one line naming the key.
    """
    check_tool(f"{key}.tool", section.tool)
    contents = [] if is_unresolved(section.tool_config) else section.tool_config.torch.contents
    if not is_unresolved(contents):
        for item in contents:
            if item not in TORCH_CONTENTS:
                raise ConfigError(
                    f"{key}.tool_config.torch.contents has {item!r}; each entry is one of {', '.join(TORCH_CONTENTS)}"
                )
    if not is_unresolved(section.ranks):
        for rank in section.ranks:
            at_least(f"{key}.ranks[]", rank, 0)


def rollout_profiler() -> ProfilerConfig:
    """``actor_rollout_ref.rollout.profiler``: the actor's by default (verl's interpolations)."""
    follows: dict[str, Any] = {key: f"{ACTOR_PROFILER}{key},{default}}}" for key, default in _ACTOR_KEYS.items()}
    return ProfilerConfig(**follows)


def reward_model_profiler() -> ProfilerConfig:
    """``reward_model.profiler``: its own switch, the actor's ``tool_config`` (verl's interpolation)."""
    follows: dict[str, Any] = {"tool_config": ACTOR_PROFILER + "tool_config,null}"}
    return ProfilerConfig(**follows)


@dataclass
class GlobalProfilerConfig:
    """``global_profiler``: the steps to profile (``steps``, the run's step numbers from 1), the tool
    (null: no profiling; ``torch``), where the traces go (``save_path``) and whether consecutive
    chosen steps share one trace (``profile_continuous_steps``)."""

    tool: Optional[str] = None
    steps: Optional[List[int]] = None
    profile_continuous_steps: bool = False
    save_path: str = "outputs/profile"

    def __post_init__(self):
        check_tool("global_profiler.tool", self.tool)
        if self.steps is not None and not is_unresolved(self.steps):
            for step in self.steps:
                at_least("global_profiler.steps[]", step, 1, "(the run's steps count from 1)")


def chosen(section, step: int) -> bool:
    """Whether ``step`` is profiled by the ``global_profiler`` ``section`` (a tool and ``steps`` set,
    ``step`` among them)."""
    return section.tool is not None and section.steps is not None and step in section.steps


def starts(section, step: int) -> bool:
    """Whether the workers start a trace before ``step`` (``section``: ``global_profiler``)."""
    return chosen(section, step) and not (section.profile_continuous_steps and chosen(section, step - 1))


def stops(section, step: int) -> bool:
    """Whether the workers write their trace after ``step`` (``section``: ``global_profiler``)."""
    return chosen(section, step) and not (section.profile_continuous_steps and chosen(section, step + 1))
