"""The Rollout interface and its registry of engines (``actor_rollout_ref.rollout.name``).

An engine turns prompts into responses. Adding vLLM or SGLang means registering a class here;
the trainer and the workers do not change.
"""

from __future__ import annotations

import abc
import itertools
from typing import Iterator

import torch

from hybridrl.errors import UserError
from hybridrl.models.lora import is_lora_model, merged_lora_weights
from hybridrl.models.materialize import iter_full_weights
from hybridrl.protocol import DataProto
from hybridrl.registry import Registry, RegistryError

# rollout.name -> display name: engines verl users name that run on the HF engine when no
# engine of that name is registered. Read by get_rollout_cls and by the start-up note.
OPTIONAL_ENGINES = {"sglang": "SGLang", "sglang_async": "SGLang"}


class RolloutEngineError(UserError, RuntimeError):
    """An engine cannot run with this config or install (missing package, unsupported model or
    setting, a prompt longer than the engine allows): printed as one line."""


class RolloutNameError(RegistryError):
    """``actor_rollout_ref.rollout.name`` names no engine, or a second class takes a name (a ValueError)."""


_HINT = (
    f"also accepted, generating with the HF engine: {', '.join(sorted(OPTIONAL_ENGINES))}; "
    "register your own with @register_rollout"
)
ROLLOUTS = Registry("rollout engine", "actor_rollout_ref.rollout.name", error=RolloutNameError, hint=_HINT)
ASYNC_ROLLOUTS = Registry(
    "async rollout engine",
    "actor_rollout_ref.rollout.name",
    error=RolloutNameError,
    hint="register your own with @register_rollout(name, mode='async')",
)
ROLLOUT_REGISTRY: dict[str, type[BaseRollout]] = ROLLOUTS.table  # live dicts, read by the config check
ASYNC_ROLLOUT_REGISTRY: dict[str, type[BaseRollout]] = ASYNC_ROLLOUTS.table


class SampledIds(list):
    """Token ids one engine call sampled for one sequence (a ``list[int]``), with ``log_probs``:
    their fp32 log-probs under the sampling distribution, one per id, or None when the engine
    did not record them. Slicing keeps them aligned: ``ids.head(k)``."""

    def __init__(self, ids=(), log_probs=None) -> None:
        super().__init__(int(t) for t in ids)
        self.log_probs = None if log_probs is None else [float(x) for x in log_probs][: len(self)]
        if self.log_probs is not None and len(self.log_probs) != len(self):
            raise ValueError(f"SampledIds: {len(self)} ids but {len(self.log_probs)} log-probs")

    def head(self, k: int) -> SampledIds:
        """The first ``k`` ids with their log-probs."""
        return SampledIds(self[:k], None if self.log_probs is None else self.log_probs[:k])


def register_rollout(name: str, mode: str = "sync"):
    """Class decorator: the engine of ``rollout.name=name`` in ``rollout.mode=mode`` (sync | async).

    Raises:
        RolloutNameError: another class is registered under ``name`` in that mode.
    """
    return (ASYNC_ROLLOUTS if mode == "async" else ROLLOUTS).register(name)


def get_rollout_cls(name: str, mode: str = "sync", in_process_group: bool = False) -> type[BaseRollout]:
    """Engine class for ``actor_rollout_ref.rollout.name`` and ``.mode``.

    A name in :data:`OPTIONAL_ENGINES` (sglang, sglang_async) with no
    engine registered under it falls back to the HF engine; the config check notes it once at
    start-up. ``in_process_group``: the worker is one of several in a process group (or its
    engine spans several): a sync engine that cannot share a process with one
    (``runs_in_a_process_group = False``, the colocated vLLM engine, which would start a process
    group of its own) is replaced by the async engine of the same name, whose engine runs in a
    process of its own and serves ``generate_sequences`` the same way.

    Raises:
        RolloutEngineError: ``mode=async`` for an engine that has no async server mode.
        RolloutNameError (a ValueError): an unknown engine name.
    """
    if mode == "async":
        if name in ASYNC_ROLLOUTS:
            return ASYNC_ROLLOUTS.get(name)
        raise RolloutEngineError(
            f"actor_rollout_ref.rollout.mode=async: the {name!r} engine has no async server mode "
            f"(engines with one: {', '.join(ASYNC_ROLLOUTS.names())}); set rollout.name=vllm or rollout.mode=sync"
        )
    if name in OPTIONAL_ENGINES and name not in ROLLOUTS:
        return ROLLOUTS.get("hf")
    engine = ROLLOUTS.get(name)
    if in_process_group and not engine.runs_in_a_process_group and name in ASYNC_ROLLOUTS:
        return ASYNC_ROLLOUTS.get(name)
    return engine


