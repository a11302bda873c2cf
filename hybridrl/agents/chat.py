"""Chat-template helpers of the multi-turn loops: the prompt with its tools, and the ids of
new messages (tool responses, user feedback) to append after a model turn.

The ids of a new message are taken as the *difference* the chat template makes when the
message follows a fixed dummy conversation (the method verl's agent loop uses), so earlier
turns are never re-encoded and the model's own ids stay exactly as sampled.
"""

from __future__ import annotations

import json

from hybridrl.agents.errors import AgentConfigError

__all__ = ["render_prompt_ids", "ChatTurnEncoder", "tool_instructions"]

_MARK = "\u2063AGENT-TURN\u2063"  # text no real turn holds
_DUMMY = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, {"role": "assistant", "content": _MARK}]


def tool_instructions(tool_schemas: list[dict]) -> str:
    """The Hermes tool-use instructions (as the Qwen2.5 template writes them) for templates
    that do not render ``tools`` themselves."""
    signatures = "\n".join(json.dumps(schema, ensure_ascii=False) for schema in tool_schemas)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{signatures}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def _template(tokenizer, messages, **kwargs) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)


def render_prompt_ids(tokenizer, messages: list[dict], tool_schemas: list[dict] | None = None) -> list[int]:
    """Prompt ids of ``messages`` with the generation prompt and the tools' schemas.

    A template that renders ``tools`` gets them as ``tools=``; for one that does not (e.g.
    SmolLM2's), :func:`tool_instructions` is appended to the system message (or becomes one).
    """
    messages = [dict(m) for m in messages]
    kwargs = {}
    if tool_schemas:
        if "tools" in (getattr(tokenizer, "chat_template", None) or ""):
            kwargs["tools"] = tool_schemas
        elif messages and messages[0].get("role") == "system":
            messages[0]["content"] = f"{messages[0]['content']}\n\n{tool_instructions(tool_schemas)}"
        else:
            messages.insert(0, {"role": "system", "content": tool_instructions(tool_schemas)})
    text = _template(tokenizer, messages, add_generation_prompt=True, **kwargs)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


class ChatTurnEncoder:
    """Ids that close the model's turn and add new messages plus the next generation prompt.

    For ChatML (SmolLM2, Qwen) after a turn that ended with ``<|im_end|>``, a tool response is
    ``\\n<|im_start|>tool\\n{content}<|im_end|>\\n<|im_start|>assistant\\n``; after a turn that
    was cut before its EOS the ``<|im_end|>`` is added too (as context, mask 0).

    Raises:
        AgentConfigError: the chat template cannot be used this way (it renders an earlier
            assistant turn differently once a message follows it).
    """

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._prefix = _template(tokenizer, _DUMMY)
        at = self._prefix.rfind(_MARK)
        if at < 0:
            raise AgentConfigError(
                "the chat template drops assistant messages; multi-turn agent loops need a "
                "template that renders them (set actor_rollout_ref.model.custom_chat_template)"
            )
        self._tail = self._prefix[at + len(_MARK) :]  # what closes an assistant turn, e.g. "<|im_end|>\n"
        eos = tokenizer.eos_token
        self._tail_after_eos = self._tail.split(eos, 1)[1] if eos and eos in self._tail else self._tail
        self.eos_token_id = tokenizer.eos_token_id

    def encode(self, messages: list[dict], model_turn_ids: list[int]) -> list[int]:
        """Ids of ``messages`` (role + content dicts) after a model turn with ``model_turn_ids``.

        Raises:
            AgentConfigError: see the class.
        """
        full = _template(self.tokenizer, _DUMMY + list(messages), add_generation_prompt=True)
        if not full.startswith(self._prefix):
            raise AgentConfigError(
                "the chat template renders earlier turns differently once new messages follow, so new "
                "turns cannot be appended token-exactly; set actor_rollout_ref.model.custom_chat_template "
                "to a template without that behaviour"
            )
        ended = bool(model_turn_ids) and model_turn_ids[-1] == self.eos_token_id
        text = (self._tail_after_eos if ended else self._tail) + full[len(self._prefix) :]
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]
