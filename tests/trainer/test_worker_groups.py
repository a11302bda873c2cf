"""Backend choice from the config, and the resource check of the Ray backend."""

import json
import os
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from hybridrl.config import load_config
from hybridrl.errors import ConfigError
from hybridrl.trainer.jobs.supervised_config import rm_config, sft_config
from hybridrl.trainer.run.worker_groups import ray_init_kwargs, resolve_backend, rollout_pool_spec
from tests.tiny_models import ppo_config_with


def _cfg(backend="auto", nnodes=1, per_node=1, **others):
    return ppo_config_with({"trainer": {"backend": backend, "nnodes": nnodes, "n_gpus_per_node": per_node}, **others})


def _resolve(cfg):
    return resolve_backend(cfg.trainer, rollout_pool_spec(cfg))


@pytest.mark.parametrize(
    "backend, nnodes, per_node, expected",
    [
        ("auto", 1, 1, ("local", 1)),
        ("auto", 1, 2, ("ray", 2)),
        ("auto", 2, 4, ("ray", 8)),
        ("ray", 1, 1, ("ray", 1)),
        ("local", 1, 1, ("local", 1)),
    ],
)
def test_resolve_backend(backend, nnodes, per_node, expected):
    assert _resolve(_cfg(backend, nnodes, per_node)) == expected


def test_a_rollout_pool_of_its_own_picks_ray():
    cfg = _cfg(actor_rollout_ref={"rollout": {"nnodes": 1, "n_gpus_per_node": 2}})
    assert rollout_pool_spec(cfg) == [2]
    assert _resolve(cfg) == ("ray", 1)


def test_local_backend_with_several_workers_is_refused():
    with pytest.raises(ConfigError, match="trainer.backend=local runs one worker") as err:
        _resolve(_cfg("local", 1, 2))
    assert "trainer.backend=ray" in str(err.value)


@pytest.mark.parametrize("nnodes, per_node", [(0, 1), (1, 0)])
def test_at_least_one_worker(nnodes, per_node):
    with pytest.raises(ConfigError, match=">= 1"):
        _resolve(_cfg("auto", nnodes, per_node))


@pytest.mark.parametrize("name, typed", [("sft_trainer", sft_config), ("rm_trainer", rm_config)])
def test_the_supervised_trainer_sections_place_workers_too(name, typed):
    """``hybridrl sft`` / ``rm`` launch their workers through the same code: their ``trainer``
    sections have every key it reads."""
    trainer = OmegaConf.structured(typed(load_config([], config_name=name))).trainer
    assert resolve_backend(trainer) == ("local", 1)
    assert (trainer.cpu_threads_per_worker, trainer.cpu_malloc_reuse, trainer.dist_timeout_s) == (1, True, 600)


ENV = {"env_vars": {"TOKENIZERS_PARALLELISM": "false"}}


def test_ray_init_takes_both_verl_spellings():
    assert ray_init_kwargs(_cfg()) == {"runtime_env": ENV}  # null values are Ray's defaults
    assert ray_init_kwargs(_cfg(ray_init={"num_cpus": 4})) == {"num_cpus": 4, "runtime_env": ENV}
    both = _cfg(ray_init={"num_cpus": 4}, ray_kwargs={"ray_init": {"num_cpus": 8, "address": "auto"}})
    assert ray_init_kwargs(both) == {"num_cpus": 8, "address": "auto", "runtime_env": ENV}  # verl 0.5's wins


def test_ray_init_passes_verls_runtime_env():
    config = load_config(
        [
            "ray_kwargs.ray_init.runtime_env.py_executable=uv run --frozen",
            "+ray_kwargs.ray_init.runtime_env.env_vars.MY_FLAG=1",
            "+ray_kwargs.ray_init.runtime_env.working_dir=/src",
        ],
        resolve_auto_dtypes=False,
    )
    assert ray_init_kwargs(config)["runtime_env"] == {
        "py_executable": "uv run --frozen",
        "env_vars": {"TOKENIZERS_PARALLELISM": "false", "MY_FLAG": "1"},
        "working_dir": "/src",
    }


def test_nccl_timeout_is_the_process_group_timeout():
    from hybridrl.trainer.run.worker_groups import process_group_timeout

    assert process_group_timeout(load_config([], resolve_auto_dtypes=False)) is None  # trainer.dist_timeout_s
    config = load_config(["actor_rollout_ref.nccl_timeout=1200", "critic.nccl_timeout=900"], resolve_auto_dtypes=False)
    assert process_group_timeout(config) == 1200  # one group for all roles: the longest
    with pytest.raises(ConfigError, match="critic.nccl_timeout=0 must be a number of seconds > 0"):
        process_group_timeout(load_config(["critic.nccl_timeout=0"], resolve_auto_dtypes=False))


