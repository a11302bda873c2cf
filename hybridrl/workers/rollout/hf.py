"""Rollout with Hugging Face ``generate``: works on every device transformers supports."""

from __future__ import annotations

import torch

from hybridrl.models import to_torch_dtype
from hybridrl.models.attention import ATTENTION_NAME, use_hybridrl_attention
from hybridrl.models.loader import empty_copy
from hybridrl.models.lora import is_lora_model
from hybridrl.models.materialize import copy_weights
from hybridrl.protocol import DataProto
from hybridrl.workers.rollout.base import (
    BaseRollout,
    SampledIds,
    eos_token_ids,
    get_response_mask,
    policy_weights,
    register_rollout,
    resolve_sampling,
    rollout_output,
)
from hybridrl.workers.rollout.decoding import InverseCDFSampler, SampledLogProbRecorder
from hybridrl.workers.sharding import is_sharded


@register_rollout("hf")
class HFRollout(BaseRollout):
    """Samples with ``model.generate`` on a copy of the actor in ``rollout.dtype``.

    With ``rollout.dtype`` equal to the dtype of a plain (unsharded, non-LoRA) actor the actor
    module itself is used (no copy, nothing to sync). Otherwise the engine keeps a whole copy of
    the base model in that dtype (bf16 decoding is several times faster on AMX CPUs and on
    GPUs; generation is not lock-step across ranks, so it cannot run on a sharded module): built
    empty and filled from the actor one tensor at a time, as ``sync_weights`` refreshes it after
    every update.
    Generation stops as soon as every sequence has produced an EOS token
    (``rollout.ignore_eos=True``: always ``response_length`` tokens). With
    ``rollout.fast_decoding`` (default) the module decodes with :mod:`hybridrl.models.attention`'s
    one-token attention and :mod:`.decoding`'s inverse-CDF sampler (the same distribution, ~1.5x faster on CPU).
    """

    def __init__(self, actor_module: torch.nn.Module, config, tokenizer, generation_config=None) -> None:
        self.config = config
        self.tokenizer = tokenizer
        dtype = to_torch_dtype(config.dtype)
        plain = not is_sharded(actor_module) and not is_lora_model(actor_module)
        if plain and dtype == next(actor_module.parameters()).dtype:
            self.module = actor_module
        else:
            base = actor_module.get_base_model() if is_lora_model(actor_module) else actor_module
            self.module = empty_copy(base, dtype, next(actor_module.parameters()).device)
            copy_weights(self.module, policy_weights(actor_module, everything=True, dtype=dtype, gather=False))
        self.fast_decoding = bool(config.fast_decoding)
        if self.fast_decoding:
            use_hybridrl_attention(self.module)
        elif self.module is not actor_module and self.module.config._attn_implementation == ATTENTION_NAME:
            self.module.set_attn_implementation("sdpa")  # a copy of an actor that uses it
        self.eos_token_ids = eos_token_ids(tokenizer, generation_config)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_token_ids[0]
        # transformers fills every sampling option we leave unset from model.generation_config
        # (e.g. a repetition_penalty); the log-probs of the update know nothing of those, so
        # the rollout samples from the plain softmax only.
        from transformers import GenerationConfig

        # The stop tokens are passed on every call (none with rollout.ignore_eos).
        self.module.generation_config = GenerationConfig(pad_token_id=self.pad_token_id)

    def sync_weights(self, actor_module: torch.nn.Module) -> None:
        """Copies the actor's weights into the rollout's module one tensor at a time
        (:func:`~hybridrl.workers.rollout.base.policy_weights`: gathered from the shards when the
        actor is FSDP-sharded, so every rank must call this; a LoRA actor sends only its adapted
        layers, with the adapter folded into the base weights).

        Raises:
            KeyError: the actor names a weight the rollout module lacks.
        """
        if self.module is not actor_module:
            dtype = next(self.module.parameters()).dtype
            copy_weights(self.module, policy_weights(actor_module, dtype=dtype, gather=False))

    def _generation_config(self, sampling: dict, **fields) -> tuple:
        """``(GenerationConfig, processor)`` for one ``generate`` call with ``sampling``
        (:func:`~hybridrl.workers.rollout.base.resolve_sampling`). The processor records the
        generated tokens' log-probs: with fast decoding and sampling it is
        :class:`InverseCDFSampler` itself (under greedy
        selection), else a :class:`SampledLogProbRecorder` beside transformers' own sampling."""
        from transformers import GenerationConfig

        if not sampling["do_sample"]:
            return GenerationConfig(**fields, do_sample=False), SampledLogProbRecorder()
        knobs = (sampling["temperature"], sampling["top_k"], sampling["top_p"])
        if self.fast_decoding:
            return GenerationConfig(**fields, do_sample=False), InverseCDFSampler(*knobs)
        return GenerationConfig(**fields, **sampling), SampledLogProbRecorder(*knobs)

    @torch.no_grad()
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Generates in chunks of ``rollout.micro_batch_size`` prompts (bounds KV-cache memory)."""
        self.module.eval()  # the module may be the actor itself, left in train mode by an update
        response_length = int(prompts.meta_info.get("response_length", self.config.response_length))
        stop_ids = [] if self.config.ignore_eos else self.eos_token_ids
        sampling = resolve_sampling(prompts.meta_info, self.config)
        fields = dict(
            max_new_tokens=response_length,
            eos_token_id=stop_ids or None,
            pad_token_id=self.pad_token_id,
            use_cache=True,
        )
        chunk = self.config.micro_batch_size or len(prompts)
        parts = [
            self._generate(part.batch["input_ids"], part.batch["attention_mask"], sampling, fields, response_length)
            for part in prompts.split(chunk)
        ]
        responses = torch.cat([r for r, _ in parts])
        response_mask = get_response_mask(responses, stop_ids) if stop_ids else torch.ones_like(responses)
        log_probs = torch.cat([lp for _, lp in parts]) if self.config.calculate_log_probs else None
        return rollout_output(prompts, responses, response_mask, log_probs, self.pad_token_id)

    @torch.no_grad()
    def generate_token_ids(
        self,
        prompt_ids: list[list[int]],
        max_new_tokens: int,
        sampling_kwargs: dict | None = None,
        stop_strings: list[str] | None = None,
    ) -> list[SampledIds]:
        """Token-in, token-out generation for the agent loops (``hybridrl.agents.engine``).

        Args:
            prompt_ids: one unpadded list of token ids per sequence (left-padded here).
            max_new_tokens: the most tokens to generate per sequence, >= 1.
            sampling_kwargs: ``do_sample`` / ``temperature`` / ``top_p`` / ``top_k`` overrides of
                the rollout config, as in ``meta_info``.
            stop_strings: a sequence also ends once its text contains one of these.

        Returns:
            The new ids of each sequence: up to and including its first EOS token or the token
            that completes a stop string, whichever comes first; never padding. Their
            ``log_probs`` are under the sampling distribution.
        """
        self.module.eval()
        sampling = resolve_sampling(sampling_kwargs or {}, self.config)
        fields = dict(
            max_new_tokens=int(max_new_tokens),
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            use_cache=True,
            stop_strings=list(stop_strings) if stop_strings else None,
        )
        width = max(len(ids) for ids in prompt_ids)
        input_ids = torch.tensor([[self.pad_token_id] * (width - len(ids)) + list(ids) for ids in prompt_ids])
        attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompt_ids])
        extra = {"tokenizer": self.tokenizer} if stop_strings else {}
        chunk = self.config.micro_batch_size or len(prompt_ids)
        out = []
        for start in range(0, len(prompt_ids), chunk):
            rows = slice(start, start + chunk)
            new, log_probs = self._generate(
                input_ids[rows], attention_mask[rows], sampling, fields, int(max_new_tokens), **extra
            )
            for ids, lp in zip(new.tolist(), log_probs.tolist()):
                ids = _trim_new_ids(ids, self.eos_token_ids, stop_strings, self.tokenizer)
                out.append(SampledIds(ids, lp[: len(ids)]))
        return out

    def _generate(
        self, input_ids, attention_mask, sampling: dict, fields: dict, response_length: int, **generate_kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(responses, log_probs)``, each ``(bs, response_length)``: the generated ids right-padded
        with the pad token, and their fp32 log-probs under the sampling distribution (0 after the
        last generated position)."""
        from transformers import LogitsProcessorList

        gen_config, processor = self._generation_config(sampling, **fields)
        device = next(self.module.parameters()).device
        output = self.module.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            generation_config=gen_config,
            logits_processor=LogitsProcessorList([processor]),
            **generate_kwargs,
        ).cpu()
        responses = output[:, input_ids.shape[1] :]
        if isinstance(processor, SampledLogProbRecorder):
            processor.finish(responses)
        log_probs = processor.log_probs(response_length, responses.shape[0])
        if responses.shape[1] < response_length:  # every sequence stopped early: pad to a fixed width
            pad = responses.new_full((responses.shape[0], response_length - responses.shape[1]), self.pad_token_id)
            responses = torch.cat([responses, pad], dim=1)
        return responses, log_probs


def _trim_new_ids(ids: list[int], eos_ids: list[int], stop_strings, tokenizer) -> list[int]:
    """``ids`` up to its first EOS or the first token whose prefix text holds a stop string.

    ``generate`` pads a sequence that met a stop string (with the pad token, often the EOS id),
    so the stop-string cut must be looked for before the EOS one is trusted.
    """
    eos = next((i for i, t in enumerate(ids) if t in eos_ids), None)
    ids = ids if eos is None else ids[: eos + 1]
    if not stop_strings or not any(s in tokenizer.decode(ids) for s in stop_strings):
        return ids
    lo, hi = 1, len(ids)  # smallest prefix length whose text holds a stop string
    while lo < hi:
        mid = (lo + hi) // 2
        if any(s in tokenizer.decode(ids[:mid]) for s in stop_strings):
            hi = mid
        else:
            lo = mid + 1
    return ids[:lo]
