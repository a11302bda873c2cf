"""Ulysses sequence parallelism for transformers models: a packed micro batch split along the
sequence over the ``S`` ranks of a sequence-parallel (SP) group.

Source: DeepSpeed-Ulysses (Jacobs et al. 2023, "DeepSpeed Ulysses: System Optimizations for
Enabling Training of Extreme Long Sequence Transformer Models", arXiv:2309.14509), as verl uses
it for its FSDP workers.

Each rank of an SP group runs the model on its ``1/S`` of every packed row: embeddings, MLPs,
norms and rotary embeddings are per token, so they need nothing from the other ranks. Attention
needs the whole sequence: before it, an all-to-all turns the ``(seq/S, heads)`` layout into
``(seq, heads/S)`` (each rank then holds whole sequences for a share of the heads), attention runs
over the full packed row with its block-diagonal causal mask, and a second all-to-all turns the
output back into ``(seq/S, heads)``. Activation memory per rank falls about ``S``-fold; attention
costs the same per rank as on one rank with ``heads/S`` heads.

No model class is patched: the model runs hybridrl's attention function
(:mod:`hybridrl.models.attention`, registered with ``transformers.AttentionInterface``), and a
sequence-parallel forward passes the SP group and the whole rows' block-diagonal mask in the
keyword argument :data:`ULYSSES_KWARG`, which transformers carries down to every attention call
(gradient-checkpoint recomputation included); with it, the attention function runs
:func:`ulysses_attention` and ignores the mask the model built from its slice of the position ids.
Without it (generation, a rollout copy of the model) attention is the ordinary one.

Key/value heads: when ``S`` does not divide ``num_key_value_heads`` but ``num_key_value_heads``
divides ``S`` (e.g. 2 KV heads at ``S=4``), each KV head is repeated ``S / kv_heads`` times
before the exchange, as verl does; any other combination is refused.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hybridrl.errors import ConfigError

ULYSSES_KWARG = "ulysses"


class SequenceParallelError(ConfigError):
    """The model or its inputs cannot be split over a sequence-parallel group (one line)."""


@dataclass(frozen=True)
class UlyssesGroup:
    """This rank's sequence-parallel group: ``size`` consecutive ranks, this one ``rank`` among them."""

    group: object  # torch.distributed.ProcessGroup
    size: int
    rank: int


# ---- pure layout helpers (no communication) ---------------------------------------------------


