"""Masked statistics and logit helpers shared by the RL algorithms.

Masks are 0/1 tensors (bool, int or float) broadcastable to ``values``; 1 marks a valid
element. Masked-out elements never influence a result, even when they hold NaN or inf.
"""

from typing import Optional, Union

import torch

from .errors import AlgorithmConfigError, AlgorithmInputError, UnknownAlgorithmError

Number = Union[int, float, torch.Tensor]

# actor_rollout_ref.actor.loss_agg_mode values, for the policy losses, the critic and the entropy/KL terms
LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
_ACTOR = "actor_rollout_ref.actor"

# Rows of logits processed at once by the logit helpers: bounds the fp32 temporaries to about
# this many elements (e.g. 2**24 floats = 64 MiB) whatever the batch and vocabulary sizes.
_CHUNK_ELEMENTS = 1 << 24


def _masked_values(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # torch.where, not values * mask: NaN * 0 is NaN, and padding may hold NaN/inf.
    mask = mask.to(values.device)
    return torch.where(mask.bool(), values * mask.to(values.dtype), torch.zeros_like(values))


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: Optional[int] = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is 1.

    Args:
        values: any shape, floating point.
        mask: same shape as ``values`` (or broadcastable), 0/1.
        axis: dimension to reduce; ``None`` reduces everything to a scalar.

    Returns:
        Tensor of ``values`` with ``axis`` removed (scalar when ``axis`` is None).
    """
    masked = _masked_values(values, mask)
    return masked.sum() if axis is None else masked.sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: Optional[int] = None) -> torch.Tensor:
    """Mean of ``values`` over the elements where ``mask`` is 1.

    Shapes as in :func:`masked_sum`. Where the mask has no valid element the mean is 0 (not
    NaN), so an all-padding row does not poison a batch statistic.
    """
    total = masked_sum(values, mask, axis)
    count = torch.broadcast_to(mask.to(values.device), values.shape).to(values.dtype)
    count = count.sum() if axis is None else count.sum(dim=axis)
    return total / count.clamp_min(1.0)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``values`` over all elements where ``mask`` is 1 (a scalar tensor).

    ``unbiased=True`` applies Bessel's correction ``n / (n - 1)``. With exactly one valid
    element that correction is undefined and the (zero) biased variance is returned instead.

    Raises:
        AlgorithmInputError: the mask has no valid element at all.
    """
    count = torch.broadcast_to(mask.to(values.device), values.shape).to(values.dtype).sum()
    if count.item() == 0:
        raise AlgorithmInputError(
            "masked_var: the mask selects no element (all zeros); check that response_mask "
            "marks at least one response token in the batch"
        )
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased and count.item() > 1:
        var = var * count / (count - 1)
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Normalise ``values`` to zero mean and unit variance using masked statistics.

    ``(values - mean) / sqrt(var + 1e-8)`` with mean and (unbiased) variance taken over the
    valid elements. With ``shift_mean=False`` the mean is added back after scaling, so the
    result has unit variance but keeps the original mean.
    Masked elements are transformed too (they are not zeroed); callers multiply by the mask.

    Raises:
        AlgorithmInputError: the mask has no valid element.
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def rowwise(x: torch.Tensor, fn) -> torch.Tensor:
    """Apply ``fn: (rows, vocab) fp32 -> (rows,)`` to ``x (..., vocab)`` a chunk of rows at a time.

    Never copies all of ``x``: a non-contiguous input (e.g. ``logits[:, -L-1:-1]``) is walked
    along its first dimension, whose slices can be flattened as views.
    """
    if x.dim() > 2 and not x.is_contiguous():
        return torch.stack([rowwise(x_i, fn) for x_i in x.unbind(0)])
    vocab = x.shape[-1]
    flat = x.reshape(-1, vocab)
    step = max(1, _CHUNK_ELEMENTS // max(vocab, 1))
    parts = [fn(flat[s : s + step].float()) for s in range(0, flat.shape[0], step)]
    out = torch.cat(parts) if parts else flat.new_zeros(0, dtype=torch.float32)
    return out.reshape(x.shape[:-1])


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Log-probability of ``labels`` under ``softmax(logits)``.

    Args:
        logits: ``(..., vocab)``, any float dtype (bf16 is upcast to fp32 for precision).
        labels: ``(...)`` integer token ids in ``[0, vocab)``.

    Returns:
        ``(...)`` fp32 log-probabilities ``logits[label] - logsumexp(logits)``.

    Memory: the label logit is gathered directly and ``logsumexp`` runs over row chunks, so no
    full-size fp32 ``(..., vocab)`` log-softmax tensor is materialised at once.

    Raises:
        AlgorithmInputError: ``labels`` does not match the leading dimensions of ``logits``.
    """
    if logits.shape[:-1] != labels.shape:
        raise AlgorithmInputError(
            f"logprobs_from_logits: labels shape {tuple(labels.shape)} must equal logits shape "
            f"without the vocab dimension {tuple(logits.shape[:-1])}"
        )
    picked = logits.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1).float()
    return picked - rowwise(logits, lambda z: torch.logsumexp(z, dim=-1))


def entropy_rows(z: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of each row of ``(rows, vocab)`` fp32 logits: ``(rows,)``; the per-chunk
    kernel of :func:`entropy_from_logits` (via :func:`rowwise`)."""
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution ``softmax(logits)``, in nats.

    Args:
        logits: ``(..., vocab)``, any float dtype (computed in fp32, in row chunks).

    Returns:
        ``(...)`` fp32 entropy ``logsumexp(z) - sum(softmax(z) * z)``.
    """
    return rowwise(logits, entropy_rows)


def sum_pi_squared_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """``sum_v softmax(logits)_v^2`` per position: the collision probability of the next-token
    distribution (1 for a certain choice, ``1/vocab`` for a uniform one).

    Args:
        logits: ``(..., vocab)``, any float dtype (computed in fp32, in row chunks).

    Returns:
        ``(...)`` fp32.
    """
    return rowwise(logits, lambda z: torch.softmax(z, dim=-1).square().sum(-1))


def clip_by_value(x: torch.Tensor, tensor_min, tensor_max) -> torch.Tensor:
    """Clamp ``x`` element-wise into ``[tensor_min, tensor_max]`` (tensors or numbers).

    Unlike ``torch.clamp`` the bounds may be tensors of ``x``'s shape (e.g. ``values ± c`` in
    the clipped value loss). Shapes: all broadcastable; returns ``x``'s broadcast shape.
    """
    upper = torch.as_tensor(tensor_max, dtype=x.dtype, device=x.device)
    lower = torch.as_tensor(tensor_min, dtype=x.dtype, device=x.device)
    return torch.maximum(torch.minimum(x, upper), lower)


def unknown_agg_mode(loss_agg_mode: str) -> UnknownAlgorithmError:
    """The error for a ``loss_agg_mode`` that is not one of :data:`LOSS_AGG_MODES` (returned, for
    the caller to raise): it names the config key and lists the known modes."""
    return UnknownAlgorithmError(
        f"unknown loss_agg_mode {loss_agg_mode!r} (config key "
        f"`{_ACTOR}.loss_agg_mode`); use one of: {', '.join(LOSS_AGG_MODES)}"
    )


def _check_positive(key: str, value: Optional[Number]) -> None:
    if value is not None and not float(value) > 0:
        raise AlgorithmConfigError(f"agg_loss: {key}={float(value)} must be > 0; pass the global batch's count or None")


def _global_count(key: str, value: Optional[Number], local: torch.Tensor, dp_size: int) -> Number:
    """``value`` (a count over all data-parallel ranks), or the local count on one rank."""
    _check_positive(key, value)
    if value is not None:
        return value
    if dp_size > 1:
        raise AlgorithmConfigError(
            f"agg_loss: dp_size={dp_size} needs the global {key} (the count over every "
            "rank's share of the mini batch); pass it"
        )
    return local


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: Optional[Number] = None,
    global_batch_size: Optional[Number] = None,
    loss_scale_factor: Optional[Number] = None,
) -> torch.Tensor:
    """Aggregate a per-token loss ``(bs, response_length)`` into a scalar (verl 0.9's arguments).

    Modes (``actor_rollout_ref.actor.loss_agg_mode``), with ``m`` the mask:
      * ``token-mean``: ``sum(m * l) / batch_num_tokens``.
      * ``token-sum``: ``sum(m * l)`` (no normalisation; the loss scales with the tokens).
      * ``seq-mean-token-sum``: per-sequence token sum, summed over sequences / ``global_batch_size``.
      * ``seq-mean-token-mean``: per-sequence token mean, the same sequence mean.
      * ``seq-mean-token-sum-norm``: ``seq-mean-token-sum`` / ``loss_scale_factor`` (default
        ``loss_mat.shape[-1]``; Dr. GRPO, arXiv 2503.20783, uses a constant).

    Sequences without a valid token never count. For gradient accumulation and data parallelism
    pass the counts of the whole mini batch over all ranks (``batch_num_tokens``: valid tokens;
    ``global_batch_size``: sequences) and ``dp_size``: every rank's loss is multiplied by
    ``dp_size`` because FSDP averages gradients over the ranks. Then the SUM of the micro-batch
    losses, averaged over ranks, equals the loss of one pass over the mini batch. Without counts
    they are this call's own (allowed only with ``dp_size == 1``).

    Raises:
        UnknownAlgorithmError: unknown ``loss_agg_mode``.
        AlgorithmConfigError: a count that is not > 0, or ``dp_size > 1`` without the count it needs.
    """
    if loss_agg_mode == "token-mean":
        tokens = _global_count("batch_num_tokens", batch_num_tokens, loss_mask.sum(), dp_size)
        return masked_sum(loss_mat, loss_mask) / tokens * dp_size
    if loss_agg_mode == "token-sum":
        return masked_sum(loss_mat, loss_mask) * dp_size
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        seq_losses = masked_sum(loss_mat, loss_mask, axis=-1)
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_losses = masked_mean(loss_mat, loss_mask, axis=-1)
    else:
        raise unknown_agg_mode(loss_agg_mode)
    has_tokens = loss_mask.to(loss_mat.device).sum(dim=-1) > 0
    sequences = _global_count("global_batch_size", global_batch_size, has_tokens.sum(), dp_size)
    loss = torch.where(has_tokens, seq_losses, torch.zeros_like(seq_losses)).sum() / sequences * dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm":
        _check_positive("loss_scale_factor", loss_scale_factor)
        loss = loss / (loss_scale_factor if loss_scale_factor is not None else loss_mat.shape[-1])
    return loss
