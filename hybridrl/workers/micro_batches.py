"""Micro batches by token budget (``use_dynamic_bsz``) and token-balanced partitions.

Rows of a rollout batch differ a lot in length. A fixed number of rows per micro batch either
wastes the memory budget on short rows or runs out of it on long ones; verl's
``use_dynamic_bsz`` instead forms micro batches of at most ``max_token_len`` valid tokens, each
about as full as the others (balanced partitioning), and restores the original row order of
the results. The same partitioning, with equal row counts, balances a batch over the
data-parallel workers (``trainer.balance_batch``).

Partitioning: :func:`hybridrl.data.partition.karmarkar_karp` (Karmarkar & Karp's largest
differencing method, k-way), as verl's ``seqlen_balancing.py`` uses.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.distributed as dist

from hybridrl.data.partition import karmarkar_karp
from hybridrl.errors import ConfigError
from hybridrl.protocol import DataProto


def max_across_ranks(value: int, device: torch.device | str) -> int:
    """The largest ``value`` over the data-parallel group (``value`` itself without one)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def token_budget_partitions(
    seqlens: Sequence[int], max_token_len: int, key: str, device: torch.device | str = "cpu"
) -> list[list[int]]:
    """Row indices of micro batches holding at most ``max_token_len`` tokens each.

    The fewest micro batches that the balanced partition fits in the budget; with several
    data-parallel ranks, all of them use the largest count any rank needs, because FSDP's
    collectives inside forward and backward run in lock-step (a rank with fewer micro batches
    would hang the others). Micro batches are ordered longest first.

    Args:
        seqlens: valid tokens of each row.
        max_token_len: the budget (``ppo_max_token_len_per_gpu`` and friends).
        key: the config key of the budget, for the error message.
        device: where the all-reduce runs (the worker's device).

    Raises:
        ConfigError: a single row is longer than the budget.
    """
    if max_token_len is None or max_token_len < 1:
        raise ConfigError(f"{key}={max_token_len!r} must be an integer >= 1 (tokens per micro batch on one worker)")
    longest = max(seqlens, default=0)
    if longest > max_token_len:
        raise ConfigError(
            f"{key}={max_token_len} is smaller than a {longest}-token sequence of this batch; "
            f"raise it to at least data.max_prompt_length + data.max_response_length"
        )
    n = len(seqlens)
    count = min(n, max(1, math.ceil(sum(seqlens) / max_token_len)))
    while count < n:
        parts = karmarkar_karp(seqlens, count)
        if max(sum(seqlens[i] for i in p) for p in parts) <= max_token_len:
            break
        count += 1
    count = max_across_ranks(count, device)
    parts = [p for p in karmarkar_karp(seqlens, count) if p] if n else []
    parts.sort(key=lambda p: -sum(seqlens[i] for i in p))
    if len(parts) < count:  # fewer rows than another rank's count: still match its forward count
        raise ConfigError(
            f"{key}={max_token_len}: this worker has {n} rows but another needs {count} micro "
            "batches; raise the budget or give every worker more rows"
        )
    return parts


def split_micro_batches(
    data: DataProto,
    micro_batch_size: int | None,
    use_dynamic_bsz: bool = False,
    max_token_len: int | None = None,
    key: str = "max_token_len",
) -> tuple[list[DataProto], list[int] | None]:
    """Micro batches of ``data``: ``micro_batch_size`` rows each, or by token budget.

    Args:
        data: the rows (``attention_mask`` counts the tokens of each).
        micro_batch_size: rows per micro batch (fixed mode).
        use_dynamic_bsz: micro batches of at most ``max_token_len`` tokens instead.
        key: the budget's config key, for messages.

    Returns:
        ``(micro_batches, order)``: ``order`` is None in fixed mode (consecutive rows), else the
        row indices of the micro batches concatenated; :func:`restore_order` undoes it.
    """
    if not use_dynamic_bsz:
        return data.split(micro_batch_size), None
    seqlens = data.batch["attention_mask"].sum(dim=-1).tolist()
    parts = token_budget_partitions(seqlens, max_token_len, key, data.batch["attention_mask"].device)
    return [data[part] for part in parts], [i for part in parts for i in part]


def restore_order(values: torch.Tensor, order: list[int] | None) -> torch.Tensor:
    """Rows of ``values`` (concatenated micro-batch results) back in the order of the input batch."""
    if order is None:
        return values
    index = torch.as_tensor(order, device=values.device)
    return torch.empty_like(values).index_copy_(0, index, values)