class BaseRollout(abc.ABC):
    """An engine that turns a batch of prompts into responses (``actor_rollout_ref.rollout.name``).

    Register a subclass with ``@register_rollout("<name>")``; the worker builds it as
    ``cls(actor_module, rollout_config, tokenizer, generation_config)`` (the actor's module, the
    ``actor_rollout_ref.rollout`` section, the policy's tokenizer, the model's generation config
    or None) on every rank of the actor's worker group. The trainer and the workers never look
    inside an engine: this class is the whole contract (details in docs/rollout.md).

    ``generate_sequences(prompts)``:
        input ``prompts.batch``: ``input_ids``, ``attention_mask``, ``position_ids``, int64
        ``(bs, prompt_length)``, left-padded with the pad token; each prompt already repeated
        ``rollout.n`` times, interleaved (rows ``i*n .. i*n+n-1`` share a prompt, so an engine
        may share their prefill). ``prompts.meta_info`` may override the config's sampling for
        this call: ``do_sample``, ``temperature`` (0: greedy), ``top_p``, ``top_k`` (<= 0: off),
        ``response_length``; ``validate`` marks a validation batch. ``non_tensor_batch`` rows
        (``agent_name``, ...) are for the agent loops and may be ignored.

        output ``batch`` (same rows, same order), every tensor int64 on any device:
        ``prompts`` ``(bs, prompt_length)`` (the input ids), ``responses`` ``(bs, response_length)``
        right-padded with the pad token, ``response_mask`` ``(bs, response_length)``: 1 on
        generated tokens up to and including the first EOS (all ones with ``rollout.ignore_eos``),
        0 after; ``input_ids`` = prompts + responses, ``attention_mask`` = the prompt mask +
        ``response_mask``, ``position_ids`` = ``clamp(cumsum(attention_mask) - 1, 0)``, each
        ``(bs, prompt_length + response_length)``. ``response_length`` is exactly the configured
        (or meta_info) length, however early every row stopped. ``meta_info`` is passed through.
        Sampling must be the plain ``softmax(logits / temperature)`` restricted by ``top_k`` /
        ``top_p`` only (no repetition penalty or other model defaults): the actor's log-probs
        assume it.

    ``sync_weights(actor_module)``: called after every actor update and after a checkpoint is
        loaded, on every rank (a collective when the actor is FSDP-sharded). Take the weights
        from :func:`policy_weights`: one tensor at a time, gathered from the shards, with the
        adapters merged into the base weights of a LoRA (peft) actor; never a whole state dict.
        An engine that generates with the actor module itself has nothing to do.

    Optional, for multi-turn agent loops (``hybridrl.agents``): ``generate_token_ids(prompt_ids,
    max_new_tokens, sampling_kwargs, stop_strings) -> list[SampledIds]`` and ``pad_token_id``, as
    :class:`HFRollout`. An engine with its own scheduler (``rollout.mode=async``) offers instead
    ``async agenerate(prompt_ids, sampling_kwargs, max_new_tokens, stop_strings) -> SampledIds``,
    one request per sequence and turn.
    """

    runs_in_a_process_group = True  # False: the worker of a process group runs the async engine instead

    @abc.abstractmethod
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Responses for ``prompts``; the layout above."""

    def sync_weights(self, actor_module: torch.nn.Module) -> None:  # noqa: B027 - a no-op unless overridden
        """Bring the engine's weights up to date with the actor (see the class docstring)."""


