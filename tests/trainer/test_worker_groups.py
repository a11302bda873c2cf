"""Backend choice from the config, and the resource check of the Ray backend."""

import pytest
from omegaconf import OmegaConf

from hybridrl.errors import ConfigError
from hybridrl.trainer.worker_groups import resolve_backend


def _cfg(backend="auto", nnodes=1, per_node=1):
    return OmegaConf.create({"trainer": {"backend": backend, "nnodes": nnodes, "n_gpus_per_node": per_node}})


@pytest.mark.parametrize("backend, nnodes, per_node, expected", [
    ("auto", 1, 1, ("local", 1)), ("auto", 1, 2, ("ray", 2)), ("auto", 2, 4, ("ray", 8)),
    ("ray", 1, 1, ("ray", 1)), ("local", 1, 1, ("local", 1)),
])
def test_resolve_backend(backend, nnodes, per_node, expected):
    assert resolve_backend(_cfg(backend, nnodes, per_node)) == expected


def test_a_rollout_pool_of_its_own_picks_ray():
    cfg = OmegaConf.merge(_cfg(), {"actor_rollout_ref": {"rollout": {"nnodes": 1, "n_gpus_per_node": 2}}})
    assert resolve_backend(cfg) == ("ray", 1)


def test_local_backend_with_several_workers_is_refused():
    with pytest.raises(ConfigError, match="trainer.backend=local runs one worker") as err:
        resolve_backend(_cfg("local", 1, 2))
    assert "trainer.backend=ray" in str(err.value)


@pytest.mark.parametrize("nnodes, per_node", [(0, 1), (1, 0)])
def test_at_least_one_worker(nnodes, per_node):
    with pytest.raises(ConfigError, match=">= 1"):
        resolve_backend(_cfg("auto", nnodes, per_node))


def test_resource_check_names_what_is_missing(ray_cluster):
    from hybridrl.controller.ray import ResourceError, ResourcePoolManager, Role

    manager = ResourcePoolManager({"global_pool": [4, 4]}, {Role.ActorRolloutRef: "global_pool"}, cpus_per_worker=1)
    with pytest.raises(ResourceError, match="has 6 CPUs but 8 workers need 8") as err:
        manager.create_resource_pool()
    assert "trainer.n_gpus_per_node" in str(err.value)
    with pytest.raises(ResourceError, match="GPUs"):
        ResourcePoolManager({"global_pool": [1]}, {Role.ActorRolloutRef: "global_pool"}, use_gpu=True).check_resources()