def round_up(n: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` (>= 1) that is >= ``n``."""
    return -(-n // multiple) * multiple


def split_packed(
    input_ids: torch.Tensor, position_ids: torch.Tensor, positions: torch.Tensor, rank: int, size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One rank's slice of packed rows, and which rank computes each output position.

    Args:
        input_ids, position_ids: ``(rows, row_len)``, ``row_len`` a multiple of ``size``.
        positions: ``(n,)`` flat positions into ``rows * row_len`` whose outputs are read.
        rank, size: this rank in the SP group, and the group's size.

    Returns:
        ``(input_ids, position_ids, local_positions, owner)``: the ``(rows, row_len / size)``
        columns ``[rank * row_len / size, (rank + 1) * row_len / size)``; the flat positions into
        ``rows * row_len / size`` of the ``positions`` this rank holds, in their order; ``owner``
        ``(n,)`` int64, the rank that holds each of ``positions``.

    Raises:
        ValueError: ``size`` does not divide ``row_len``.
    """
    row_len = input_ids.shape[1]
    if row_len % size:
        raise ValueError(f"split_packed: row length {row_len} is not a multiple of the SP size {size}")
    chunk = row_len // size
    row, col = positions // row_len, positions % row_len
    owner = col // chunk
    mine = owner == rank
    local_positions = row[mine] * chunk + col[mine] - rank * chunk
    columns = slice(rank * chunk, (rank + 1) * chunk)
    return input_ids[:, columns].contiguous(), position_ids[:, columns].contiguous(), local_positions, owner


def packed_causal_mask(position_ids: torch.Tensor) -> torch.Tensor | None:
    """The block-diagonal causal mask of packed rows, ``(rows, 1, row_len, row_len)`` bool (True:
    attend), or None when every row holds one sequence: plain causal attention then, which SDPA
    computes without an ``L x L`` mask (its flash kernel; a dense mask sends it to the O(L^2)
    math path, which for long responses is most of the memory).

    A sequence starts wherever the position id is not the previous one plus 1 (transformers'
    ``find_packed_sequence_indices``); a token attends to the earlier tokens of its own sequence.

    Args:
        position_ids: ``(rows, row_len)`` of the whole (unsplit) rows.
    """
    first = position_ids[:, :1] - 1
    sequence = (torch.diff(position_ids, prepend=first, dim=-1) != 1).cumsum(-1)  # (rows, row_len)
    if bool((sequence == 0).all()):
        return None
    row_len = position_ids.shape[-1]
    causal = torch.ones(row_len, row_len, dtype=torch.bool, device=position_ids.device).tril()
    same = sequence[:, :, None] == sequence[:, None, :]
    return (same & causal)[:, None]


def send_buffer(x: torch.Tensor, size: int, scatter_dim: int) -> torch.Tensor:
    """``x`` cut in ``size`` equal chunks along ``scatter_dim``, stacked: ``(size, *chunk_shape)``;
    chunk ``j`` goes to rank ``j`` of an all-to-all."""
    return torch.stack(x.chunk(size, dim=scatter_dim)).contiguous()


def from_receive_buffer(received: torch.Tensor, gather_dim: int) -> torch.Tensor:
    """The ``(size, *chunk_shape)`` chunks received from ranks ``0 .. size - 1`` joined along
    ``gather_dim`` (a dimension of the chunk)."""
    return torch.cat(received.unbind(0), dim=gather_dim)


def assemble(parts: list[torch.Tensor], owner: torch.Tensor) -> torch.Tensor:
    """Per-position outputs of all ranks in position order: ``parts[r]`` ``(>= n_r, ...)`` holds
    rank ``r``'s ``n_r`` outputs (rows beyond are padding), ``owner`` ``(n,)`` names the rank of
    each position (:func:`split_packed`). Returns ``(n, ...)``."""
    out = parts[0].new_empty(owner.shape[0], *parts[0].shape[1:])
    for r, part in enumerate(parts):
        mine = owner == r
        out[mine] = part[: int(mine.sum())]
    return out


# ---- collectives with their gradients -----------------------------------------------------------


def all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group: UlyssesGroup) -> torch.Tensor:
    """Chunk ``j`` of ``x`` along ``scatter_dim`` to rank ``j``; the chunks received joined along
    ``gather_dim``. No gradient (see :func:`seq_to_heads`)."""
    send = send_buffer(x, group.size, scatter_dim)
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group.group)
    return from_receive_buffer(received, gather_dim)


class _AllToAll(torch.autograd.Function):
    """An all-to-all is a permutation of the group's elements: its gradient is the inverse exchange."""

    @staticmethod
    def forward(ctx, x, scatter_dim: int, gather_dim: int, group: UlyssesGroup):
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return all_to_all(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return all_to_all(grad.contiguous(), gather_dim, scatter_dim, ctx.group), None, None, None


def seq_to_heads(x: torch.Tensor, group: UlyssesGroup) -> torch.Tensor:
    """``(bs, heads, seq / S, dim)`` on each rank -> ``(bs, heads / S, seq, dim)``: rank ``r`` gets
    heads ``[r * heads / S, (r + 1) * heads / S)`` of the whole sequence. Differentiable."""
    return _AllToAll.apply(x, 1, 2, group)


def heads_to_seq(x: torch.Tensor, group: UlyssesGroup) -> torch.Tensor:
    """The inverse of :func:`seq_to_heads`: ``(bs, heads / S, seq, dim)`` -> ``(bs, heads, seq / S, dim)``."""
    return _AllToAll.apply(x, 2, 1, group)


class _GatherOutputs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local: torch.Tensor, owner: torch.Tensor, group: UlyssesGroup):
        counts = torch.bincount(owner, minlength=group.size).tolist()
        padded = local.new_zeros(max(max(counts), 1), *local.shape[1:])
        padded[: local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in range(group.size)]
        dist.all_gather(parts, padded, group=group.group)
        ctx.mine, ctx.size = owner == group.rank, group.size
        return assemble(parts, owner)

    @staticmethod
    def backward(ctx, grad):
        return grad[ctx.mine] * ctx.size, None, None


def gather_outputs(local: torch.Tensor, owner: torch.Tensor, group: UlyssesGroup) -> torch.Tensor:
    """Per-position outputs computed by the ranks that hold them, on every rank of the group.

    Args:
        local: ``(n_local, ...)`` this rank's outputs, in the order of its positions in ``owner``.
        owner: ``(n,)`` the rank that holds each position (:func:`split_packed`).

    Returns:
        ``(n, ...)``, the same on every rank. Differentiable: the gradient of a gather is this
        rank's slice of the incoming gradient, times ``S``. Every rank of the group computes the
        same loss from the gathered outputs, and each backpropagates only its slice; FSDP then
        averages gradients over all ``W`` ranks, while the ``S`` slices of one group are parts of
        one gradient that must be summed: the factor ``S`` turns that average back into a sum (the
        loss is normalised by ``W / S`` data-parallel groups, see ``loss_normalizers``).
    """
    return _GatherOutputs.apply(local, owner, group)


# ---- the attention function ---------------------------------------------------------------------


class UlyssesAttention:
    """The keyword argument :data:`ULYSSES_KWARG` of a sequence-parallel forward.

    A plain class, not a dataclass: FSDP2 copies dataclass arguments of a forward (to cast
    their tensors), which would lose the call count.

    Attributes:
        group: this rank's SP group.
        mask: ``(rows, 1, row_len, row_len)`` bool mask of the whole rows, or None for plain
            causal attention (:func:`packed_causal_mask`).
        calls: attention calls so far; 0 after a forward means the model never called
            :func:`ulysses_attention` (its attention cannot be split).
    """

    def __init__(self, group: UlyssesGroup, mask: torch.Tensor | None) -> None:
        self.group = group
        self.mask = mask
        self.calls = 0

    def check_called(self, model_name: str) -> None:
        """Raises SequenceParallelError when no attention layer went through :func:`ulysses_attention`."""
        if not self.calls:
            raise SequenceParallelError(
                f"{model_name}: its attention layers do not use transformers' attention interface, so "
                "ulysses_sequence_parallel_size > 1 cannot split them; set ulysses_sequence_parallel_size=1"
            )


def _refuse_unsplittable(kwargs: dict, row_len: int) -> None:
    window = kwargs.get("sliding_window")
    if window is not None and window < row_len:
        raise SequenceParallelError(
            f"sliding-window attention (window {window} < packed row of {row_len} tokens) "
            "is not supported with ulysses_sequence_parallel_size > 1; set it to 1"
        )
    for name in ("softcap", "s_aux"):
        if kwargs.get(name) is not None:
            raise SequenceParallelError(
                f"attention with {name} is not supported with ulysses_sequence_parallel_size > 1; set it to 1"
            )


def ulysses_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention over the whole packed rows from this rank's slice of them (transformers'
    attention-function signature).

    Args:
        query: ``(rows, heads, row_len / S, head_dim)``, this rank's tokens.
        key, value: ``(rows, kv_heads, row_len / S, head_dim)``.
        attention_mask: ignored (the model's mask of this rank's slice); the mask of the whole
            rows comes in ``kwargs[ULYSSES_KWARG]``.
        kwargs: :data:`ULYSSES_KWARG` -> :class:`UlyssesAttention`.

    Returns:
        ``(rows, row_len / S, heads, head_dim)`` and None, as SDPA's.

    Raises:
        SequenceParallelError: sliding-window (narrower than the row), soft-capped or sink attention.
    """
    state: UlyssesAttention = kwargs[ULYSSES_KWARG]
    group = state.group
    _refuse_unsplittable(kwargs, query.shape[2] * group.size)
    if key.shape[1] < group.size:  # e.g. 2 KV heads at S=4: each rank needs one whole KV head
        key, value = (t.repeat_interleave(group.size // key.shape[1], dim=1) for t in (key, value))
    query, key, value = (seq_to_heads(t, group) for t in (query, key, value))
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped-query attention: query head h reads KV head h // groups
        key, value = (t.repeat_interleave(groups, dim=1) for t in (key, value))
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=state.mask, is_causal=state.mask is None, dropout_p=dropout, scale=scaling
    )
    state.calls += 1
    return heads_to_seq(out, group).transpose(1, 2).contiguous(), None


# ---- can a model be split? ----------------------------------------------------------------------


def heads_problem(num_heads: int | None, num_kv_heads: int | None, size: int) -> str | None:
    """Why ``size`` cannot split these attention heads, or None when it can."""
    if not num_heads:
        return "the model config has no num_attention_heads"
    kv = num_kv_heads or num_heads
    if num_heads % size:
        return f"it must divide the model's num_attention_heads ({num_heads})"
    if kv % size and size % kv:
        return f"it must divide the model's num_key_value_heads ({kv}) or be a multiple of it"
    return None


def model_config_problem(model_dir: str, size: int) -> str | None:
    """Why ``size`` cannot split the model of an HF folder, read from its ``config.json`` (no
    weights), or None when it can or the folder has no ``config.json`` (a GGUF file or a hub name:
    the worker checks the loaded model, ``hybridrl.models.attention.use_ulysses_attention``)."""
    path = os.path.join(os.path.expanduser(str(model_dir)), "config.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        config = json.load(f)
    for name in config.get("architectures") or []:
        cls = _transformers_class(name)
        if cls is not None and not getattr(cls, "_supports_attention_backend", False):
            return f"{name} does not use transformers' attention interface, so its attention cannot be split"
    text = config.get("text_config") or config
    return heads_problem(text.get("num_attention_heads"), text.get("num_key_value_heads"), size)


def _transformers_class(name: str):
    try:
        import transformers

        return getattr(transformers, name, None)
    except Exception:  # noqa: BLE001 (a model module whose optional dependencies are missing)
        return None


def hf_model_of(module: torch.nn.Module):
    """The transformers ``PreTrainedModel`` inside ``module`` (itself, or wrapped by peft/FSDP), or None."""
    from transformers import PreTrainedModel

    return next((m for m in module.modules() if isinstance(m, PreTrainedModel)), None)