def policy_weights(
    actor_module: torch.nn.Module, everything: bool = False, dtype: torch.dtype | None = None, gather: bool = True
) -> Iterator[tuple[str, torch.Tensor]]:
    """What an engine's copy of the policy needs from the actor, as ``(name, whole tensor)``
    pairs named as in the plain HF model, one tensor gathered at a time (the peak is one tensor,
    not a state dict; a collective on a sharded actor: every rank consumes the whole iterator).

    Every weight, or for a LoRA actor (``everything=False``) only its adapted layers with the
    adapters merged (the rest never changes); ``everything=True`` fills a copy from scratch.
    ``dtype``: the engine's; shards are cast before they are gathered. ``gather=False``: shards
    come as DTensors, for an in-process copy to gather in place
    (:func:`hybridrl.models.materialize.copy_weights`).
    """
    if not is_lora_model(actor_module):
        return iter_full_weights(actor_module, dtype=dtype, gather=gather)
    merged = merged_lora_weights(actor_module)
    return (
        itertools.chain(iter_full_weights(actor_module, dtype=dtype, gather=gather), merged) if everything else merged
    )


def resolve_sampling(meta_info: dict, config) -> dict:
    """The sampling of one call: ``meta_info``'s overrides over the rollout config.

    Returns ``{"do_sample": False}`` for greedy decoding (``do_sample`` false or temperature 0),
    else ``do_sample``, ``temperature`` (> 0), ``top_p``, ``top_k`` (0: off)."""
    do_sample = meta_info.get("do_sample", config.do_sample)
    temperature = meta_info.get("temperature", config.temperature)
    if not do_sample or temperature == 0:
        return {"do_sample": False}
    top_k = meta_info.get("top_k", config.top_k)
    return {
        "do_sample": True,
        "temperature": float(temperature),
        "top_p": float(meta_info.get("top_p", config.top_p)),
        "top_k": int(top_k) if top_k and top_k > 0 else 0,
    }


def rollout_output(
    prompts: DataProto,
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_log_probs: torch.Tensor | None,
    pad_token_id: int,
) -> DataProto:
    """The :class:`BaseRollout` output of an engine's ``(bs, R)`` responses and mask: responses
    padded with ``pad_token_id`` where the mask is 0, the full ids / masks / positions, and
    ``rollout_log_probs`` (zeroed outside the mask) unless it is None."""
    input_ids = prompts.batch["input_ids"].cpu()
    attention_mask = prompts.batch["attention_mask"].cpu()
    responses = torch.where(response_mask.bool(), responses, torch.full_like(responses, pad_token_id))
    full_mask = torch.cat([attention_mask, response_mask.to(attention_mask.dtype)], dim=1)
    batch = {
        "prompts": input_ids,
        "responses": responses,
        "input_ids": torch.cat([input_ids, responses], dim=1),
        "attention_mask": full_mask,
        "position_ids": (torch.cumsum(full_mask, dim=1) - 1).clamp(min=0),
        "response_mask": response_mask,
    }
    if rollout_log_probs is not None:
        batch["rollout_log_probs"] = rollout_log_probs * response_mask
    return DataProto.from_dict(tensors=batch, meta_info=dict(prompts.meta_info))


def get_response_mask(responses: torch.Tensor, eos_token_ids: list[int]) -> torch.Tensor:
    """``(bs, response_length)`` int mask: 1 up to and including the first EOS token, 0 after."""
    is_eos = torch.isin(responses, torch.tensor(eos_token_ids, device=responses.device))
    eos_seen_before = torch.cumsum(is_eos, dim=1) - is_eos.long()
    return (eos_seen_before == 0).long()


def eos_token_ids(tokenizer, generation_config) -> list[int]:
    """The token ids that end a response: the generation config's ``eos_token_id`` (an int or a
    list) first, then the tokenizer's ``eos_token_id``, without repeats. ``generation_config``
    may be None. Every engine stops on these and :func:`get_response_mask` masks after them.

    Raises:
        ValueError: neither names an end-of-sequence token.
    """
    ids: list[int] = []
    for source in (getattr(generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if source is None:
            continue
        ids.extend(source if isinstance(source, (list, tuple)) else [source])
    if not ids:
        raise ValueError("the tokenizer has no eos_token; set one in the model folder's tokenizer_config.json")
    return list(dict.fromkeys(int(i) for i in ids))
