"""The Rollout interface and its registry of engines (``actor_rollout_ref.rollout.name``).

An engine turns prompts into responses. Adding vLLM or SGLang means registering a class here;
the trainer and the workers do not change.
"""

from __future__ import annotations

import abc

import torch

from hybridrl.config.schema import OPTIONAL_ENGINES
from hybridrl.protocol import DataProto

ROLLOUT_REGISTRY: dict[str, type["BaseRollout"]] = {}


def register_rollout(name: str):
    def decorator(cls):
        ROLLOUT_REGISTRY[name] = cls
        return cls

    return decorator


def get_rollout_cls(name: str) -> type["BaseRollout"]:
    """Engine class for ``actor_rollout_ref.rollout.name``.

    A name in ``hybridrl.config.schema.OPTIONAL_ENGINES`` (vllm, sglang, sglang_async) with no
    engine registered under it falls back to the HF engine; the config check notes it once at
    start-up.

    Raises:
        ValueError: an unknown engine name.
    """
    if name in ROLLOUT_REGISTRY:
        return ROLLOUT_REGISTRY[name]
    if name in OPTIONAL_ENGINES:
        return ROLLOUT_REGISTRY["hf"]
    raise ValueError(
        f"actor_rollout_ref.rollout.name={name!r} is not a known rollout engine; "
        f"choose one of {sorted(set(ROLLOUT_REGISTRY) | set(OPTIONAL_ENGINES))}"
    )


class BaseRollout(abc.ABC):
    """Generates responses for a batch of left-padded prompts.

    ``generate_sequences`` takes a DataProto with ``input_ids``, ``attention_mask``,
    ``position_ids`` of shape ``(bs, prompt_length)`` and returns one with ``prompts``
    ``(bs, prompt_length)``, ``responses`` ``(bs, response_length)`` (right-padded with the pad
    token), ``input_ids`` / ``attention_mask`` / ``position_ids`` over prompt + response, and
    ``response_mask`` ``(bs, response_length)``: 1 on generated tokens up to and including the
    first EOS, 0 after. ``meta_info`` may override sampling: ``do_sample``, ``temperature``,
    ``top_p``, ``top_k``, ``response_length``.
    """

    @abc.abstractmethod
    def generate_sequences(self, prompts: DataProto) -> DataProto: ...

    def sync_weights(self, actor_module: torch.nn.Module) -> None:
        """Bring the engine's weights up to date with the actor after an update."""


def get_response_mask(responses: torch.Tensor, eos_token_ids: list[int]) -> torch.Tensor:
    """``(bs, response_length)`` int mask: 1 up to and including the first EOS token, 0 after."""
    is_eos = torch.isin(responses, torch.tensor(eos_token_ids, device=responses.device))
    eos_seen_before = torch.cumsum(is_eos, dim=1) - is_eos.long()
    return (eos_seen_before == 0).long()
