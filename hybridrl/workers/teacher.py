"""On-policy distillation's teachers in the policy worker (``distillation.teacher_models``): frozen
causal LMs, loaded and sharded like the reference policy, that score the student's sampled
responses with the HF forward.

Each teacher gives ``teacher_log_prob`` ``(bs, response_length)``, the sampled token's log-prob,
and for a top-k loss (``forward_kl_topk``) ``teacher_topk_log_probs`` / ``teacher_topk_ids``
``(bs, response_length, topk)``, its ``topk`` most likely next tokens (full-vocabulary
log-softmax at the teacher's temperature). Several teachers: each row goes to the teacher whose
``key`` its ``distillation.teacher_key`` column holds (:func:`route_rows`).
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import torch

from hybridrl.errors import ConfigError
from hybridrl.protocol import DataProto
from hybridrl.workers.micro_batches import restore_order
from hybridrl.workers.model_forward import forward_response

logger = logging.getLogger(__name__)

__all__ = ["route_rows", "topk_from_logits", "slots_to_rows", "teacher_scores", "check_same_vocabulary", "TOPK_KEYS"]

TOPK_KEYS = ("teacher_topk_log_probs", "teacher_topk_ids")


def route_rows(data: DataProto, teacher_key: str, keys) -> dict[str, np.ndarray]:
    """``{routing key: row indices}``: with one teacher (routing key ``"default"``) every row;
    else each row by the value of its ``teacher_key`` column.

    Raises:
        ConfigError: the batch has no ``teacher_key`` column, or a row's value is no teacher's key
            (one line naming the row, its value and the keys).
    """
    keys = list(keys)
    if keys == ["default"]:
        return {"default": np.arange(len(data))}
    column = data.non_tensor_batch.get(teacher_key)
    if column is None:
        raise ConfigError(
            f"distillation.teacher_key={teacher_key}: the batch has no {teacher_key!r} column to route the samples "
            f"to the teachers ({', '.join(keys)}); set teacher_key to a column of the data"
        )
    values = np.asarray([str(v) for v in column], dtype=object)
    for row, value in enumerate(values):
        if value not in keys:
            raise ConfigError(
                f"distillation: sample {row} has {teacher_key}={value!r}, which no teacher scores; the teachers' keys "
                f"are {', '.join(keys)} (distillation.teacher_models.<name>.key)"
            )
    return {key: np.flatnonzero(values == key) for key in keys}


def topk_from_logits(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log_probs, ids)`` of the ``k`` most likely tokens of each position, ``(..., k)``; the
    log-probs are the full-vocabulary log-softmax of ``logits`` (already divided by the temperature)."""
    return torch.log_softmax(logits.float(), dim=-1).topk(min(k, logits.shape[-1]), dim=-1)


def slots_to_rows(values: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``(n, k)`` values of the response ``slots`` (row-major) as ``(bs, response_length, k)``, 0
    elsewhere; a ``(bs, response_length, k)`` input (the padded layout) is masked. Differentiable."""
    if values.dim() == 3:
        return values * slots.unsqueeze(-1).to(values.dtype)
    k = values.shape[-1]
    out = values.new_zeros((*slots.shape, k))
    return out.masked_scatter(slots.unsqueeze(-1).expand(*slots.shape, k), values)


@torch.no_grad()
def teacher_scores(policy, data: DataProto, spec, topk: int | None) -> dict[str, torch.Tensor]:
    """The teacher ``policy`` (a :class:`~hybridrl.workers.actor.PPOActor` without optimizer) on the
    rows of ``data``: ``teacher_log_prob`` and, with ``topk``, the top-k tensors (:data:`TOPK_KEYS`),
    in the rows' order. ``spec``: the reference pass's :class:`LogProbSpec` with the teacher's
    temperature."""
    if not topk:
        log_probs, _, _ = policy.compute_log_prob(data, spec)
        return {"teacher_log_prob": log_probs}
    policy.actor_module.eval()
    options = policy.forward_options(spec)
    micros, order = policy._forward_micro_batches(data, spec)
    parts: dict[str, list[torch.Tensor]] = {"teacher_log_prob": [], TOPK_KEYS[0]: [], TOPK_KEYS[1]: []}
    for micro in micros:
        out = forward_response(
            policy.actor_module, micro, spec.temperature, policy.compute_dtype, options, return_logits=True
        )
        assert out.logits is not None  # return_logits=True
        values, ids = topk_from_logits(out.logits, topk)
        parts["teacher_log_prob"].append(out.log_probs)
        parts[TOPK_KEYS[0]].append(slots_to_rows(values, out.slots))
        parts[TOPK_KEYS[1]].append(slots_to_rows(ids, out.slots))
    return {key: restore_order(torch.cat(chunks), order) for key, chunks in parts.items()}


def teacher_spec(spec, temperature) -> object:
    """The reference pass's spec at the teacher's ``inference.temperature`` (None: the student's)."""
    return spec if temperature is None else dataclasses.replace(spec, temperature=float(temperature))


def check_same_vocabulary(
    name: str, path: str, teacher_tokenizer, student_tokenizer, teacher_vocab: int, student_vocab: int, topk: bool
) -> None:
    """The teacher scores the student's token ids: its tokenizer must map text to the same ids.

    Raises:
        ConfigError: the tokenizers differ (one line naming the teacher, its path and the sizes), or
            with a top-k loss the teacher's vocabulary is larger than the student's.
    Logs one warning when only the models' vocabulary sizes (embedding rows) differ."""
    if teacher_tokenizer.get_vocab() != student_tokenizer.get_vocab():
        raise ConfigError(
            f"distillation teacher {name} ({path}): its tokenizer differs from the student's ({len(teacher_tokenizer)} "
            f"vs {len(student_tokenizer)} tokens); the losses compare log-probs of the student's token ids - use a "
            "teacher with the student's tokenizer"
        )
    if teacher_vocab > student_vocab and topk:
        raise ConfigError(
            f"distillation teacher {name} ({path}): vocabulary size {teacher_vocab} > the student's {student_vocab}; "
            "its top-k ids may not exist in the student - use a sampled-token loss_mode (k1, k3) or another teacher"
        )
    if teacher_vocab != student_vocab:
        logger.warning(
            "distillation teacher %s (%s): vocabulary size %d, the student's %d (same tokenizer; padded embeddings)",
            name,
            path,
            teacher_vocab,
            student_vocab,
        )
