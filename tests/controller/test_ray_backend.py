"""The Ray backend on a two-node simulated cluster: the torch.distributed environment, every
dispatch and execute mode, colocated roles, futures, and errors that reach the driver (a
failing method names rank and traceback; a dying process fails fast instead of hanging)."""

import os
import sys
import time

import pytest
import torch

from hybridrl.controller.decorator import Dispatch, register
from hybridrl.controller.worker import Worker
from hybridrl.protocol import DataProto

ray = pytest.importorskip("ray")
from hybridrl.controller.ray import (  # noqa: E402
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    ResourceError,
    WorkerError,
    create_colocated_worker_cls,
)

# Worker classes defined in this test file travel to the Ray processes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class ToyWorker(Worker):
    def __init__(self, scale: int = 1) -> None:
        super().__init__()
        self.scale = scale
        self.init_distributed("cpu")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def env(self):
        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        return {key: os.environ.get(key) for key in keys} | {"pid": os.getpid(), "threads": torch.get_num_threads()}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce_rank(self):
        import torch.distributed as dist

        value = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(value)
        return value.item()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto) -> DataProto:
        return DataProto.from_dict(
            tensors={"x": data.batch["x"] * 2 * self.scale, "rank": torch.full((len(data),), self.rank)}
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def add(self, a, b):
        return a + b + self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def slow(self, seconds: float):
        time.sleep(seconds)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_on_rank_one(self):
        if self.rank == 1:
            raise ValueError("bad value on purpose")
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def die_on_rank_one(self):
        import torch.distributed as dist

        if self.rank == 1:
            os._exit(3)
        dist.barrier()  # rank 0 waits for a peer that is gone

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def die_after_rank_zero_fails(self):
        if self.rank == 1:  # rank 0's error reaches the driver first, the death a moment later
            time.sleep(0.5)
            os._exit(3)
        raise RuntimeError("Connection closed by peer")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stop_on_rank_one(self):
        import signal

        if self.rank == 1:  # hangs without dying, outside any collective (as a SIGSTOP during generation)
            os.kill(os.getpid(), signal.SIGSTOP)
        return self.rank


class OtherWorker(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self):
        return os.getpid()


@pytest.fixture(scope="module")
def group(ray_cluster):
    pool = RayResourcePool([1, 1])  # one process on each simulated node
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(ToyWorker, scale=3), name_prefix="toy")
    yield wg
    wg.shutdown()


def test_each_rank_gets_the_torch_distributed_environment(group):
    envs = group.env()
    assert [e["RANK"] for e in envs] == ["0", "1"] and {e["WORLD_SIZE"] for e in envs} == {"2"}
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "0"] and {e["LOCAL_WORLD_SIZE"] for e in envs} == {"1"}
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1 and envs[0]["MASTER_PORT"]
    assert envs[0]["pid"] != envs[1]["pid"] and {e["threads"] for e in envs} == {1}
    assert group.all_reduce_rank() == [3.0, 3.0]  # the Gloo process group spans both nodes


def test_dispatch_modes(group):
    data = DataProto.from_dict(tensors={"x": torch.arange(5.0)})  # 5 rows over 2 ranks: padded to 6
    out = group.double(data)
    assert torch.equal(out.batch["x"], torch.arange(5.0) * 6) and out.batch["rank"].tolist() == [0, 0, 0, 1, 1]
    assert group.add([1, 2], b=[10, 20]) == [11, 23]
    with pytest.raises(ValueError, match="world_size=2"):
        group.add([1], b=[2])


def test_worker_errors_name_rank_and_traceback(group):
    with pytest.raises(WorkerError) as err:
        group.fail_on_rank_one()
    msg = str(err.value)
    assert "ToyWorker.fail_on_rank_one" in msg and "rank 1" in msg and "ValueError: bad value on purpose" in msg
    assert "worker traceback" in msg and "test_ray_backend.py" in msg
    assert group.add([1, 2], b=[0, 0]) == [1, 3]  # the group still works after a method error


