"""AgentLoopManager: runs the agent loop of every row of a batch concurrently and lays the
trajectories out as the rollout engine does, so nothing downstream knows the difference.

The worker calls it instead of ``HFRollout.generate_sequences`` when
``actor_rollout_ref.rollout.multi_turn.enable`` is set or the data has an ``agent_name`` column.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging

import torch

from hybridrl.agents.base import AgentContext, AgentLoopOutput, get_agent_loop_cls, register_agent_loops_from_file
from hybridrl.agents.engine import AsyncBatchEngine, RequestEngine
from hybridrl.agents.interactions.base import load_interactions
from hybridrl.agents.retrieval import make_retriever
from hybridrl.protocol import DataProto

logger = logging.getLogger(__name__)

__all__ = ["AgentLoopManager", "pad_trajectories"]

_SAMPLING_KEYS = ("do_sample", "temperature", "top_p", "top_k")


def pad_trajectories(
    outputs: list[AgentLoopOutput], pad_token_id: int, response_length: int
) -> dict[str, torch.Tensor]:
    """The batch tensors of ``HFRollout.generate_sequences`` for agent trajectories.

    Args:
        outputs: one trajectory per row (``len(response_ids) <= response_length``).
        pad_token_id: the filler id.
        response_length: R, the width of the response tensors.

    Returns:
        ``prompts`` (bs, P) left-padded, P the longest prompt; ``responses`` (bs, R)
        right-padded; ``response_mask`` (bs, R): 1 on model tokens, 0 on observation tokens
        and padding; ``attention_mask`` (bs, P+R): 1 on every prompt and response token
        (observations are context); ``input_ids`` (bs, P+R); ``position_ids`` (bs, P+R) =
        ``clamp(cumsum(attention_mask) - 1, 0)``. All int64. Plus ``rollout_log_probs``
        (bs, R) fp32, 0 on observations and padding, when every trajectory has
        ``response_logprobs``.
    """
    bs = len(outputs)
    width = max(len(o.prompt_ids) for o in outputs)
    prompts = torch.full((bs, width), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((bs, width), dtype=torch.long)
    responses = torch.full((bs, response_length), pad_token_id, dtype=torch.long)
    response_attention = torch.zeros((bs, response_length), dtype=torch.long)
    response_mask = torch.zeros((bs, response_length), dtype=torch.long)
    for i, out in enumerate(outputs):
        n, m = len(out.prompt_ids), len(out.response_ids)
        if n:
            prompts[i, width - n :] = torch.tensor(out.prompt_ids)
            prompt_mask[i, width - n :] = 1
        if m:
            responses[i, :m] = torch.tensor(out.response_ids)
            response_attention[i, :m] = 1
            response_mask[i, :m] = torch.tensor(out.response_mask)
    attention_mask = torch.cat([prompt_mask, response_attention], dim=1)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": (torch.cumsum(attention_mask, dim=1) - 1).clamp(min=0),
    }
    if all(o.response_logprobs is not None for o in outputs):
        log_probs = torch.zeros((bs, response_length), dtype=torch.float32)
        for i, out in enumerate(outputs):
            if out.response_ids:
                log_probs[i, : len(out.response_ids)] = torch.tensor(out.response_logprobs, dtype=torch.float32)
        tensors["rollout_log_probs"] = log_probs * response_mask
    return tensors


def _run_sync(coro):
    """``asyncio.run`` that also works when the caller already runs an event loop (a thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


class AgentLoopManager:
    """Runs the agent loops of a batch on the rollout engine.

    Args:
        rollout: the worker's rollout: ``pad_token_id`` and ``generate_token_ids`` (batched by
            :class:`AsyncBatchEngine`) or ``agenerate`` (``rollout.mode=async``: one request per turn).
        tokenizer: the policy's tokenizer.
        config: the typed ``actor_rollout_ref.rollout`` section: ``response_length``, ``multi_turn``
            (loop knobs, ``tool_config_path``, ``interaction_config_path``, ``search``,
            ``retriever``), ``agent.default_agent_loop``.

    Raises:
        AgentConfigError: a bad tool or interaction config file.
    """

    def __init__(self, rollout, tokenizer, config) -> None:
        self.rollout = rollout
        self.tokenizer = tokenizer
        self.config = config
        self.multi_turn = config.multi_turn
        self.default_agent = config.agent.default_agent_loop
        if config.agent.agent_loop_config_path:  # verl's file of loops (this process's registry)
            register_agent_loops_from_file(config.agent.agent_loop_config_path)
        self.tools, self.interactions = {}, {}
        if self.multi_turn.tool_config_path:  # imported only when used: pydantic, jsonschema (the agents extra)
            from hybridrl.agents.tools.base import load_tools

            self.tools = load_tools(self.multi_turn.tool_config_path)
        if self.multi_turn.interaction_config_path:
            self.interactions = load_interactions(self.multi_turn.interaction_config_path)
        for tool in self.tools.values():
            if hasattr(tool, "set_default_retriever"):
                tool.set_default_retriever(self.get_retriever)
        self._retriever = None

    def get_retriever(self):
        """The retriever of ``multi_turn.retriever`` (the top-level ``retriever`` section), built once.

        Raises:
            ConfigError / DataError: no url, corpus or index configured, or an unreadable one.
        """
        if self._retriever is None:
            cfg = self.multi_turn.retriever
            self._retriever = make_retriever(
                url=cfg.url, corpus_path=cfg.corpus_path, index_dir=cfg.index_dir, timeout_s=float(cfg.timeout)
            )
        return self._retriever

    def _rows(self, prompts: DataProto) -> tuple[list[str], list[dict]]:
        """(agent name, loop kwargs) per row; ``raw_prompt_ids`` from the tensors when absent."""
        columns = prompts.non_tensor_batch
        names, rows = [], []
        for i in range(len(prompts)):
            row = {key: values[i] for key, values in columns.items()}
            if row.get("raw_prompt_ids") is None:
                mask = prompts.batch["attention_mask"][i].bool().cpu()
                row["raw_prompt_ids"] = prompts.batch["input_ids"][i].cpu()[mask].tolist()
            row["raw_prompt_ids"] = [int(t) for t in row["raw_prompt_ids"]]
            name = row.get("agent_name")
            names.append(name if isinstance(name, str) and name else self.default_agent)
            rows.append(row)
        return names, rows

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Roll out every row with its agent loop.

        Args:
            prompts: ``input_ids`` / ``attention_mask`` (bs, P) and the rows' non-tensor fields
                (``raw_prompt_ids``, ``agent_name``, ``raw_prompt``, ``tools_kwargs``, ...);
                ``meta_info`` may override sampling and ``response_length``.

        Returns:
            The tensors of :func:`pad_trajectories` (``rollout_log_probs`` unless
            ``rollout.calculate_log_probs`` is false) and non-tensors ``__num_turns__`` (int),
            ``__agent_name__`` (str), ``__agent_metrics__`` (dict of per-row counters) and
            ``reward_scores`` (dict name -> float); ``meta_info`` copied.

        Raises:
            AgentConfigError: an unknown agent name, a missing retriever, a row asking for an
                interaction that is not configured.
        """
        names, rows = self._rows(prompts)
        sampling = {k: prompts.meta_info[k] for k in _SAMPLING_KEYS if k in prompts.meta_info}
        response_length = int(prompts.meta_info.get("response_length", self.config.response_length))
        outputs = _run_sync(self._run_all(names, rows, sampling, response_length))
        non_tensors = {
            "__num_turns__": [int(o.num_turns) for o in outputs],
            "__agent_name__": names,
            "__agent_metrics__": [dict(o.metrics) for o in outputs],
            "reward_scores": [dict(o.reward_scores) for o in outputs],
        }
        tensors = pad_trajectories(outputs, self.rollout.pad_token_id, response_length)
        if not self.config.calculate_log_probs:
            tensors.pop("rollout_log_probs", None)
        return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=dict(prompts.meta_info))

    async def _run_all(self, names, rows, sampling, response_length) -> list[AgentLoopOutput]:
        # An engine with its own scheduler takes one request per turn; else turns are batched here.
        engine = RequestEngine(self.rollout) if hasattr(self.rollout, "agenerate") else AsyncBatchEngine(self.rollout)
        context = AgentContext(
            engine=engine,
            tokenizer=self.tokenizer,
            response_length=response_length,
            multi_turn=self.multi_turn,
            tools=self.tools,
            interactions=self.interactions,
            get_retriever=self.get_retriever,
        )
        try:
            return await asyncio.gather(*(self._run_one(context, n, sampling, r) for n, r in zip(names, rows)))
        finally:
            engine.close()

    @staticmethod
    async def _run_one(context: AgentContext, name: str, sampling: dict, row: dict) -> AgentLoopOutput:
        loop = get_agent_loop_cls(name)(context)
        async with context.engine.session():
            out = await loop.run(sampling, **row)
        if len(out.response_ids) != len(out.response_mask) or len(out.response_ids) > context.response_length:
            raise RuntimeError(
                f"agent loop {name!r} returned {len(out.response_ids)} response ids with "
                f"{len(out.response_mask)} mask entries (limit {context.response_length}); "
                "a loop must keep them equal and within response_length"
            )
        return out
