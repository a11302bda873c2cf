"""``single_turn_agent``: one generation from the prompt, as the plain rollout does."""

from __future__ import annotations

from hybridrl.agents.base import AgentLoopBase, AgentLoopOutput, ResponseBuilder, register_agent_loop


@register_agent_loop("single_turn_agent")
class SingleTurnAgentLoop(AgentLoopBase):
    """The default loop: the response is one model turn (mask all ones)."""

    async def run(self, sampling_params: dict, **row) -> AgentLoopOutput:
        prompt_ids = list(row["raw_prompt_ids"])
        response = ResponseBuilder(self.response_length)
        response.add_model(await self.engine.generate(prompt_ids, sampling_params, self.turn_budget(response)))
        return AgentLoopOutput(
            prompt_ids,
            response.ids,
            response.mask,
            num_turns=2,
            metrics={"assistant_turns": 1},
            response_logprobs=response.log_probs,
        )
