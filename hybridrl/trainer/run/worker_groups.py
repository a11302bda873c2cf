"""Which backend runs the workers, and the worker groups the driver talks to.

``trainer.backend=local`` builds every role in this process (one worker; a debugger just
works). ``ray`` starts ``trainer.nnodes x trainer.n_gpus_per_node`` processes on a Ray cluster
(a local one is started when ``RAY_ADDRESS`` is not set) and builds actor/rollout/reference,
critic and reward model colocated in the same processes, FSDP2-sharded over them. ``auto``
picks local for one worker and Ray for more. The driver code is the same for both.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, cast

from omegaconf import OmegaConf

from hybridrl.config import worker_batch_sizes
from hybridrl.controller.local import LocalWorkerGroup
from hybridrl.controller.ray import (
    RayClassWithInitArgs,
    RayWorkerGroup,
    ResourcePoolManager,
    Role,
    create_colocated_worker_cls,
)
from hybridrl.controller.worker import MALLOC_REUSE_ENV, resolve_device
from hybridrl.errors import ConfigError
from hybridrl.trainer.run.metrics import reduce_worker_metrics
from hybridrl.workers import fsdp_workers
from hybridrl.workers.rollout_worker import RolloutWorker
from hybridrl.workers.teacher_worker import TeacherWorker, teacher_pool_spec

logger = logging.getLogger(__name__)


@dataclass
class WorkerGroups:
    """The worker groups of one run, by role name (``actor_rollout``, ``critic``,
    ``reward_model``, ``rollout`` for PPO; ``model`` for SFT and RM)."""

    groups: dict[str, Any]
    world_size: int = 1
    backend: str = "local"
    _cleanups: list[Callable[[], None]] = field(default_factory=list)

    @property
    def actor_rollout(self):
        return self.groups["actor_rollout"]

    @property
    def critic(self):
        """None when the run has no critic."""
        return self.groups.get("critic")

    @property
    def reward_model(self):
        """None when the run has no reward model."""
        return self.groups.get("reward_model")

    @property
    def rollout(self):
        """A rollout pool of its own (``actor_rollout_ref.rollout.nnodes > 0``); else None."""
        return self.groups.get("rollout")

    @property
    def teacher(self):
        """The distillation teachers' pool of their own (``distillation.nnodes > 0``); else None."""
        return self.groups.get("teacher")

    def shutdown(self) -> None:
        """Stops worker processes, then a Ray instance this run started (no-op for local)."""
        for cleanup in self._cleanups:  # in order: the groups first, Ray last
            cleanup()
        self._cleanups.clear()


def resolve_backend(trainer_cfg, other_pools: Sequence[int] = ()) -> tuple[str, int]:
    """``(backend, world_size)`` from ``trainer.backend``, ``trainer.nnodes`` and
    ``trainer.n_gpus_per_node`` of ``trainer_cfg`` (the run's ``trainer`` section); ``auto`` picks Ray
    when there are several workers or pools of their own (``other_pools``: their workers per node;
    a PPO run's: :func:`ppo_backend`).

    Raises:
        ConfigError: local backend with more than one worker, or fewer than one worker.
    """
    nnodes, per_node = int(trainer_cfg.nnodes), int(trainer_cfg.n_gpus_per_node)
    if nnodes < 1 or per_node < 1:
        raise ConfigError(f"trainer.nnodes={nnodes} and trainer.n_gpus_per_node={per_node} must both be >= 1")
    world_size = nnodes * per_node
    backend = trainer_cfg.backend
    if backend == "auto":
        backend = "ray" if world_size > 1 or other_pools else "local"
    if backend == "local" and world_size > 1:
        raise ConfigError(
            f"trainer.backend=local runs one worker in this process, but trainer.nnodes x trainer.n_gpus_per_node "
            f"= {world_size}; set trainer.backend=ray (or auto) for {world_size} workers, or n_gpus_per_node=1"
        )
    return backend, world_size


