"""Multi-turn agent loops: tool calling, interactions and search, token-exact.

An agent loop (chosen per row by the dataset column ``agent_name``) talks to the policy over
several turns; its response is built by appending token ids turn by turn, with a
``response_mask`` that is 1 on the tokens the policy sampled and 0 on the tokens a tool, a
retriever or a simulated user wrote. The actor's loss, entropy, KL and the advantages all use
that mask, so observation tokens carry no gradient.

Built-in loops:

* ``single_turn_agent`` (default): one generation, as the plain rollout.
* ``tool_agent``: Hermes ``<tool_call>{"name", "arguments"}</tool_call>`` calls of the tools in
  ``actor_rollout_ref.rollout.multi_turn.tool_config_path``, and an optional interaction
  (``extra_info.interaction_kwargs.name``) that answers the model's turns.
* ``search_agent``: Search-R1's ``<search>`` / ``<information>`` / ``<answer>`` protocol
  ("Search-R1: Training LLMs to Reason and Leverage Search Engines with Reinforcement
  Learning", Jin et al., arXiv:2503.09516) against the ``retriever`` section.

Extending::

    from hybridrl.agents import AgentLoopBase, AgentLoopOutput, register_agent_loop

    @register_agent_loop("my_agent")
    class MyAgent(AgentLoopBase):
        async def run(self, sampling_params, **row) -> AgentLoopOutput: ...

Tools subclass :class:`hybridrl.agents.tools.BaseTool`, interactions
:class:`hybridrl.agents.interactions.BaseInteraction`. The rollout worker runs the loops through
:class:`hybridrl.agents.manager.AgentLoopManager`. See docs/agents.md.

Importing this package is light: no torch, no transformers.
"""

from hybridrl.agents.base import (
    AgentContext,
    AgentLoopBase,
    AgentLoopOutput,
    ResponseBuilder,
    get_agent_loop_cls,
    known_agent_loops,
    register_agent_loop,
    register_agent_loops_from_file,
)
from hybridrl.agents.errors import AgentConfigError

__all__ = [
    "AgentConfigError",
    "AgentContext",
    "AgentLoopBase",
    "AgentLoopOutput",
    "ResponseBuilder",
    "get_agent_loop_cls",
    "known_agent_loops",
    "register_agent_loop",
    "register_agent_loops_from_file",
]
