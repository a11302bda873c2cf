"""Tools the ``tool_agent`` can call: the interface, the OpenAI function schema, the registry,
and the loader of verl's tool config YAML.

A tool config file (``actor_rollout_ref.rollout.multi_turn.tool_config_path``), verl's format::

    tools:
      - class_name: hybridrl.agents.tools.gsm8k.Gsm8kTool   # a dotted path or a registered name
        config: {timeout: 30}                                # given to the tool's constructor
        tool_schema:                                         # optional when the class has one
          type: function
          function:
            name: calc_gsm8k_reward
            description: ...
            parameters: {type: object, properties: {answer: {type: string}}, required: [answer]}

Each row gives per-tool arguments in ``extra_info.tools_kwargs``:
``{tool_name: {"create_kwargs": {...}, "execute_kwargs": {...}, "calc_reward_kwargs": {...},
"release_kwargs": {...}}}``.
"""

from __future__ import annotations

from typing import Any, Literal
from uuid import uuid4

from pydantic import BaseModel, ValidationError

from hybridrl.agents.config_files import read_yaml_list, resolve_class
from hybridrl.agents.errors import AgentConfigError, AgentNameError
from hybridrl.registry import Registry

__all__ = [
    "OpenAIFunctionParameters",
    "OpenAIFunction",
    "OpenAIFunctionToolSchema",
    "BaseTool",
    "TOOLS",
    "register_tool",
    "load_tools",
]

DEFAULT_TIMEOUT_S = 30.0
# verl's built-in tools -> ours, so a verl tool config works unchanged.
_VERL_ALIASES = {
    "verl.tools.gsm8k_tool.Gsm8kTool": "hybridrl.agents.tools.gsm8k.Gsm8kTool",
    "verl.tools.search_tool.SearchTool": "hybridrl.agents.tools.search.SearchTool",
}
# ``class_name`` values of a tool config; the built-in tools are imported on first use.
TOOLS = Registry(
    "tool",
    "class_name",
    error=AgentNameError,
    builtins={
        "calc_gsm8k_reward": "hybridrl.agents.tools.gsm8k:Gsm8kTool",
        "calculator": "hybridrl.agents.tools.gsm8k:CalculatorTool",
        "search": "hybridrl.agents.tools.search:SearchTool",
    },
)


class OpenAIFunctionParameters(BaseModel):
    """The JSON schema of a function's arguments (an object schema)."""

    type: Literal["object"] = "object"
    properties: dict[str, Any] = {}
    required: list[str] = []


class OpenAIFunction(BaseModel):
    name: str
    description: str = ""
    parameters: OpenAIFunctionParameters = OpenAIFunctionParameters()


class OpenAIFunctionToolSchema(BaseModel):
    """OpenAI's ``{"type": "function", "function": {name, description, parameters}}``."""

    type: Literal["function"] = "function"
    function: OpenAIFunction


class BaseTool:
    """A tool with per-episode state: ``create`` -> ``execute`` (any number of times) ->
    ``calc_reward`` -> ``release`` (verl's interface; all async).

    Args:
        config: the ``config`` mapping of the tool's YAML entry. ``timeout`` (seconds, default
            30) bounds one ``execute``; a slower call becomes an error response.
        tool_schema: the function schema the model sees; None: the class's :attr:`DEFAULT_SCHEMA`.

    Raises:
        AgentConfigError: no schema given and the class has none.
    """

    DEFAULT_SCHEMA: dict | None = None

    def __init__(self, config: dict | None = None, tool_schema: OpenAIFunctionToolSchema | dict | None = None):
        self.config = dict(config or {})
        schema = tool_schema if tool_schema is not None else self.DEFAULT_SCHEMA
        if schema is None:
            raise AgentConfigError(f"tool {type(self).__name__}: give a tool_schema (it has no default one)")
        self.tool_schema = (
            schema if isinstance(schema, OpenAIFunctionToolSchema) else OpenAIFunctionToolSchema.model_validate(schema)
        )
        self.name = self.tool_schema.function.name
        self.timeout_s = float(self.config.get("timeout", DEFAULT_TIMEOUT_S))
        self._instances: dict[str, dict] = {}

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return self.tool_schema

    async def create(self, instance_id: str | None = None, **kwargs) -> str:
        """Start an episode's state (``create_kwargs`` of the row); returns its instance id."""
        instance_id = instance_id or str(uuid4())
        self._instances[instance_id] = dict(kwargs)
        return instance_id

    async def execute(self, instance_id: str, parameters: dict, **kwargs) -> tuple[str, float, dict]:
        """Run one call. Returns ``(response text, step reward, metrics)``; raising is allowed
        (the loop turns it into an error response)."""
        raise NotImplementedError

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        """The episode's reward from this tool's point of view (0.0 by default)."""
        return 0.0

    async def release(self, instance_id: str, **kwargs) -> None:
        """Drop the episode's state."""
        self._instances.pop(instance_id, None)


def register_tool(name: str):
    """Class decorator: ``class_name: <name>`` in a tool config means this class.

    Raises:
        AgentNameError: another class is registered under ``name``.
    """
    return TOOLS.register(name)


def _tool_class(class_name: str, where: str) -> type[BaseTool]:
    return resolve_class(TOOLS, class_name, _VERL_ALIASES, BaseTool, where, " (my_pkg.my_tools.MyTool)")


def load_tools(
    path: str, config_key: str = "actor_rollout_ref.rollout.multi_turn.tool_config_path"
) -> dict[str, BaseTool]:
    """Build the tools of a verl tool config file; returns tool name -> instance.

    Raises:
        AgentConfigError: missing or malformed file, an entry without ``class_name``, a class
            that cannot be imported, an invalid schema, or two tools with one name.
    """
    tools: dict[str, BaseTool] = {}
    for i, entry in enumerate(read_yaml_list(path, "tools", config_key)):
        where = f"{config_key}={path}: tools[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str):
            raise AgentConfigError(f"{where}: each entry needs a class_name (and optional config, tool_schema)")
        cls = _tool_class(entry["class_name"], where)
        try:
            tool = cls(config=entry.get("config") or {}, tool_schema=entry.get("tool_schema"))
        except ValidationError as exc:
            first = exc.errors()[0]
            raise AgentConfigError(
                f"{where}: bad tool_schema at {'.'.join(map(str, first['loc']))}: {first['msg']}"
            ) from None
        if tool.name in tools:
            raise AgentConfigError(f"{where}: a second tool named {tool.name!r}; tool names must be unique")
        tools[tool.name] = tool
    return tools