def rollout_pool_spec(config) -> list[int]:
    """Workers per node of a rollout pool of its own (``actor_rollout_ref.rollout.nnodes`` x
    ``n_gpus_per_node`` of the PPO ``config``); empty when the engines live in the trainer's workers."""
    rollout = config.actor_rollout_ref.rollout
    return [int(rollout.n_gpus_per_node)] * int(rollout.nnodes)


def own_pools(config) -> dict[str, list[int]]:
    """The PPO run's pools of their own beside the trainer's, by role name (``rollout``:
    :func:`rollout_pool_spec`; ``teacher``: :func:`~hybridrl.workers.teacher_worker.teacher_pool_spec`)
    with their workers per node; a pool without workers is left out."""
    pools = {"rollout": rollout_pool_spec(config), "teacher": teacher_pool_spec(getattr(config, "distillation", None))}
    return {name: spec for name, spec in pools.items() if spec}


def ppo_backend(config) -> tuple[str, int]:
    """:func:`resolve_backend` of the PPO ``config``, with its pools of their own (:func:`own_pools`)."""
    return resolve_backend(config.trainer, [n for spec in own_pools(config).values() for n in spec])


VERL_NCCL_TIMEOUT = 600  # verl's default of <role>.nccl_timeout


def process_group_timeout(config) -> float | None:
    """The process-group timeout verl's ``nccl_timeout`` asks for (seconds), or None when every role
    keeps verl's default (then ``trainer.dist_timeout_s`` is the timeout). The roles share one group
    here, so the longest set wins."""
    timeouts = [config.actor_rollout_ref.nccl_timeout, config.critic.nccl_timeout, config.reward_model.nccl_timeout]
    chosen = [float(t) for t in timeouts if t != VERL_NCCL_TIMEOUT]
    for role, value in zip(("actor_rollout_ref", "critic", "reward_model"), timeouts):
        if not value > 0:
            raise ConfigError(f"{role}.nccl_timeout={value!r} must be a number of seconds > 0")
    return max(chosen) if chosen else None


def ray_init_kwargs(config) -> dict:
    """The keyword arguments of ``ray.init`` from the PPO ``config``: ``ray_kwargs.ray_init`` (verl
    0.5) without its null values (``num_cpus: null``, ``runtime_env.py_executable: null``: Ray's
    defaults, as verl), with ``ray_init.num_cpus`` (verl 0.4) when that is set and the former is
    not. ``runtime_env.env_vars`` keeps ``TOKENIZERS_PARALLELISM=false`` unless it sets it."""
    kwargs = _without_nulls(cast(dict, OmegaConf.to_container(config.ray_kwargs.ray_init, resolve=True)))
    if config.ray_init.num_cpus is not None:
        kwargs.setdefault("num_cpus", config.ray_init.num_cpus)
    runtime_env = dict(kwargs.pop("runtime_env", None) or {})
    env_vars = {name: str(value) for name, value in (runtime_env.get("env_vars") or {}).items()}  # Ray takes str
    runtime_env["env_vars"] = {**RAY_ENV_VARS, **env_vars}
    kwargs["runtime_env"] = runtime_env
    return kwargs


RAY_ENV_VARS = {"TOKENIZERS_PARALLELISM": "false"}


def _without_nulls(mapping: dict) -> dict:
    return {k: _without_nulls(v) if isinstance(v, dict) else v for k, v in mapping.items() if v is not None}