def test_colocated_roles_share_processes(ray_cluster):
    pool = RayResourcePool([2])
    colocated = RayWorkerGroup(
        pool,
        create_colocated_worker_cls(
            {"toy": RayClassWithInitArgs(ToyWorker), "other": RayClassWithInitArgs(OtherWorker)}
        ),
    )
    try:
        groups = colocated.spawn({"toy", "other"})
        toy_pids = [e["pid"] for e in groups["toy"].env()]
        assert groups["other"].pid() == toy_pids and len(set(toy_pids)) == 2
        assert groups["toy"].all_reduce_rank() == [3.0, 3.0]
    finally:
        colocated.shutdown()


def test_max_concurrency_runs_a_second_call_beside_a_running_one(group):
    """One-step-off-policy training's Ray setting: a call from another driver thread runs while
    a slow one is still running in the same worker process; with one call at a time (the
    module's group: the default max_concurrency=1) it waits."""
    import threading

    two_at_once = RayWorkerGroup(RayResourcePool([1]), RayClassWithInitArgs(ToyWorker), max_concurrency=2)
    try:
        for wg, overlaps in ((two_at_once, True), (group, False)):
            wg.env()  # started
            slow = threading.Thread(target=lambda wg=wg: wg.slow(3.0))
            slow.start()
            time.sleep(0.5)  # the slow call is running
            started = time.monotonic()
            wg.env()
            waited = time.monotonic() - started  # one at a time: >= the 2.5 s the slow call still runs
            assert (waited < 2.0) == overlaps, (overlaps, waited)
            slow.join(30)
    finally:
        two_at_once.shutdown()


def test_a_dying_worker_fails_the_call_without_hanging(ray_cluster):
    pool = RayResourcePool([2])
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(ToyWorker))
    try:
        start = time.time()
        with pytest.raises(WorkerError, match="rank 1 died"):
            wg.die_on_rank_one()
        assert time.time() - start < 30  # well before the 60 s collective timeout
    finally:
        wg.shutdown()


def test_a_peer_death_is_reported_over_the_error_it_caused(ray_cluster):
    pool = RayResourcePool([2])
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(ToyWorker))
    try:
        with pytest.raises(WorkerError, match="rank 1 died"):
            wg.die_after_rank_zero_fails()
    finally:
        wg.shutdown()


def test_a_stopped_worker_fails_the_call_within_the_deadline(ray_cluster, monkeypatch):
    monkeypatch.setenv("HYBRIDRL_DIST_TIMEOUT_S", "3")  # trainer.dist_timeout_s
    pool = RayResourcePool([2])
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(ToyWorker))
    try:
        start = time.time()
        with pytest.raises(
            WorkerError,
            match=r"ToyWorker.stop_on_rank_one: rank\(s\) \[1\] gave no answer within "
            r"trainer.dist_timeout_s=3 s of the other ranks",
        ):
            wg.stop_on_rank_one()
        assert time.time() - start < 30
    finally:
        wg.shutdown()


def test_a_pool_larger_than_the_cluster_is_a_clear_error(ray_cluster):
    pool = RayResourcePool([4], cpus_per_worker=1)  # no node has 4 CPUs
    with pytest.raises(ResourceError, match="could not reserve"):
        pool.placement_groups(timeout_s=3)


class BadConfigWorker(Worker):
    def __init__(self) -> None:
        super().__init__()
        from hybridrl.errors import ConfigError

        raise ConfigError("actor_rollout_ref.model.path=/nope does not exist; fix the path")


def test_a_user_error_inside_a_worker_stays_one_line(ray_cluster):
    from hybridrl.controller.ray import WorkerUserError
    from hybridrl.errors import UserError

    with pytest.raises(WorkerUserError) as err:
        RayWorkerGroup(RayResourcePool([1]), RayClassWithInitArgs(BadConfigWorker))
    msg = str(err.value)
    assert (
        msg == "actor_rollout_ref.model.path=/nope does not exist; fix the path (in BadConfigWorker.__init__, rank 0)"
    )
    assert isinstance(err.value, UserError)
