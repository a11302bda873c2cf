"""Padding removal: pack the valid tokens of a padded batch into a few dense rows, and map
per-token outputs back to the padded layout.

A rollout batch is padded twice: prompts on the left, responses on the right. Packing lays each
sequence's valid tokens (``attention_mask == 1``) end to end in rows of at most
``max_row_tokens`` tokens, with position ids that restart at 0 for every sequence.
transformers (>= 4.53) turns position ids that restart into a block-diagonal causal mask
when ``attention_mask`` is None (``masking_utils.find_packed_sequence_indices``), so no token
attends across a sequence boundary, as with FlashAttention's varlen kernels in verl.

Rows of a bounded size, rather than one row of all tokens: attention costs
``O(row_len**2)`` per row, so a row as long as the longest sequence keeps it below the padded
batch's cost while the matmuls of every layer see no padding at all. The tail of a row that
the sequences do not fill is filler (token 0); causal attention keeps it from influencing the
real tokens before it, and its outputs are never read.

Index bookkeeping follows FlashAttention's ``unpad_input`` / ``pad_input``
(``flash_attn.bert_padding``): ``indices`` are flat positions in ``(batch * seqlen)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class PackingError(ValueError):
    """The batch cannot be packed with the same meaning as its padded form."""


def unpad_input(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Flat positions of the valid tokens and the sequence boundaries.

    Args:
        attention_mask: ``(bs, seqlen)`` 0/1 (int or bool).

    Returns:
        ``(indices, cu_seqlens, max_seqlen)``: ``indices`` ``(nnz,)`` int64 flat positions into
        ``bs * seqlen`` in row-major order; ``cu_seqlens`` ``(bs + 1,)`` int32 cumulative
        valid-token counts (sequence ``b`` is ``indices[cu_seqlens[b]:cu_seqlens[b + 1]]``);
        ``max_seqlen`` the largest count.
    """
    lengths = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(attention_mask.flatten(), as_tuple=False).flatten()
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(lengths, dim=0, dtype=torch.int32), (1, 0))
    return indices, cu_seqlens, int(lengths.max().item()) if lengths.numel() else 0