def _roles(
    config,
    use_critic: bool,
    use_reference: bool,
    use_reward_model: bool,
    total_training_steps: int,
    pools: dict[str, list[int]],
) -> dict[str, tuple]:
    """role name -> (worker class, args, kwargs) of the trainer's pool; ``device`` is filled in by
    the caller. The per-worker batch sizes are computed here, once, for the run's world size;
    ``total_training_steps`` (the LR schedule's length) is handed to the trained roles."""
    _, world_size = ppo_backend(config)
    n = int(config.actor_rollout_ref.rollout.n)
    role = ("actor_rollout_ref" if use_reference else "actor_rollout").replace(
        "_rollout", "" if "rollout" in pools else "_rollout"
    )  # with a rollout pool: no engine here
    actor_sizes = worker_batch_sizes(config.actor_rollout_ref.actor, n, world_size)
    roles: dict[str, tuple[type, tuple, dict]] = {
        "actor_rollout": (
            fsdp_workers.ActorRolloutRefWorker,
            (config.actor_rollout_ref, actor_sizes),
            {"role": role, "total_training_steps": total_training_steps, "distillation": _distillation(config)},
        )
    }
    if use_critic:
        critic_sizes = worker_batch_sizes(config.critic, n, world_size)
        roles["critic"] = (
            fsdp_workers.CriticWorker,
            (config.critic, critic_sizes),
            {"total_training_steps": total_training_steps},
        )
    if use_reward_model:
        roles["reward_model"] = (fsdp_workers.RewardModelWorker, (config.reward_model,), {})
    return roles


def _distillation(config):
    """The ``distillation`` section when the run distills (the actor trains on its loss; the
    teachers live in the policy workers, sharded like the reference, or on a pool of their own),
    else None."""
    section = getattr(config, "distillation", None)
    return section if section is not None and section.enabled else None


def _own_pool_roles(config, pools: dict[str, list[int]]) -> dict[str, tuple[list[int], tuple]]:
    """role name -> (workers per node, (worker class, args, kwargs)) of each pool of its own."""
    out: dict[str, tuple[list[int], tuple]] = {}
    if "rollout" in pools:  # verl's standalone rollout: the engines on workers of their own
        out["rollout"] = (pools["rollout"], (RolloutWorker, (config.actor_rollout_ref,), {}))
    if "teacher" in pools:  # verl's teacher resource pool
        # the trainer's per-worker sizes: the teachers read only their log-prob micro batch (the
        # training one is its fallback); the pool's own split of a batch is padded to its size
        _, world_size = ppo_backend(config)
        sizes = worker_batch_sizes(config.actor_rollout_ref.actor, int(config.actor_rollout_ref.rollout.n), world_size)
        args = (config.actor_rollout_ref, sizes, config.distillation)
        out["teacher"] = (pools["teacher"], (TeacherWorker, args, {}))
    return out


def build_worker_groups(
    config, use_critic: bool, use_reference: bool, use_reward_model: bool = False, total_training_steps: int = 1
) -> WorkerGroups:
    """Builds and initialises (``init_model``) every worker group a PPO run needs; the actor and
    critic schedule their learning rate over ``total_training_steps`` optimizer steps (the run's)."""
    # One-step-off: a prefetching generate call (from a driver thread) runs beside the training
    # calls in each process; the worker's engine lock keeps weight syncs out of generations.
    concurrency = 2 if config.trainer.one_step_off_policy else 1
    pools = own_pools(config)
    roles = _roles(config, use_critic, use_reference, use_reward_model, total_training_steps, pools)
    groups = launch_worker_groups(
        config,
        roles,
        concurrency,
        own_pool_roles=_own_pool_roles(config, pools),
        ray_init=ray_init_kwargs(config),
        pg_timeout_s=process_group_timeout(config),
        ray_timeline=config.ray_kwargs.timeline_json_file,
    )
    report_startup_memory(groups.groups["actor_rollout"], groups.world_size)
    return groups


def report_startup_memory(actor_group, world_size: int) -> float:
    """Prints the workers' peak memory once every role is built (GiB, the busiest worker's:
    ``perf/max_memory_allocated_gb`` of :func:`hybridrl.workers.memory.memory_metrics`; the roles
    share the actor's processes), so a run shows whether start-up or training is its peak.
    Returns it."""
    peak = reduce_worker_metrics(actor_group.get_memory_metrics())["perf/max_memory_allocated_gb"]
    print(f"hybridrl: workers built: peak memory {peak:.2f} GB per worker (max over {world_size})", flush=True)
    return peak


