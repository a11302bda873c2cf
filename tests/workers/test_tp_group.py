"""The rollout TP group (``rollout.tensor_model_parallel_size``, issue 30) on two Gloo processes with a
stand-in engine: the leader generates the group's rows once and each rank gets its own rows' samples
back; a failing leader fails its followers with one line naming it instead of leaving them waiting."""

import os
import socket

import pytest
import torch

from hybridrl.protocol import DataProto
from hybridrl.workers.rollout.base import RolloutEngineError
from hybridrl.workers.rollout.tp_group import RolloutTPGroup

pytestmark = pytest.mark.slow

N = 2  # samples per row the stand-in engine returns


def _engine(calls):
    def generate(rows: DataProto) -> DataProto:
        calls.append(len(rows))
        if (rows.batch["input_ids"] < 0).any():
            raise ValueError("a negative token id")
        return rows.repeat(N, interleave=True)

    return generate


def _rank(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo")
    group = RolloutTPGroup(2, rank, 2)
    calls: list[int] = []
    ids = torch.arange(3 + rank)[:, None] + 100 * rank  # 3 rows on rank 0, 4 on rank 1
    out = group.run_on_leader(DataProto.from_dict({"input_ids": ids}), _engine(calls))
    try:
        group.run_on_leader(DataProto.from_dict({"input_ids": -ids - 1}), _engine(calls))
        failure = ""
    except (RolloutEngineError, ValueError) as exc:
        failure = f"{type(exc).__name__}: {exc}"
    torch.save({"ids": out.batch["input_ids"], "calls": calls, "failure": failure}, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()  # else Gloo's threads may abort the process as the interpreter exits


def test_the_leader_generates_the_groups_rows_and_each_rank_gets_its_own(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.start_processes(_rank, args=(port, str(tmp_path)), nprocs=2, start_method="spawn")
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert ranks[0]["calls"] == [7, 7] and ranks[1]["calls"] == []  # one batch of both ranks' rows, twice
    for rank, got in enumerate(ranks):
        ids = torch.arange(3 + rank)[:, None] + 100 * rank
        assert torch.equal(got["ids"], ids.repeat_interleave(N, 0))  # its own rows, their samples in place
    assert ranks[0]["failure"] == "ValueError: a negative token id"
    assert ranks[1]["failure"].startswith("RolloutEngineError: the rollout engine of rank 0")
    assert ranks[1]["failure"].endswith("ValueError: a negative token id") and "\n" not in ranks[1]["failure"]
