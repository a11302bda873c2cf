"""``tool_agent``: Hermes tool calling with the configured tools, and an optional interaction.

Each assistant turn is sampled until EOS (at most ``max_tokens_per_turn``). If it holds
``<tool_call>`` blocks, the calls run concurrently on the tools' own event loop (at most
``max_parallel_calls``, each bounded by its tool's timeout, which holds even if a tool blocks; see
:mod:`hybridrl.agents.tools.loop`) and their responses come back as ``tool`` messages; malformed or
unknown calls get an error message instead. A turn without tool calls goes to the row's interaction
when it has one (its reply is a ``user`` message, or it ends the episode), else it ends the episode.
verl's limits apply: ``max_assistant_turns``, ``max_user_turns`` (tool and interaction replies),
``max_tool_response_length`` characters per response, cut on ``tool_response_truncate_side``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from uuid import uuid4

from hybridrl.agents.base import AgentLoopBase, AgentLoopOutput, ResponseBuilder, register_agent_loop
from hybridrl.agents.chat import ChatTurnEncoder, render_prompt_ids
from hybridrl.agents.errors import AgentConfigError, AgentToolError
from hybridrl.agents.tool_parser import parse_hermes_tool_calls
from hybridrl.agents.tools.loop import ToolLoopTimeout, run_on_tool_loop

logger = logging.getLogger(__name__)

TRUNCATE_SIDES = ("left", "middle", "right")
_TRUNCATED = "...(truncated)..."


def truncate_text(text: str, max_length: int, side: str) -> str:
    """``text`` cut to ``max_length`` characters plus a marker; ``side`` is where text is dropped:
    ``left`` keeps the end, ``right`` the start, ``middle`` both ends."""
    if len(text) <= max_length:
        return text
    if side == "left":
        return _TRUNCATED + text[-max_length:]
    if side == "right":
        return text[:max_length] + _TRUNCATED
    head = max_length // 2
    return text[:head] + _TRUNCATED + text[len(text) - (max_length - head) :]


def _mapping(value) -> dict:
    """A row field that should be a dict (parquet gives None for absent struct fields)."""
    return {k: v for k, v in value.items() if v is not None} if isinstance(value, dict) else {}


@dataclass
class _Episode:
    messages: list[dict]
    response: ResponseBuilder
    tool_ids: dict[str, str] = field(default_factory=dict)
    interaction_id: str | None = None
    assistant_turns: int = 0
    user_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    search_errors: int = 0


async def _lifecycle(name: str, tool, phase: str, call):
    """Awaits a tool's ``create`` / ``calc_reward`` / ``release`` on the tools' loop, within the
    tool's timeout; a failure names tool and phase.

    Raises:
        AgentToolError: the call raised (anything but hybridrl's own config errors) or did not
            finish within the tool's ``config.timeout``.
    """
    try:
        return await run_on_tool_loop(call, tool.timeout_s, f"tool {name!r}: its {phase}")
    except AgentConfigError:
        raise
    except ToolLoopTimeout as exc:
        raise AgentToolError(f"{exc}; make it faster or raise the tool's config.timeout") from None
    except Exception as exc:  # a tool's own code failed: say which and where
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise AgentToolError(
            f"tool {name!r}: its {phase} raised {type(exc).__name__}: {first}; fix the tool "
            f"({phase} runs once per episode and must not fail)"
        ) from exc


@register_agent_loop("tool_agent")
class ToolAgentLoop(AgentLoopBase):
    """See the module docstring. Row fields: ``raw_prompt`` (messages; with it the prompt is
    re-templated with the tools' schemas), ``tools_kwargs``, ``interaction_kwargs``."""

    def __init__(self, context) -> None:
        super().__init__(context)
        mt = context.multi_turn
        self.max_assistant_turns = mt.max_assistant_turns
        self.max_user_turns = mt.max_user_turns
        self.max_parallel_calls = int(mt.max_parallel_calls)
        self.max_tool_response_length = int(mt.max_tool_response_length)
        self.truncate_side = mt.tool_response_truncate_side
        self.tools = context.tools
        self.chat = ChatTurnEncoder(self.tokenizer)

    def _interaction_of(self, row: dict):
        kwargs = _mapping(row.get("interaction_kwargs"))
        name = kwargs.pop("name", None)
        if name is None:
            return None, {}
        if name not in self.context.interactions:
            raise AgentConfigError(
                f"a row asks for interaction {name!r} (extra_info.interaction_kwargs.name) but "
                "actor_rollout_ref.rollout.multi_turn.interaction_config_path defines "
                f"{sorted(self.context.interactions) or 'none'}; add it there or fix the data"
            )
        return self.context.interactions[name], kwargs

    async def run(self, sampling_params: dict, **row) -> AgentLoopOutput:
        tools_kwargs = _mapping(row.get("tools_kwargs"))
        interaction, interaction_kwargs = self._interaction_of(row)
        messages = [dict(m) for m in (row.get("raw_prompt") or [])]
        schemas = [tool.get_openai_tool_schema().model_dump() for tool in self.tools.values()]
        prompt_ids = render_prompt_ids(self.tokenizer, messages, schemas) if messages else list(row["raw_prompt_ids"])
        episode = _Episode(messages, ResponseBuilder(self.response_length))
        reward_scores: dict[str, float] = {}
        try:
            for name, tool in self.tools.items():
                create_kwargs = _mapping(_mapping(tools_kwargs.get(name)).get("create_kwargs"))
                episode.tool_ids[name] = await _lifecycle(
                    name, tool, "create", tool.create(str(uuid4()), **create_kwargs)
                )
            if interaction is not None:
                episode.interaction_id = await interaction.start_interaction(str(uuid4()), **interaction_kwargs)
            await self._converse(episode, prompt_ids, sampling_params, tools_kwargs, interaction)
        finally:
            for name, instance_id in episode.tool_ids.items():
                tool, kwargs = self.tools[name], _mapping(tools_kwargs.get(name))
                reward_scores[name] = float(
                    await _lifecycle(
                        name,
                        tool,
                        "calc_reward",
                        tool.calc_reward(instance_id, **_mapping(kwargs.get("calc_reward_kwargs"))),
                    )
                )
                await _lifecycle(
                    name, tool, "release", tool.release(instance_id, **_mapping(kwargs.get("release_kwargs")))
                )
            if episode.interaction_id is not None:
                reward_scores["interaction"] = float(await interaction.calculate_score(episode.interaction_id))
                await interaction.finalize_interaction(episode.interaction_id)
        metrics = {
            "assistant_turns": episode.assistant_turns,
            "tool_calls": episode.tool_calls,
            "tool_errors": episode.tool_errors,
        }
        if any(hasattr(tool, "set_default_retriever") for tool in self.tools.values()):  # a search tool
            metrics["search_errors"] = episode.search_errors
        return AgentLoopOutput(
            prompt_ids,
            episode.response.ids,
            episode.response.mask,
            num_turns=1 + episode.assistant_turns + episode.user_turns,
            metrics=metrics,
            reward_scores=reward_scores,
            response_logprobs=episode.response.log_probs,
        )

    def _turn_limit_reached(self, episode: _Episode) -> bool:
        return bool(
            (self.max_assistant_turns and episode.assistant_turns >= self.max_assistant_turns)
            or (self.max_user_turns and episode.user_turns >= self.max_user_turns)
        )

    async def _converse(self, episode: _Episode, prompt_ids, sampling_params, tools_kwargs, interaction) -> None:
        response = episode.response
        while response.room > 0:
            turn = response.add_model(
                await self.engine.generate(prompt_ids + response.ids, sampling_params, self.turn_budget(response))
            )
            episode.assistant_turns += 1
            if response.room <= 0 or self._turn_limit_reached(episode):
                return
            text = self.tokenizer.decode(turn, skip_special_tokens=True)
            parsed = parse_hermes_tool_calls(text, known_tools=self.tools, max_calls=self.max_parallel_calls)
            episode.messages.append({"role": "assistant", "content": text})
            if parsed.attempted:
                new_messages = await self._run_tools(episode, parsed, tools_kwargs)
            elif interaction is not None:
                done, reply, _, _ = await interaction.generate_response(episode.interaction_id, episode.messages)
                if done:
                    return
                new_messages = [{"role": "user", "content": reply}]
            else:
                return
            episode.messages.extend(new_messages)
            if not response.add_observation(self.chat.encode(new_messages, turn)):
                return  # no room for the replies and another model turn
            episode.user_turns += 1

    async def _run_tools(self, episode: _Episode, parsed, tools_kwargs) -> list[dict]:
        """One ``tool`` message per call (in order), then one per parse error."""
        calls = [self._call_tool(episode, call, tools_kwargs) for call in parsed.calls]
        texts = list(await asyncio.gather(*calls))
        episode.tool_calls += len(parsed.calls)
        episode.tool_errors += len(parsed.errors)
        texts += [f"Error: {error}" for error in parsed.errors]
        return [
            {"role": "tool", "content": truncate_text(t, self.max_tool_response_length, self.truncate_side)}
            for t in texts
        ]

    async def _call_tool(self, episode: _Episode, call, tools_kwargs) -> str:
        from jsonschema import Draft202012Validator

        tool = self.tools[call.name]
        schema = tool.get_openai_tool_schema().function.parameters.model_dump()
        problem = next(iter(sorted(Draft202012Validator(schema).iter_errors(call.arguments), key=str)), None)
        if problem is not None:
            episode.tool_errors += 1
            return f"Error: invalid arguments for {call.name}: {problem.message}"
        execute_kwargs = _mapping(_mapping(tools_kwargs.get(call.name)).get("execute_kwargs"))
        try:
            result = await run_on_tool_loop(
                tool.execute(episode.tool_ids[call.name], call.arguments, **execute_kwargs),
                tool.timeout_s,
                f"tool {call.name!r}: its execute",
            )
        except ToolLoopTimeout as exc:
            logger.warning("%s", exc)
            episode.tool_errors += 1
            return f"Error: {call.name} did not answer within {tool.timeout_s:g} s"
        except Exception as exc:  # noqa: BLE001 - a failing tool is an observation, not a crash
            logger.warning("tool %s failed: %s: %s", call.name, type(exc).__name__, exc)
            episode.tool_errors += 1
            return f"Error: {call.name} failed: {type(exc).__name__}: {exc}"
        text, _step_reward, metrics = result if isinstance(result, tuple) else (result, 0.0, {})
        metrics = metrics or {}
        episode.tool_errors += int(bool(metrics.get("error") or metrics.get("search_error")))
        episode.search_errors += int(bool(metrics.get("search_error")))
        return str(text)