def launch_worker_groups(
    config,
    roles: dict[str, tuple],
    max_concurrency: int = 1,
    own_pool_roles: dict[str, tuple[list[int], tuple]] | None = None,
    ray_init: dict | None = None,
    pg_timeout_s: float | None = None,
    ray_timeline: str | None = None,
) -> WorkerGroups:
    """Builds one worker group per role, colocated in the same processes (``trainer.backend``,
    ``trainer.nnodes`` x ``trainer.n_gpus_per_node``), plus one group per pool of its own, and
    calls every group's ``init_model``.

    Args:
        config: the run's config (PPO, SFT or RM; its ``trainer`` section says where the workers run).
        roles: role name -> ``(worker class, args, kwargs)``; ``device`` is added here.
        max_concurrency: calls one Ray worker process runs at once.
        own_pool_roles: role name -> ``(workers per node, (worker class, args, kwargs))`` of each
            pool of its own (PPO's rollout and teacher pools, :func:`own_pools`; Ray only).
        ray_init: keyword arguments of ``ray.init`` (:func:`ray_init_kwargs`); None: none.
        pg_timeout_s: the workers' process-group timeout (:func:`process_group_timeout`, PPO's
            ``nccl_timeout``); None: ``trainer.dist_timeout_s``.
        ray_timeline: a file for Ray's timeline of the run, written at its end (PPO's
            ``ray_kwargs.timeline_json_file``); None: none.

    Raises:
        ConfigError: see :func:`resolve_backend` and :func:`init_ray`.
    """
    own = own_pool_roles or {}
    backend, world_size = resolve_backend(config.trainer, [n for workers, _ in own.values() for n in workers])
    device = config.trainer.device
    # read by every worker process as it starts: keep or return freed memory (cuda: the workers'
    # GPUs, maybe on other nodes than this GPU-less driver's, so not resolved here)
    if device != "cuda" and resolve_device(device) == "cpu":
        os.environ[MALLOC_REUSE_ENV] = "1" if config.trainer.cpu_malloc_reuse else "0"
    if backend == "local":
        groups = {
            name: LocalWorkerGroup(cls, *args, device=device, **kwargs) for name, (cls, args, kwargs) in roles.items()
        }
        result = WorkerGroups(groups, world_size=1, backend="local")
    else:
        result = _build_ray_groups(
            config, roles, world_size, device, max_concurrency, own, ray_init or {}, pg_timeout_s, ray_timeline
        )
    for name in [*roles, *own]:  # the actor first: its model load warms the cache the others read
        result.groups[name].init_model()
    return result


