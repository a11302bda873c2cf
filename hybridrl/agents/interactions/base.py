"""Interactions: a simulated user that answers the model's turns (feedback, a retry).

A row picks one by ``extra_info.interaction_kwargs.name``; the rest of ``interaction_kwargs``
goes to :meth:`BaseInteraction.start_interaction`. The config file
(``actor_rollout_ref.rollout.multi_turn.interaction_config_path``) is verl's format::

    interaction:
      - name: gsm8k                                                   # default: the class's name
        class_name: hybridrl.agents.interactions.gsm8k.Gsm8kInteraction  # dotted path or registered name
        config: {}
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from hybridrl.agents.config_files import read_yaml_list, resolve_class
from hybridrl.agents.errors import AgentConfigError, AgentNameError
from hybridrl.registry import Registry

__all__ = ["BaseInteraction", "INTERACTIONS", "register_interaction", "load_interactions"]

_VERL_ALIASES = {
    "verl.interactions.gsm8k_interaction.Gsm8kInteraction": "hybridrl.agents.interactions.gsm8k.Gsm8kInteraction",
}
# ``class_name`` values of an interaction config; the built-in ones are imported on first use.
INTERACTIONS = Registry(
    "interaction",
    "class_name",
    error=AgentNameError,
    builtins={"gsm8k": "hybridrl.agents.interactions.gsm8k:Gsm8kInteraction"},
)


class BaseInteraction:
    """verl's interaction interface (all async), one instance serving many episodes by id.

    Args:
        config: the ``config`` mapping of the YAML entry, plus ``name``.
    """

    def __init__(self, config: dict | None = None) -> None:
        self.config = dict(config or {})
        self.name = self.config.get("name", "interaction_agent")
        self._instances: dict[str, dict] = {}

    async def start_interaction(self, instance_id: str | None = None, **kwargs) -> str:
        """Start an episode with the row's ``interaction_kwargs``; returns its id."""
        instance_id = instance_id or str(uuid4())
        self._instances[instance_id] = dict(kwargs)
        return instance_id

    async def generate_response(
        self, instance_id: str, messages: list[dict], **kwargs
    ) -> tuple[bool, str, float, dict]:
        """Answer the conversation so far (``messages``: role/content dicts, the model's last
        turn last). Returns ``(should_terminate, response text, turn score, extra)``."""
        raise NotImplementedError

    async def calculate_score(self, instance_id: str, **kwargs) -> float:
        """The episode's score so far (0.0 by default)."""
        return 0.0

    async def finalize_interaction(self, instance_id: str, **kwargs) -> None:
        """Drop the episode's state."""
        self._instances.pop(instance_id, None)


def register_interaction(name: str):
    """Class decorator: ``class_name: <name>`` in an interaction config means this class.

    Raises:
        AgentNameError: another class is registered under ``name``.
    """
    return INTERACTIONS.register(name)


def _interaction_class(class_name: str, where: str) -> type[BaseInteraction]:
    return resolve_class(INTERACTIONS, class_name, _VERL_ALIASES, BaseInteraction, where)


def load_interactions(
    path: str, config_key: str = "actor_rollout_ref.rollout.multi_turn.interaction_config_path"
) -> dict[str, Any]:
    """Build the interactions of a verl interaction config; returns name -> instance.

    Raises:
        AgentConfigError: missing or malformed file, a bad class, or two entries with one name.
    """
    interactions: dict[str, BaseInteraction] = {}
    for i, entry in enumerate(read_yaml_list(path, "interaction", config_key)):
        where = f"{config_key}={path}: interaction[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str):
            raise AgentConfigError(f"{where}: each entry needs a class_name (and optional name, config)")
        cls = _interaction_class(entry["class_name"], where)
        name = entry.get("name") or entry["class_name"].rpartition(".")[2].removesuffix("Interaction").lower()
        if name in interactions:
            raise AgentConfigError(f"{where}: a second interaction named {name!r}; names must be unique")
        interactions[name] = cls({**(entry.get("config") or {}), "name": name})
    return interactions
