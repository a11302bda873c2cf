"""The agent-loop sections of the PPO config, typed: ``actor_rollout_ref.rollout.multi_turn``,
``actor_rollout_ref.rollout.agent`` and the top-level ``retriever`` (Search-R1's). Defaults are
those of the packaged ``ppo_trainer.yaml`` (a test keeps them equal)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from hybridrl.config.rules import at_least, number_above, one_of
from hybridrl.config.typed import ignored, refused
from hybridrl.data.config import ClassRefConfig
from hybridrl.errors import ConfigError

__all__ = ["RetrieverConfig", "SearchConfig", "MultiTurnConfig", "AgentLoopConfig"]

MULTI_TURN = "actor_rollout_ref.rollout.multi_turn"


@dataclass
class RetrieverConfig:
    """``retriever``: a Search-R1 server at ``url``, else in-process BM25 over ``corpus_path``.

    ``topk`` passages per search; ``timeout`` in seconds per request.
    """

    url: Optional[str] = None
    topk: int = 3
    timeout: float = 10
    corpus_path: Optional[str] = None
    index_dir: Optional[str] = None

    def __post_init__(self):
        at_least("retriever.topk", self.topk, 1)
        if not number_above(self.timeout, 0):
            raise ConfigError(f"retriever.timeout={self.timeout!r} must be a number of seconds > 0")


@dataclass
class SearchConfig:
    """``multi_turn.search``: turns that may search (``max_turns``), tokens per observation."""

    max_turns: int = 2
    max_obs_length: int = 256

    def __post_init__(self):
        at_least(f"{MULTI_TURN}.search.max_turns", self.max_turns, 0)
        at_least(f"{MULTI_TURN}.search.max_obs_length", self.max_obs_length, 1)


@dataclass
class MultiTurnConfig:
    """``rollout.multi_turn``: the tool agent's limits, tools and interactions (docs/agents.md).

    Turn and call counts are per episode (null: no limit); ``max_tokens_per_turn`` in tokens;
    ``max_tool_response_length`` in characters.
    """

    enable: bool = False
    max_assistant_turns: Optional[int] = None
    max_user_turns: Optional[int] = None
    max_tokens_per_turn: Optional[int] = None
    max_parallel_calls: int = 1
    max_tool_response_length: int = 256
    tool_response_truncate_side: str = "middle"
    tool_config_path: Optional[str] = None
    interaction_config_path: Optional[str] = None
    completion_callback: Optional[str] = refused(None, "custom multi-turn completion callbacks")
    use_inference_chat_template: bool = ignored(False, "the prompt's own chat template is used")
    tokenization_sanity_check_mode: str = ignored(
        "strict", "agent loops append token ids turn by turn and never re-tokenise"
    )
    format: str = "hermes"
    search: SearchConfig = field(default_factory=SearchConfig)
    retriever: RetrieverConfig = "${retriever}"  # the top-level section, handed to the rollout worker

    def __post_init__(self):
        if self.format == "gpt-oss":
            raise ConfigError(
                f"{MULTI_TURN}.format=gpt-oss: the gpt-oss (harmony) tool-call format is not in hybridrl; the agent "
                "loops parse <tool_call> JSON blocks (format=hermes, which Qwen's templates use)"
            )
        # qwen: verl's SGLang parser name for Qwen2.5/3's tool calls, which are the <tool_call> JSON blocks of hermes
        one_of(f"{MULTI_TURN}.format", self.format, ("hermes", "qwen"))
        one_of(
            f"{MULTI_TURN}.tool_response_truncate_side", self.tool_response_truncate_side, ("left", "middle", "right")
        )
        at_least(f"{MULTI_TURN}.max_parallel_calls", self.max_parallel_calls, 1)
        at_least(f"{MULTI_TURN}.max_tool_response_length", self.max_tool_response_length, 1)
        for name in ("max_assistant_turns", "max_user_turns", "max_tokens_per_turn"):
            if getattr(self, name) is not None:
                at_least(f"{MULTI_TURN}.{name}", getattr(self, name), 1)


@dataclass
class AgentLoopConfig:
    """``rollout.agent``: the loop of rows without an ``agent_name`` column."""

    default_agent_loop: str = "single_turn_agent"
    # verl's file of loops to register: a YAML list of {name, _target_: module.Class}
    agent_loop_config_path: Optional[str] = None
    num_workers: int = ignored(8, "the agent loops run as asyncio tasks in the rollout worker")
    custom_async_server: ClassRefConfig = refused(
        factory=ClassRefConfig, subkeys={"path": "a custom async rollout server"}
    )
