"""``search_agent``: Search-R1's reason / search / answer protocol.

Source: "Search-R1: Training LLMs to Reason and Leverage Search Engines with Reinforcement
Learning", Jin et al., arXiv:2503.09516 (its ``LLMGenerationManager``).

Each turn is sampled until ``</search>``, ``</answer>`` or EOS (at most
``multi_turn.max_tokens_per_turn`` tokens, Search-R1's per-turn length). The first
``<search>q</search>`` / ``<answer>a</answer>`` of the turn is its action:

* ``answer``: the episode ends.
* ``search``: the top ``retriever.topk`` passages for ``q`` come back as
  ``\\n\\n<information>Doc 1(Title: t) text\\nDoc 2(...)...</information>\\n\\n``;
* anything else is an invalid action, answered with Search-R1's reminder of the format.

After ``max_turns`` searches-or-invalid turns, one last turn is sampled without search. The
passages of one observation are cut to ``max_obs_length`` tokens (the tags are kept). A
retriever that fails or exceeds ``retriever.timeout`` seconds gives an ``<information>`` block
saying so; the episode (and the run) go on, and ``search_errors`` counts it.
"""

from __future__ import annotations

import asyncio
import logging
import re

from hybridrl.agents.base import AgentLoopBase, AgentLoopOutput, ResponseBuilder, register_agent_loop
from hybridrl.agents.errors import AgentConfigError
from hybridrl.agents.retrieval import RetrieverError, format_passages, search_passages

logger = logging.getLogger(__name__)

STOP = ["</search>", "</answer>"]
_ACTION_RE = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
INVALID_ACTION = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
    "Let me try again.\n"
)
INFO_OPEN, INFO_CLOSE = "\n\n<information>", "</information>\n\n"


def parse_action(text: str) -> tuple[str | None, str]:
    """``("search" | "answer", stripped content)`` of the first complete action, else ``(None, "")``."""
    match = _ACTION_RE.search(text)
    return (match.group(1), match.group(2).strip()) if match else (None, "")


@register_agent_loop("search_agent")
class SearchAgentLoop(AgentLoopBase):
    """Knobs: ``multi_turn.search.max_turns`` (default 2), ``multi_turn.search.max_obs_length``
    (tokens, default 256), ``multi_turn.retriever.topk`` (3) and ``.timeout`` (seconds, 10).

    Raises:
        AgentConfigError: no retriever is configured (``retriever.url`` / ``corpus_path`` /
            ``index_dir``) or a knob is out of range.
    """

    def __init__(self, context) -> None:
        super().__init__(context)
        search, retriever = context.multi_turn.search, context.multi_turn.retriever
        self.max_turns = int(search.max_turns)
        self.max_obs_length = int(search.max_obs_length)
        self.topk = int(retriever.topk)
        self.timeout_s = float(retriever.timeout)
        if self.max_turns < 0 or self.max_obs_length < 1 or self.topk < 1:
            raise AgentConfigError(
                f"search_agent: multi_turn.search.max_turns={self.max_turns} (>= 0), max_obs_length="
                f"{self.max_obs_length} (>= 1) and retriever.topk={self.topk} (>= 1) are out of range; fix them"
            )
        if context.get_retriever is None:
            raise AgentConfigError("search_agent needs a retriever; set retriever.url or retriever.corpus_path")
        self._info_open = self._ids(INFO_OPEN)
        self._info_close = self._ids(INFO_CLOSE)

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    async def run(self, sampling_params: dict, **row) -> AgentLoopOutput:
        prompt_ids = list(row["raw_prompt_ids"])
        response = ResponseBuilder(self.response_length)
        counts = {"assistant_turns": 0, "observations": 0, "valid_actions": 0, "searches": 0, "search_errors": 0}
        for turn in range(self.max_turns + 1):
            if response.room <= 0:
                break
            ids = response.add_model(
                await self.engine.generate(
                    prompt_ids + response.ids, sampling_params, self.turn_budget(response), stop=STOP
                )
            )
            counts["assistant_turns"] += 1
            action, content = parse_action(self.tokenizer.decode(ids, skip_special_tokens=True))
            counts["valid_actions"] += action is not None
            if action == "answer" or turn == self.max_turns or response.room <= 0:
                break  # answered, or the last turn (Search-R1 samples it without search)
            if action == "search":
                counts["searches"] += 1
                observation = await self._search(content, counts)
            else:
                observation = self._ids(INVALID_ACTION)
            if not response.add_observation(observation):
                break  # no room for the observation and another model turn
            counts["observations"] += 1
        metrics = {**counts, "tool_calls": counts["searches"]}
        return AgentLoopOutput(
            prompt_ids,
            response.ids,
            response.mask,
            num_turns=1 + counts["assistant_turns"] + counts["observations"],
            metrics=metrics,
            response_logprobs=response.log_probs,
        )

    async def _search(self, query: str, counts: dict) -> list[int]:
        """The ``<information>`` ids for ``query``: passages cut to ``max_obs_length`` tokens."""
        retriever = self.context.get_retriever()  # a bad retriever config stops the run here
        try:
            hits = await search_passages(retriever, [query], self.topk, self.timeout_s) if query else [[]]
            body = format_passages(hits[0]).strip() or "No results."
        except (RetrieverError, asyncio.TimeoutError) as exc:
            counts["search_errors"] += 1
            reason = str(exc) or f"no answer within {self.timeout_s:g} s"
            logger.warning("search_agent: retrieval failed (%s); the episode gets an error observation", reason)
            body = "Search failed: the search engine is not available right now."
        body_ids = self._ids(body)[: max(self.max_obs_length - len(self._info_open) - len(self._info_close), 1)]
        return self._info_open + body_ids + self._info_close
