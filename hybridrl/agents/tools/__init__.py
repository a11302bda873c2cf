"""Tools of the ``tool_agent``: :class:`BaseTool`, the OpenAI function schema, the registry
and the loader of verl's tool config YAML. Built-in tools: ``calc_gsm8k_reward`` and
``calculator`` (:mod:`hybridrl.agents.tools.gsm8k`), ``search`` (:mod:`hybridrl.agents.tools.search`).

The names below are loaded on first access: the schema classes need pydantic (the ``agents``
extra), and the tool agent imports :mod:`hybridrl.agents.tools.loop` of this package on every
training path, with or without tools.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "BaseTool",
    "OpenAIFunction",
    "OpenAIFunctionParameters",
    "OpenAIFunctionToolSchema",
    "load_tools",
    "register_tool",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("hybridrl.agents.tools.base"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
