"""``trainer.balance_batch``: every data-parallel worker gets about the same number of tokens.

The worker group hands worker ``r`` the ``r``-th equal slice of the batch's rows. Rollout rows
differ a lot in length, so consecutive slices can differ several-fold in tokens and the
workers wait for the slowest. Reordering the rows first (verl's ``RayPPOTrainer._balance_batch``)
gives every slice the same number of rows and nearly the same number of tokens. Every per-row
tensor and non-tensor (``uid`` included) moves with its row, so the group advantages, which are
computed by ``uid``, are unchanged.
"""

from __future__ import annotations

from hybridrl.data.partition import karmarkar_karp
from hybridrl.protocol import DataProto


def balance_batch(batch: DataProto, world_size: int) -> dict[str, float]:
    """Reorders ``batch`` in place so that its ``world_size`` equal row slices hold balanced token counts.

    Args:
        batch: rows with ``attention_mask`` ``(bs, seqlen)``; ``bs`` divisible by ``world_size``
            (the start-up check guarantees it for training batches).
        world_size: data-parallel workers; 1 leaves the batch as it is.

    Returns:
        metrics (verl's names): ``global_seqlen/min``, ``/max``, ``/minmax_diff`` (tokens per
        worker before balancing), ``/balanced_min``, ``/balanced_max`` (after), ``/mean``.
        Empty when nothing was done.
    """
    n = len(batch)
    if world_size <= 1 or n % world_size:
        return {}
    seqlens = batch.batch["attention_mask"].sum(dim=-1).tolist()
    per_rank = n // world_size
    before = [sum(seqlens[r * per_rank : (r + 1) * per_rank]) for r in range(world_size)]
    partitions = karmarkar_karp(seqlens, world_size, equal_size=True)
    batch.reorder([i for part in partitions for i in part])
    after = [sum(seqlens[i] for i in part) for part in partitions]
    return {
        "global_seqlen/min": float(min(before)),
        "global_seqlen/max": float(max(before)),
        "global_seqlen/minmax_diff": float(max(before) - min(before)),
        "global_seqlen/balanced_min": float(min(after)),
        "global_seqlen/balanced_max": float(max(after)),
        "global_seqlen/mean": sum(seqlens) / world_size,
    }