def _build_ray_groups(
    config,
    roles: dict,
    world_size: int,
    device: str,
    max_concurrency: int,
    own: dict[str, tuple[list[int], tuple]],
    ray_init: dict,
    pg_timeout_s: float | None,
    ray_timeline: str | None,
) -> WorkerGroups:
    import ray

    trainer_cfg = config.trainer
    threads = int(trainer_cfg.cpu_threads_per_worker)
    os.environ.setdefault("HYBRIDRL_DIST_TIMEOUT_S", str(trainer_cfg.dist_timeout_s))
    if pg_timeout_s is not None:
        os.environ["HYBRIDRL_PG_TIMEOUT_S"] = str(pg_timeout_s)
    started_ray = init_ray(ray_init, (world_size + sum(sum(workers) for workers, _ in own.values())) * threads)
    use_gpu = device == "cuda" or (device == "auto" and ray.cluster_resources().get("GPU", 0) > 0)
    spec = {"global_pool": [int(trainer_cfg.n_gpus_per_node)] * int(trainer_cfg.nnodes)}
    mapping = {Role.ActorRolloutRef: "global_pool"}  # every role of `roles`, colocated
    for name, (workers, _) in own.items():
        spec[f"{name}_pool"], mapping[Role(name)] = workers, f"{name}_pool"
    pools = ResourcePoolManager(spec, mapping=mapping, use_gpu=use_gpu, cpus_per_worker=threads)
    pools.create_resource_pool()
    worker_device = "cuda" if use_gpu else "cpu"
    class_dict = {
        name: RayClassWithInitArgs(cls, *args, device=worker_device, **kwargs)
        for name, (cls, args, kwargs) in roles.items()
    }
    colocated = RayWorkerGroup(
        pools.get_resource_pool(Role.ActorRolloutRef),
        create_colocated_worker_cls(class_dict),
        cpu_threads_per_worker=threads,
        max_concurrency=max_concurrency,
    )
    result = WorkerGroups(colocated.spawn(class_dict.keys()), world_size=world_size, backend="ray")
    result._cleanups.append(colocated.shutdown)
    for name, (_, (cls, args, kwargs)) in own.items():
        group = RayWorkerGroup(
            pools.get_resource_pool(Role(name)),
            RayClassWithInitArgs(cls, *args, device=worker_device, **kwargs),
            cpu_threads_per_worker=threads,
        )
        result.groups[name] = group
        result._cleanups.insert(0, group.shutdown)
    if ray_timeline:  # verl: Ray's timeline of the whole run, written at its end
        result._cleanups.append(functools.partial(write_ray_timeline, str(ray_timeline)))
    if started_ray:
        result._cleanups.append(ray.shutdown)
    return result


def write_ray_timeline(path: str) -> None:
    """Ray's timeline of the tasks so far (chrome://tracing JSON) into ``path`` (``ray_kwargs.timeline_json_file``)."""
    import ray

    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    ray.timeline(filename=path)
    logger.info("ray: timeline written to %s", path)


@contextlib.contextmanager
def _on_loopback_only():
    """While a local Ray instance starts: its GCS, raylet, driver and workers listen on 127.0.0.1
    only. Ray (2.60) replaces a loopback ``_node_ip_address`` by the machine's routable address and
    listens on every interface unless its "no cluster" switch (``ENABLE_RAY_CLUSTER``, read at call
    time, set from ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` at import) is off; a one-machine instance
    has no other node to reach it, so nothing else on the network should."""
    from ray._private import ray_constants

    if not hasattr(ray_constants, "ENABLE_RAY_CLUSTER"):  # another Ray: its own defaults
        logger.debug("ray: no ENABLE_RAY_CLUSTER switch; the local instance keeps Ray's addresses")
        yield
        return
    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before


def init_ray(ray_init: dict, cpus_needed: int) -> bool:
    """Connects to the cluster at ``RAY_ADDRESS`` (or ``ray_init["address"]``, the keyword arguments
    of ``ray.init``: :func:`ray_init_kwargs`; ``auto`` for a ``ray start`` on this machine), else
    starts a Ray instance of its own, listening on loopback only, with at least ``cpus_needed``
    logical CPUs. Returns whether this call started Ray (then the run shuts it down at the end).

    Raises:
        ModelDependencyError-like ConfigError: Ray is not installed.
    """
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "trainer.backend=ray needs Ray: pip install 'hybridrl[ray]' (or set trainer.backend=local "
            "and trainer.n_gpus_per_node=1)"
        ) from None
    if ray.is_initialized():
        return False
    kwargs = dict(ray_init)
    joining = bool(os.environ.get("RAY_ADDRESS") or kwargs.get("address"))
    if not joining:
        kwargs["address"] = "local"  # not a cluster some other program left running here
        kwargs.setdefault("num_cpus", max(os.cpu_count() or 1, cpus_needed))
        kwargs.setdefault("include_dashboard", False)
    kwargs.setdefault("runtime_env", {"env_vars": dict(RAY_ENV_VARS)})
    with contextlib.nullcontext() if joining else _on_loopback_only():
        ray.init(**kwargs)
    logger.info("ray: %s cluster, resources %s", "joined" if joining else "started a local", ray.cluster_resources())
    return True