def test_resource_check_names_what_is_missing(ray_cluster):
    from hybridrl.controller.ray import ResourceError, ResourcePoolManager, Role

    manager = ResourcePoolManager({"global_pool": [4, 4]}, {Role.ActorRolloutRef: "global_pool"}, cpus_per_worker=1)
    with pytest.raises(ResourceError, match="has 6 CPUs but 8 workers need 8") as err:
        manager.create_resource_pool()
    assert "trainer.n_gpus_per_node" in str(err.value)
    with pytest.raises(ResourceError, match="GPUs"):
        ResourcePoolManager({"global_pool": [1]}, {Role.ActorRolloutRef: "global_pool"}, use_gpu=True).check_resources()


def test_the_actor_and_critic_schedule_their_learning_rate_over_the_runs_steps(tiny_model_dir):
    """The driver hands the run's step count to the trained roles (the config's optim keys are not
    written): a warmup of half the run is 2 of 4 steps, so the first step trains at half the lr."""
    from hybridrl.trainer.run.worker_groups import build_worker_groups

    optim = {"lr_warmup_steps_ratio": 0.5, "warmup_style": "cosine"}
    config = ppo_config_with(
        {
            "actor_rollout_ref": {
                "model": {"path": tiny_model_dir},
                "actor": {"ppo_mini_batch_size": 2, "ppo_micro_batch_size_per_gpu": 2, "optim": optim},
            },
            "critic": {"ppo_micro_batch_size_per_gpu": 2, "optim": optim},
            "data": {"train_batch_size": 2},
            "trainer": {"device": "cpu"},
        }
    )
    groups = build_worker_groups(config, use_critic=True, use_reference=False, total_training_steps=4)
    try:
        actor, critic = groups.actor_rollout.workers[0], groups.critic.workers[0]
        for scheduler in (actor.actor_lr_scheduler, critic.critic_lr_scheduler):
            assert [scheduler.lr_lambdas[0](step) for step in (0, 1, 2)] == [0.0, 0.5, 1.0]
    finally:
        groups.shutdown()
    assert config.actor_rollout_ref.actor.optim.total_training_steps == -1  # the packaged (ignored) default


_LISTENERS = """
import json, os, psutil, ray
from hybridrl.trainer.run.worker_groups import init_ray

assert init_ray({}, 1)

@ray.remote
class Probe:
    def ready(self):
        return True

probe = Probe.remote()
ray.get(probe.ready.remote(), timeout=60)
tree = [psutil.Process()] + psutil.Process().children(recursive=True)
ports = []
for proc in tree:
    try:
        ports += [(proc.name(), c.laddr.ip) for c in proc.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
    except psutil.Error:
        pass  # a process that ended meanwhile
ray.shutdown()
print(json.dumps(ports))
"""


@pytest.mark.slow
def test_a_local_ray_instance_listens_on_loopback_only():
    # Ray 2.60 listened on every interface (issue 33): gcs_server, raylet, the driver and its workers.
    env = {**os.environ, "RAY_ADDRESS": ""}  # its own instance, whatever else runs here
    out = subprocess.run(
        [sys.executable, "-c", _LISTENERS], env=env, capture_output=True, text=True, timeout=180, check=True
    )
    ports = json.loads(out.stdout.strip().splitlines()[-1])
    names = {name for name, _ in ports}
    assert {"gcs_server", "raylet"} <= names, ports
    assert all(ip in ("127.0.0.1", "::ffff:127.0.0.1") for _, ip in ports), ports


def test_a_teacher_pool_of_any_size_takes_the_trainers_batch_sizes():
    """3 teachers for a mini batch of 8 responses: the pool pads its split of a batch, so its size
    need not divide the actor's batches (which would refuse it naming the actor's keys)."""
    from hybridrl.trainer.run.worker_groups import _own_pool_roles, own_pools

    cfg = ppo_config_with(
        {
            "distillation": {"enabled": True, "nnodes": 1, "n_gpus_per_node": 3},
            "actor_rollout_ref": {
                "actor": {"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 4},
                "rollout": {"n": 2},
            },
        }
    )
    cfg.distillation.teacher_models.teacher_model.model_path = "/models/teacher"
    pools = own_pools(cfg)
    assert pools == {"teacher": [3]}
    workers, (cls, (section, sizes, distillation), _) = _own_pool_roles(cfg, pools)["teacher"]
    assert cls.__name__ == "TeacherWorker" and workers == [3] and distillation is cfg.distillation
    assert sizes.ppo_mini_batch_size == 8  # one trainer worker's 4 prompts x 2 responses
