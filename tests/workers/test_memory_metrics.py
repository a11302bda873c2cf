"""verl's memory metrics: what one worker process reports, and the maximum the driver keeps over workers."""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from hybridrl.protocol import DataProto
from hybridrl.trainer.ppo.ppo_trainer import PPOTrainer
from hybridrl.trainer.run.metrics import merge_metrics, reduce_metrics, reduce_worker_metrics
from hybridrl.workers.memory import GIB, MEMORY_METRICS, current_rss_bytes, memory_metrics, peak_rss_bytes

ALLOCATED, RESERVED, CPU_USED = MEMORY_METRICS
MB_200 = 200 * 1024**2


@pytest.fixture(params=["cpu", "cuda"])
def device(request):
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return request.param


def test_values_are_positive_gib_and_the_peak_bounds_the_current(device):
    metrics = memory_metrics(device)
    assert set(metrics) == set(MEMORY_METRICS) and all(isinstance(v, float) for v in metrics.values())
    assert metrics[CPU_USED] > 0.01  # a Python process with torch holds more than 10 MiB
    assert metrics[CPU_USED] == pytest.approx(current_rss_bytes() / GIB, rel=0.05)
    assert peak_rss_bytes() >= current_rss_bytes() * 0.99  # statm and ru_maxrss count pages a little apart
    if device == "cpu":  # both peaks are the process's peak resident memory, never below the current
        assert metrics[ALLOCATED] == metrics[RESERVED] == pytest.approx(peak_rss_bytes() / GIB, rel=0.05)
        assert metrics[ALLOCATED] >= metrics[CPU_USED]
    else:
        torch.ones(1, device=device)
        metrics = memory_metrics(device)
        assert 0 < metrics[ALLOCATED] <= metrics[RESERVED]


ALLOCATE_200_MB = """
import json, torch
from hybridrl.workers.memory import memory_metrics
before = memory_metrics("cpu")
x = torch.ones(50 * 1024**2)  # 200 MiB of fp32, every page written
after = memory_metrics("cpu")
print(json.dumps({"before": before, "after": after, "sum": float(x[::4096].sum())}))
"""


def test_the_cpu_peak_and_the_current_rise_by_a_200_mb_tensor():
    # a fresh process: the peak of this one is whatever the tests before left, and the allocator
    # may hold freed pages (trainer.cpu_malloc_reuse), so a new tensor need not raise it here
    out = subprocess.run(
        [sys.executable, "-c", ALLOCATE_200_MB], capture_output=True, text=True, timeout=120, check=True
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    before, after = report["before"], report["after"]
    assert after[CPU_USED] - before[CPU_USED] >= 0.15
    assert after[ALLOCATED] - before[ALLOCATED] >= 0.1  # the import's transient peak may sit above the current
    assert after[ALLOCATED] >= after[CPU_USED] and after[RESERVED] == after[ALLOCATED]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA allocator's counters")
def test_the_cuda_peak_rises_by_a_200_mb_tensor():
    start = torch.cuda.memory_allocated()
    x = torch.ones(MB_200 // 4, device="cuda")
    metrics = memory_metrics(torch.device("cuda"))
    assert metrics[ALLOCATED] * GIB >= start + MB_200
    assert metrics[RESERVED] >= metrics[ALLOCATED]
    del x


def test_the_reduction_keeps_the_maximum_over_workers_and_the_mean_of_the_rest():
    per_worker = [
        {ALLOCATED: 1.5, RESERVED: 2.0, CPU_USED: 3.0, "actor/pg_loss": 1.0},
        {ALLOCATED: 4.0, RESERVED: 1.0, CPU_USED: 2.5, "actor/pg_loss": 3.0},
    ]
    expected = {ALLOCATED: 4.0, RESERVED: 2.0, CPU_USED: 3.0, "actor/pg_loss": 2.0}
    assert reduce_worker_metrics(per_worker) == expected
    # as the workers' update results reach the driver: DP_COMPUTE_PROTO concatenates their metrics into lists
    merged = DataProto.concat(
        [DataProto(meta_info={"metrics": {**m, "actor/pg_loss": [m["actor/pg_loss"], 0.0]}}) for m in per_worker]
    ).meta_info["metrics"]
    assert merged[ALLOCATED] == [1.5, 4.0]
    assert reduce_metrics(merged) == {**expected, "actor/pg_loss": 1.0}
    assert reduce_metrics({ALLOCATED: 7.0, "response_length/max": [2.0, 4.0]}) == {
        ALLOCATED: 7.0,
        "response_length/max": 3.0,
    }


def test_merging_groups_keeps_the_larger_memory_and_replaces_other_metrics():
    metrics = {ALLOCATED: 5.0, CPU_USED: 1.0, "critic/lr": 0.1}
    merge_metrics(metrics, {ALLOCATED: 2.0, CPU_USED: 4.0, RESERVED: 6.0, "critic/lr": 0.2})
    assert metrics == {ALLOCATED: 5.0, CPU_USED: 4.0, RESERVED: 6.0, "critic/lr": 0.2}


class _Group:
    """A worker group of ``world_size`` workers reporting the given memory; counts its calls."""

    def __init__(self, *allocated):
        self.calls, self.allocated = 0, allocated

    def get_memory_metrics(self):
        self.calls += 1
        return [{ALLOCATED: a, RESERVED: a, CPU_USED: 1.0} for a in self.allocated]


@pytest.mark.parametrize(
    "warmup, pool, teachers", [(0, False, False), (5, False, False), (0, True, False), (0, True, True)]
)
def test_the_driver_asks_only_the_groups_without_an_update_once(warmup, pool, teachers):
    trainer = object.__new__(PPOTrainer)
    actor, rollout, teacher = _Group(3.0, 9.0), _Group(7.0, 2.0), _Group(11.0, 1.0)
    trainer.actor_rollout_wg, trainer.rollout_wg = actor, (rollout if pool else actor)
    trainer.teacher_wg = teacher if teachers else actor  # distillation.nnodes > 0: a pool of their own
    trainer.config = SimpleNamespace(trainer=SimpleNamespace(critic_warmup=warmup))
    trainer.global_steps = 1
    metrics = {ALLOCATED: 4.0, RESERVED: 4.0, CPU_USED: 2.0}  # as the updates reported them
    trainer.collect_memory_metrics(metrics)
    assert (actor.calls, rollout.calls if pool else 0, teacher.calls) == (int(warmup > 1), int(pool), int(teachers))
    expected = 11.0 if teachers else 9.0 if warmup else 7.0 if pool else 4.0
    assert metrics[ALLOCATED] == expected and metrics[CPU_USED] == 2.0