def pad_input(values: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """Inverse of gathering ``values = x.flatten(0, 1)[indices]``: ``(nnz, ...)`` back to
    ``(batch, seqlen, ...)``, zeros at the positions not in ``indices``. Differentiable."""
    out = values.new_zeros(batch * seqlen, *values.shape[1:])
    out = out.index_put((indices,), values)
    return out.view(batch, seqlen, *values.shape[1:])


def first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Bins of item indices whose lengths sum to at most ``capacity`` (first-fit decreasing:
    at most 11/9 of the optimal bin count + 1). An item longer than ``capacity`` gets a bin of
    its own. Items keep their original relative order inside each bin."""
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for b, load in enumerate(loads):
            if load + lengths[i] <= capacity:
                bins[b].append(i)
                loads[b] += lengths[i]
                break
        else:
            bins.append([i])
            loads.append(lengths[i])
    return [sorted(b) for b in bins]


@dataclass(frozen=True)
class PackedBatch:
    """A padded batch packed into dense rows.

    Attributes:
        input_ids: ``(rows, row_len)`` the valid tokens, sequence after sequence; filler 0.
        position_ids: ``(rows, row_len)`` 0, 1, ... within each sequence (and the filler).
        token_index: ``(bs, seqlen)`` int64: flat position in ``rows * row_len`` of each padded
            token, -1 where ``attention_mask`` is 0.
        cu_seqlens: ``(n_seq + 1,)`` int32 sequence boundaries in the flattened ``rows * row_len``
            tokens, from 0 to ``rows * row_len``; the filler tail of a row is a sequence of its own.
        max_seqlen: the longest of those sequences.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    token_index: torch.Tensor
    cu_seqlens: torch.Tensor | None = None
    max_seqlen: int = 0

    @property
    def num_tokens(self) -> int:
        """Tokens the model processes (``rows * row_len``, filler included)."""
        return self.input_ids.numel()

    def model_inputs(self, varlen: bool = False) -> dict:
        """Keyword arguments of an HF model's forward: no attention mask, so the restarting
        position ids give the block-diagonal causal mask; ``varlen``: also the sequence
        boundaries as transformers' varlen keywords (``cu_seq_lens_q``, ``max_length_q``, ...),
        for :func:`hybridrl.models.attention.hybridrl_attention`'s varlen path."""
        inputs: dict = {"input_ids": self.input_ids, "position_ids": self.position_ids, "attention_mask": None}
        if varlen:
            inputs.update(
                cu_seq_lens_q=self.cu_seqlens,
                cu_seq_lens_k=self.cu_seqlens,
                max_length_q=self.max_seqlen,
                max_length_k=self.max_seqlen,
            )
        return inputs


def pack_sequences(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    max_row_tokens: int | None = None,
    row_multiple: int = 1,
) -> PackedBatch:
    """Packs the valid tokens of a padded batch into rows of at most ``max_row_tokens``.

    Args:
        input_ids: ``(bs, seqlen)`` token ids.
        attention_mask: ``(bs, seqlen)`` 0/1; the valid tokens of a row form its sequence, in order.
        position_ids: ``(bs, seqlen)``; at the valid tokens they must count 0, 1, 2, ... (as
            ``cumsum(attention_mask) - 1`` gives), which is what the packed rows use.
        max_row_tokens: row capacity; raised to the longest sequence when smaller; None: the
            longest sequence (attention then never costs more than in the padded batch).
        row_multiple: ``row_len`` is rounded up to a multiple of it with filler (sequence
            parallelism splits every row in that many equal slices).

    Returns:
        PackedBatch with ``row_len = max(sum of the lengths in a row)``, rounded up to ``row_multiple``.

    Raises:
        PackingError: the position ids of a valid token are not its rank in its sequence
            (e.g. multimodal rope position ids), so packing would change the model's input.
    """
    bs, seqlen = attention_mask.shape
    mask = attention_mask.bool()
    rank = torch.cumsum(mask, dim=-1) - 1  # rank of each valid token within its sequence
    if position_ids.shape != mask.shape or not torch.equal(position_ids[mask], rank[mask]):
        raise PackingError(
            "use_remove_padding: position_ids must count 0, 1, 2, ... over each row's valid tokens "
            "(cumsum(attention_mask) - 1) to pack sequences; set use_remove_padding=false for this model/data"
        )
    lengths = mask.sum(dim=-1).tolist()
    capacity = max(max(lengths, default=0), int(max_row_tokens or 0), 1)
    bins = first_fit_decreasing(lengths, capacity)
    row_len = max(sum(lengths[i] for i in b) for b in bins) if bins else 1
    row_len = -(-max(row_len, 1) // row_multiple) * row_multiple
    # Start offset (flat, in rows * row_len) of every sequence; boundaries incl. each row's filler.
    start = [0] * bs
    bounds = [0]
    for r, b in enumerate(bins):
        offset = r * row_len
        for i in b:
            start[i] = offset
            offset += lengths[i]
            if lengths[i]:
                bounds.append(offset)
        if offset < (r + 1) * row_len:
            bounds.append((r + 1) * row_len)
    starts = torch.tensor(start, dtype=torch.long, device=mask.device)
    token_index = torch.where(mask, starts[:, None] + rank, torch.full_like(rank, -1))
    flat = token_index[mask]
    rows = max(len(bins), 1)
    packed_ids = input_ids.new_zeros(rows * row_len)
    packed_ids[flat] = input_ids[mask]
    # Filler positions continue 0.. from the row start; the valid tokens overwrite theirs.
    packed_pos = torch.arange(row_len, device=mask.device, dtype=position_ids.dtype).repeat(rows)
    packed_pos[flat] = rank[mask].to(position_ids.dtype)
    if not bins:  # no sequences: one row of filler
        bounds = [0, rows * row_len]
    cu_seqlens = torch.tensor(bounds, dtype=torch.int32, device=mask.device)
    max_seqlen = max(b - a for a, b in zip(bounds[:-1], bounds[1:]))
    return PackedBatch(
        packed_ids.view(rows, row_len), packed_pos.view(rows, row_len), token_index, cu_seqlens, max_seqlen
    )
