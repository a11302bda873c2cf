"""Errors of the agent loops, tools and interactions.

:class:`AgentConfigError` is a :class:`~hybridrl.errors.ConfigError`, so the command line
prints it as one line: a bad tool/interaction YAML, an unknown agent name, a row that asks for
a tool or interaction the config does not define.
"""

from __future__ import annotations

from hybridrl.errors import ConfigError
from hybridrl.registry import RegistryError


class AgentConfigError(ConfigError):
    """The agent-loop setup (config keys, tool or interaction YAML, row fields) is wrong."""


class AgentToolError(AgentConfigError):
    """A tool's ``create`` / ``calc_reward`` / ``release`` raised: the episode cannot be scored,
    and the tool's code or config must change (printed as one line naming tool and phase)."""


class AgentNameError(AgentConfigError, RegistryError):
    """An agent loop, tool or interaction registry was given an unknown name, or a second class
    under a taken one."""
