"""GSM8K tools: ``calc_gsm8k_reward`` (checks an answer, as verl's Gsm8kTool) and ``calculator``.

GSM8K: "Training Verifiers to Solve Math Word Problems", Cobbe et al., arXiv:2110.14168.
"""

from __future__ import annotations

import math

from hybridrl.agents.errors import AgentConfigError
from hybridrl.agents.tools.base import BaseTool, register_tool
from hybridrl.rewards.gsm8k import compute_score

__all__ = ["Gsm8kTool", "CalculatorTool"]

# A call that does not improve on the episode's best answer costs this much (verl's value):
# it discourages calling the checker again and again with the same answer.
NO_PROGRESS_PENALTY = -0.05


@register_tool("calc_gsm8k_reward")
class Gsm8kTool(BaseTool):
    """Checks the model's answer against the row's ground truth.

    ``create_kwargs``: ``ground_truth`` (the number, as in ``reward_model.ground_truth``).
    ``execute({"answer": "72"})`` answers ``"Current parsed answer='#### 72' reward=1.0"`` and
    gives a step reward of 0.0 when the answer beats the episode's best so far, else
    :data:`NO_PROGRESS_PENALTY`. ``calc_reward`` scores the last answer (1.0 right, 0.0 wrong).
    ``config.method``: the GSM8K extraction, ``flexible`` (default, verl's) or ``strict``.
    """

    DEFAULT_SCHEMA = {
        "type": "function",
        "function": {
            "name": "calc_gsm8k_reward",
            "description": "Check your answer to the GSM8K problem: returns reward 1.0 if it is correct, 0.0 if not.",
            "parameters": {
                "type": "object",
                "properties": {"answer": {"type": "string", "description": "the final answer, a number"}},
                "required": ["answer"],
            },
        },
    }

    def __init__(self, config: dict | None = None, tool_schema=None) -> None:
        super().__init__(config, tool_schema)
        if self.config.get("method", "flexible") not in ("flexible", "strict"):
            raise AgentConfigError(f"tool {self.name}: config.method={self.config['method']!r}; use flexible or strict")

    async def create(self, instance_id: str | None = None, ground_truth: str | None = None, **kwargs) -> str:
        instance_id = await super().create(instance_id, **kwargs)
        self._instances[instance_id].update(ground_truth=ground_truth, response="", best=0.0)
        return instance_id

    def _score(self, state: dict) -> float:
        if state["ground_truth"] is None:
            return 0.0
        return compute_score(
            state["response"],
            str(state["ground_truth"]),
            method=self.config.get("method", "flexible"),
            format_score=0.0,
            score=1.0,
        )

    async def execute(self, instance_id: str, parameters: dict, **kwargs) -> tuple[str, float, dict]:
        state = self._instances[instance_id]
        answer = str(parameters.get("answer", "")).strip()
        state["response"] = answer if answer.startswith("#### ") else f"#### {answer}"
        reward = self._score(state)
        step_reward = 0.0 if reward > state["best"] else NO_PROGRESS_PENALTY
        state["best"] = max(state["best"], reward)
        return f"Current parsed answer={state['response']!r} reward={reward}", step_reward, {}

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        return self._score(self._instances[instance_id])


# The largest integer the calculator computes, in bits (~1,200 decimal digits): operands are
# checked before each multiplication or power, so no expression costs more than microseconds
# (10**4000000 * 10**4000000, within simpleeval's own power limit, took 24 s of CPU).
MAX_INT_BITS = 4096


class _TooLarge(ArithmeticError):
    pass


def _bits(value) -> int:
    return abs(int(value)).bit_length() if isinstance(value, int) else 0


def _bounded_mult(a, b):
    if _bits(a) + _bits(b) > MAX_INT_BITS:
        raise _TooLarge(f"the product would exceed {MAX_INT_BITS} bits")
    return a * b


def _bounded_pow(a, b):
    if isinstance(b, int) and b > 0 and (_bits(a) - 1) * b > MAX_INT_BITS:  # |a|^b >= 2^((bits-1)*b)
        raise _TooLarge(f"the power would exceed {MAX_INT_BITS} bits")
    if isinstance(b, (int, float)) and abs(b) > MAX_INT_BITS:
        raise _TooLarge(f"exponent {b} is larger than {MAX_INT_BITS}")
    return a**b


def _bounded_operators() -> dict:
    import ast

    from simpleeval import DEFAULT_OPERATORS

    arithmetic = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.USub, ast.UAdd)
    operators = {op: fn for op, fn in DEFAULT_OPERATORS.items() if op in arithmetic}
    return {**operators, ast.Mult: _bounded_mult, ast.Pow: _bounded_pow}


@register_tool("calculator")
class CalculatorTool(BaseTool):
    """Evaluates one arithmetic expression (``+ - * / // % **``, parentheses, numbers) with
    ``simpleeval`` (no names, no functions, no shifts or comparisons); multiplications and
    powers whose integer result would exceed :data:`MAX_INT_BITS` are refused before they are
    computed. The response is the number or an error message."""

    DEFAULT_SCHEMA = {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression, e.g. '(48 + 12) / 5'.",
            "parameters": {
                "type": "object",
                "properties": {
                    "expression": {"type": "string", "description": "numbers, + - * / // % ** and parentheses"}
                },
                "required": ["expression"],
            },
        },
    }

    async def execute(self, instance_id: str, parameters: dict, **kwargs) -> tuple[str, float, dict]:
        from simpleeval import InvalidExpression, SimpleEval

        expression = str(parameters.get("expression", ""))
        try:
            value = SimpleEval(operators=_bounded_operators(), functions={}, names={}).eval(expression)
        except (InvalidExpression, ArithmeticError, SyntaxError, TypeError, ValueError, KeyError) as exc:
            return f"Error: cannot evaluate {expression!r}: {type(exc).__name__}: {exc}", 0.0, {"error": 1}
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or (isinstance(value, float) and not math.isfinite(value))
        ):
            return f"Error: {expression!r} is not a finite number", 0.0, {"error": 1}
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        return str(value), 0.0, {}
