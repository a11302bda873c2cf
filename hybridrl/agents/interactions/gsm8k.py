"""A GSM8K teacher: says whether the model's last answer is right and, if not, asks it to retry.

GSM8K: "Training Verifiers to Solve Math Word Problems", Cobbe et al., arXiv:2110.14168.
"""

from __future__ import annotations

from hybridrl.agents.errors import AgentConfigError
from hybridrl.agents.interactions.base import BaseInteraction, register_interaction
from hybridrl.rewards.gsm8k import compute_score

__all__ = ["Gsm8kInteraction"]

CORRECT = "Your answer is correct!"
INCORRECT = 'Your answer is incorrect. Check your reasoning and try again; write the final answer after "####".'


@register_interaction("gsm8k")
class Gsm8kInteraction(BaseInteraction):
    """``interaction_kwargs``: ``ground_truth`` (the number). Each answer of the model is scored
    with the GSM8K rule (``config.method``: ``strict``, the default, needs ``#### <number>``;
    ``flexible`` takes the last number); a correct one ends the episode.

    Raises:
        AgentConfigError: an unknown ``config.method``.
    """

    def __init__(self, config: dict | None = None) -> None:
        super().__init__(config)
        self.method = self.config.get("method", "strict")
        if self.method not in ("strict", "flexible"):
            raise AgentConfigError(f"interaction {self.name}: config.method={self.method!r}; use strict or flexible")

    async def start_interaction(self, instance_id: str | None = None, ground_truth: str | None = None, **kwargs) -> str:
        instance_id = await super().start_interaction(instance_id, **kwargs)
        self._instances[instance_id].update(ground_truth=ground_truth, response="")
        return instance_id

    async def generate_response(
        self, instance_id: str, messages: list[dict], **kwargs
    ) -> tuple[bool, str, float, dict]:
        state = self._instances[instance_id]
        state["response"] = next(
            (m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), ""
        )
        score = await self.calculate_score(instance_id)
        if score == 1.0:
            return True, CORRECT, score, {}
        return False, INCORRECT, score, {}

    async def calculate_score(self, instance_id: str, **kwargs) -> float:
        state = self._instances[instance_id]
        if state.get("ground_truth") is None:
            return 0.0
        return compute_score(
            state["response"], str(state["ground_truth"]), method=self.method, format_score=0.0, score=1.0
        )
