"""The agent-loop interface, its registry, and the token-exact response builder.

An agent loop turns one dataset row into one trajectory: the prompt ids, then a response made
of *model* tokens (sampled by the policy, trained on: ``response_mask`` 1) and *observation*
tokens (tool results, retrieved passages, user feedback: context only, ``response_mask`` 0).
Ids are appended turn by turn and never re-tokenised, so what the actor is trained on is
exactly what the policy saw and sampled (Search-R1's "retrieved token masking", arXiv:2503.09516).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Callable

from hybridrl.agents.config import MultiTurnConfig, RetrieverConfig
from hybridrl.agents.errors import AgentConfigError, AgentNameError
from hybridrl.registry import Registry

__all__ = [
    "AgentLoopOutput",
    "AgentContext",
    "AgentLoopBase",
    "ResponseBuilder",
    "AGENT_LOOPS",
    "register_agent_loop",
    "register_agent_loops_from_file",
    "get_agent_loop_cls",
    "known_agent_loops",
]

# name -> "module:Class" of the built-in loops, imported on first use (keeps `import hybridrl` light).
_BUILTIN_LOOPS = {
    "single_turn_agent": "hybridrl.agents.single_turn:SingleTurnAgentLoop",
    "tool_agent": "hybridrl.agents.tool_agent:ToolAgentLoop",
    "search_agent": "hybridrl.agents.search_agent:SearchAgentLoop",
}
AGENT_LOOPS = Registry(
    "agent loop",
    "agent_name",
    error=AgentNameError,
    builtins=_BUILTIN_LOOPS,
    hint="fix the data's agent_name column (or actor_rollout_ref.rollout.agent.default_agent_loop) "
    "or register yours with @hybridrl.agents.register_agent_loop",
)


@dataclass
class AgentLoopOutput:
    """One trajectory.

    Attributes:
        prompt_ids: the prompt as the policy saw it (unpadded).
        response_ids: model and observation ids in order, at most ``response_length`` long.
        response_mask: same length as ``response_ids``: 1 on model tokens, 0 on observations.
        num_turns: as verl counts it: 1 (the prompt) + assistant turns + observation/user turns.
        metrics: per-trajectory counters (``assistant_turns``, ``tool_calls``, ``tool_errors``,
            ``valid_actions``, ``search_errors``, ...), averaged or summed by the trainer metrics.
        reward_scores: scores the rollout itself produced (a tool's ``calc_reward``, an
            interaction's score), name -> float; handed to the reward function.
        response_logprobs: same length as ``response_ids``: each model token's log-prob under
            the sampling distribution, 0.0 on observations (``ResponseBuilder.log_probs``);
            None when the engine did not record them. They become ``rollout_log_probs``.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    num_turns: int = 2
    metrics: dict[str, float] = field(default_factory=dict)
    reward_scores: dict[str, float] = field(default_factory=dict)
    response_logprobs: list[float] | None = None


class ResponseBuilder:
    """Appends model and observation ids under the ``response_length`` budget.

    Model ids beyond the budget are cut. An observation is appended only when at least one
    model token still fits after it, so a trajectory always ends on a model token (where the
    reward manager puts the score) and never on context the policy did not write.

    ``log_probs`` follows the ids: the engine's log-probs of model ids (``SampledIds.log_probs``),
    0.0 on observations; None once a model turn came without them.
    """

    def __init__(self, response_length: int) -> None:
        self.limit = int(response_length)
        self.ids: list[int] = []
        self.mask: list[int] = []
        self.log_probs: list[float] | None = []

    @property
    def room(self) -> int:
        """Ids that still fit."""
        return self.limit - len(self.ids)

    def add_model(self, ids: list[int]) -> list[int]:
        """Append sampled ids (cut to the room left); returns the ids kept."""
        kept = list(ids[: max(self.room, 0)])
        self.ids.extend(kept)
        self.mask.extend([1] * len(kept))
        sampled = getattr(ids, "log_probs", None)
        if self.log_probs is not None and sampled is not None:
            self.log_probs.extend(sampled[: len(kept)])
        elif kept:
            self.log_probs = None
        return kept

    def add_observation(self, ids: list[int]) -> bool:
        """Append context ids with mask 0; False (nothing appended) when they leave no room."""
        if len(ids) >= self.room:
            return False
        self.ids.extend(ids)
        self.mask.extend([0] * len(ids))
        if self.log_probs is not None:
            self.log_probs.extend([0.0] * len(ids))
        return True


@dataclass
class AgentContext:
    """What the manager shares with every loop of a batch.

    Attributes:
        engine: the generation front (``await engine.generate(...)``): batching
            (:class:`~hybridrl.agents.engine.AsyncBatchEngine`) or one request per turn
            (:class:`~hybridrl.agents.engine.RequestEngine`, ``rollout.mode=async``).
        tokenizer: the policy's tokenizer.
        response_length: the token budget of one response (``rollout.response_length``).
        multi_turn: the typed ``actor_rollout_ref.rollout.multi_turn`` section (every key there;
            :class:`~hybridrl.agents.config.MultiTurnConfig`); by default its packaged defaults.
        tools: tool name -> :class:`~hybridrl.agents.tools.base.BaseTool` instance.
        interactions: interaction name -> :class:`~hybridrl.agents.interactions.base.BaseInteraction`.
        get_retriever: builds (once) and returns the retriever of the ``retriever`` section.
    """

    engine: Any
    tokenizer: Any
    response_length: int
    multi_turn: Any = field(default_factory=lambda: MultiTurnConfig(retriever=RetrieverConfig()))
    tools: dict = field(default_factory=dict)
    interactions: dict = field(default_factory=dict)
    get_retriever: Callable[[], Any] | None = None


class AgentLoopBase(abc.ABC):
    """One episode of an agent with the policy. Subclasses are registered by name with
    :func:`register_agent_loop` and chosen per row by the dataset column ``agent_name``.

    A new instance runs each row; the loops of a batch run concurrently on one event loop and
    their ``engine.generate`` calls are batched together.
    """

    def __init__(self, context: AgentContext) -> None:
        self.context = context
        self.engine = context.engine
        self.tokenizer = context.tokenizer
        self.response_length = context.response_length
        self.max_tokens_per_turn = context.multi_turn.max_tokens_per_turn

    def turn_budget(self, response: ResponseBuilder) -> int:
        """Tokens the next model turn may sample: the room left, capped by ``max_tokens_per_turn``."""
        return min(response.room, int(self.max_tokens_per_turn or response.room))

    @abc.abstractmethod
    async def run(self, sampling_params: dict, **row: Any) -> AgentLoopOutput:
        """Run the episode of one row.

        Args:
            sampling_params: ``do_sample`` / ``temperature`` / ``top_p`` / ``top_k`` overrides.
            **row: the row's non-tensor fields: ``raw_prompt_ids`` (always), ``raw_prompt``
                (messages, with ``data.return_raw_chat``), ``tools_kwargs``,
                ``interaction_kwargs``, ``extra_info``, ``reward_model``, ``data_source``, ...

        Returns:
            The trajectory; ``len(response_ids) <= response_length``.
        """


def register_agent_loop(name: str):
    """Class decorator: rows with ``agent_name == name`` run this loop.

    Raises:
        AgentConfigError: ``name`` is not a non-empty string. AgentNameError: another class has it.
    """
    if not isinstance(name, str) or not name:
        raise AgentConfigError(f"register_agent_loop({name!r}): give a non-empty name, e.g. 'my_agent'")
    return AGENT_LOOPS.register(name)


def register_agent_loops_from_file(path: str, key: str = "actor_rollout_ref.rollout.agent.agent_loop_config_path"):
    """Registers the loops that verl's agent loop config file lists: a YAML list of
    ``{name: <agent_name>, _target_: <module>.<Class>}`` (the class, a subclass of
    :class:`AgentLoopBase`, is imported when a row first names it, so the module must be importable
    in the workers). Returns the names.

    Raises:
        AgentConfigError: no such file, or an entry without a ``name`` and a dotted ``_target_`` (one
            line naming ``key``). AgentNameError: a name another class already has.
    """
    import os

    from omegaconf import OmegaConf

    full = os.path.expanduser(str(path))
    if not os.path.isfile(full):
        raise AgentConfigError(f"{key}={path}: file not found; fix the path or set {key}=null")
    entries = OmegaConf.to_container(OmegaConf.load(full))
    names = []
    for i, entry in enumerate(entries if isinstance(entries, list) else [entries]):
        name = entry.get("name") if isinstance(entry, dict) else None
        target = entry.get("_target_") if isinstance(entry, dict) else None
        if not name or not isinstance(target, str) or "." not in target:
            raise AgentConfigError(
                f"{key}={path}: entry {i} needs a name and a _target_ (module.Class), e.g. "
                "{name: my_agent, _target_: my_pkg.agents.MyAgentLoop}"
            )
        module, _, cls = target.rpartition(".")
        AGENT_LOOPS.register_lazy(name, f"{module}:{cls}")  # the same target again (a second call) is fine
        names.append(name)
    return names


def known_agent_loops() -> list[str]:
    """Sorted names of the built-in and registered agent loops."""
    return AGENT_LOOPS.names()


def get_agent_loop_cls(name: str) -> type[AgentLoopBase]:
    """The loop class registered as ``name`` (a built-in is imported on first use).

    Raises:
        AgentNameError (an AgentConfigError): no loop has that name.
    """
    return AGENT_LOOPS.get(name)
