"""trainer.device=cuda / auto on a GPU-less driver with Ray workers (verl's CPU head node): the
check lets it through and each worker resolves ``auto`` dtypes for its own device (issue 31, item 1a)."""

import copy

import pytest
import torch
from omegaconf import OmegaConf

from hybridrl.config import ConfigError, load_config
from hybridrl.config.precision import resolve_precision, resolved_in_workers, runs_on_ray
from hybridrl.controller.worker import Worker, resolve_worker_precision
from hybridrl.trainer.ppo.config_check import validate_ppo_config

A = "actor_rollout_ref.actor"
PARAM_DTYPE = f"{A}.fsdp_config.mixed_precision.param_dtype"


@pytest.fixture(scope="module")
def base_cfg():
    return load_config(
        [
            "algorithm.adv_estimator=grpo",
            "data.train_batch_size=8",
            f"{A}.ppo_mini_batch_size=4",
            f"{A}.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.n=2",
        ],
        resolve_auto_dtypes=False,
    )


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def with_keys(base, **changes):
    cfg = copy.deepcopy(base)
    for key, value in changes.items():
        OmegaConf.update(cfg, key.replace("__", "."), value, merge=False)
    return cfg


@pytest.mark.parametrize(
    ("backend", "per_node", "ray"), [("ray", 1, True), ("auto", 2, True), ("auto", 1, False), ("local", 1, False)]
)
def test_runs_on_ray_follows_the_backend_choice(base_cfg, backend, per_node, ray):
    cfg = with_keys(base_cfg, trainer__backend=backend, trainer__n_gpus_per_node=per_node)
    assert runs_on_ray(cfg) is ray


def test_cuda_on_a_gpu_less_driver_is_allowed_with_ray_workers(base_cfg, no_gpu):
    validate_ppo_config(with_keys(base_cfg, trainer__device="cuda", trainer__backend="ray"), world_size=1)
    cfg = with_keys(base_cfg, trainer__device="cuda", trainer__n_gpus_per_node=2)  # auto -> ray
    validate_ppo_config(cfg, world_size=2)


def test_cuda_on_a_gpu_less_driver_is_refused_for_the_local_backend(base_cfg, no_gpu):
    for backend in ("local", "auto"):
        with pytest.raises(ConfigError) as err:
            validate_ppo_config(with_keys(base_cfg, trainer__device="cuda", trainer__backend=backend), world_size=1)
        msg = str(err.value)
        assert "\n" not in msg and "trainer.device=cuda" in msg and "trainer.device=cpu" in msg


@pytest.mark.parametrize("device", ["cuda", "auto"])
def test_a_gpu_less_driver_leaves_auto_dtypes_to_ray_workers(base_cfg, no_gpu, device):
    cfg = with_keys(base_cfg, trainer__device=device, trainer__backend="ray")
    assert resolved_in_workers(cfg)
    line = resolve_precision(cfg)
    assert "each worker" in line and PARAM_DTYPE in line
    assert OmegaConf.select(cfg, PARAM_DTYPE) == "auto"


def test_the_driver_still_resolves_for_local_workers_and_cpu(base_cfg, no_gpu):
    for changes in ({"trainer__backend": "local"}, {"trainer__backend": "ray", "trainer__device": "cpu"}):
        cfg = with_keys(base_cfg, **changes)
        assert not resolved_in_workers(cfg)
        assert "auto ->" in resolve_precision(cfg)
        assert OmegaConf.select(cfg, PARAM_DTYPE) in ("bf16", "fp32")


def test_a_worker_resolves_the_auto_dtypes_of_its_section_for_its_device(base_cfg, capsys):
    section = copy.deepcopy(base_cfg.actor_rollout_ref)
    worker = Worker(section, device="cpu")
    assert worker.device == "cpu"
    expected = resolve_precision(OmegaConf.create({"dtype": "auto"}), "cpu").split()[3]
    assert section.actor.fsdp_config.mixed_precision.param_dtype == expected
    assert section.rollout.dtype == expected
    assert "worker precision auto ->" in capsys.readouterr().out
    assert resolve_worker_precision(section, "cpu") is None  # nothing left: quiet
    assert resolve_worker_precision({"dtype": "auto"}, "cpu") is None  # not a DictConfig: untouched


def test_resolved_on_cuda_a_worker_takes_bf16_where_the_gpu_has_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    section = OmegaConf.create({"fsdp_config": {"mixed_precision": {"param_dtype": "auto"}}})
    assert "bf16 on cuda" in resolve_worker_precision(section, "cuda", rank=1)
    assert section.fsdp_config.mixed_precision.param_dtype == "bf16"


def test_a_rollout_pool_worker_resolves_its_auto_dtypes_too(base_cfg):
    from hybridrl.workers.rollout_worker import RolloutWorker

    section = copy.deepcopy(base_cfg.actor_rollout_ref)
    RolloutWorker(section, device="cpu")
    assert section.rollout.dtype in ("bf16", "fp32")


def test_a_memory_plan_still_resolves_auto_on_a_gpu_less_host(no_gpu):
    from hybridrl.trainer.jobs.plan_cli import load_plan_config

    config, note = load_plan_config(["trainer.n_gpus_per_node=2", "trainer.device=auto"])
    assert config.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype in ("bf16", "fp32")
    assert "auto ->" in note
