"""trainer.balance_batch: equal row counts and nearly equal token counts per data-parallel
worker; every row's tensors and non-tensors move together, so GRPO advantages (by uid) are the
same rows' advantages as without balancing."""

import numpy as np
import torch

from hybridrl.algorithms.advantages import get_adv_estimator_fn
from hybridrl.protocol import DataProto
from hybridrl.trainer.ppo.balance import balance_batch


def _batch(lengths, n=2, seed=0):
    """Rows of ``lengths`` valid tokens (right padded), ``n`` responses per uid."""
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
    scores = torch.zeros(len(lengths), width)
    scores[torch.arange(len(lengths)), torch.tensor(lengths) - 1] = torch.rand(len(lengths), generator=gen)
    return DataProto.from_dict(
        tensors={
            "attention_mask": mask,
            "response_mask": mask,
            "token_level_rewards": scores,
            "row": torch.arange(len(lengths)),
        },
        non_tensors={
            "uid": np.array([f"p{i // n}" for i in range(len(lengths))], dtype=object),
            "row_name": np.array([f"r{i}" for i in range(len(lengths))], dtype=object),
        },
    )


def _rank_tokens(batch, world_size):
    per_rank = batch.batch["attention_mask"].sum(-1).chunk(world_size)
    return [int(x.sum()) for x in per_rank]


def test_hand_case_two_workers():
    # consecutive halves hold 10+9+8+7 = 34 and 4+3+2+1 = 10 tokens; balanced: 22 / 22
    batch = _batch([10, 9, 8, 7, 4, 3, 2, 1])
    metrics = balance_batch(batch, world_size=2)
    assert _rank_tokens(batch, 2) == [22, 22]
    assert metrics["global_seqlen/max"] == 34 and metrics["global_seqlen/min"] == 10
    assert metrics["global_seqlen/minmax_diff"] == 24
    assert metrics["global_seqlen/balanced_max"] == metrics["global_seqlen/balanced_min"] == 22
    assert metrics["global_seqlen/mean"] == 22


def test_rows_move_whole_and_balance_improves():
    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(1, 60, (24,), generator=gen).sort(descending=True).values.tolist()
    batch = _batch(lengths)
    before = _rank_tokens(batch, 4)
    balance_batch(batch, world_size=4)
    after = _rank_tokens(batch, 4)
    assert max(after) - min(after) < max(before) - min(before)
    assert max(after) - min(after) <= max(lengths)
    rows = batch.batch["row"]
    assert sorted(rows.tolist()) == list(range(24))
    assert torch.equal(batch.batch["attention_mask"].sum(-1), torch.tensor(lengths)[rows])
    assert list(batch.non_tensor_batch["row_name"]) == [f"r{i}" for i in rows.tolist()]
    assert list(batch.non_tensor_batch["uid"]) == [f"p{i // 2}" for i in rows.tolist()]


def test_grpo_advantages_follow_their_rows():
    batch = _batch([12, 3, 9, 9, 1, 7, 5, 11], n=4)
    reference = batch[np.arange(len(batch))]  # an untouched copy

    def advantages(data):
        return get_adv_estimator_fn("grpo")(
            token_level_rewards=data.batch["token_level_rewards"],
            response_mask=data.batch["response_mask"],
            index=data.non_tensor_batch["uid"],
            norm_adv_by_std_in_grpo=True,
        )[0]

    balance_batch(batch, world_size=2)
    rows = batch.batch["row"]
    assert not torch.equal(rows, torch.arange(8))  # it did reorder
    torch.testing.assert_close(advantages(batch), advantages(reference)[rows])


def test_one_worker_or_uneven_rows_leave_the_batch_alone():
    for world_size, lengths in ((1, [5, 1, 4]), (2, [5, 1, 4])):
        batch = _batch(lengths, n=1)
        assert balance_batch(batch, world_size) == {}
        assert batch.batch["row"].tolist() == [0, 1, 2]
