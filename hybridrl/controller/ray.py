"""The Ray backend: worker groups of Ray actors, one process per rank, on one or many machines.

A :class:`RayResourcePool` reserves one placement group per node (``process_on_nodes[i]``
bundles on node ``i``, packed on that node). A :class:`RayWorkerGroup` starts one host actor
per bundle, gives it the torch.distributed environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) and builds the worker
inside it. A host can hold several workers (one per role): that is how actor, reference and
critic share processes and devices (:func:`create_colocated_worker_cls` + ``spawn``), as in
verl's HybridFlow design. Methods marked with ``@register`` are called through the same
dispatch/collect table as the local backend (``controller/decorator.py``).

Errors raised inside a worker reach the driver as one :class:`WorkerError` naming the worker
class, the method, the rank and the node, with the worker's traceback; a worker process that
dies fails the call at once instead of leaving the others waiting in a collective.
"""

from __future__ import annotations

import enum
import logging
import os
import socket
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Any

from hybridrl.controller import cpu_threads
from hybridrl.controller.worker_group import WorkerGroup
from hybridrl.errors import UserError, is_user_error

logger = logging.getLogger(__name__)

ENV_PASSTHROUGH = (
    "HF_HUB_OFFLINE",
    "HF_HOME",
    "HYBRIDRL_CACHE",
    "HYBRIDRL_DEBUG",
    "HYBRIDRL_DIST_TIMEOUT_S",
    "HYBRIDRL_PG_TIMEOUT_S",
    "HYBRIDRL_CPU_MALLOC_REUSE",
    "TRANSFORMERS_OFFLINE",
    "PYTHONPATH",
    "CUDA_DEVICE_MAX_CONNECTIONS",
)


class WorkerError(RuntimeError):
    """A worker method failed (or its process died); the message names class, method, rank and node."""


class WorkerUserError(UserError, WorkerError):
    """A worker raised a :class:`~hybridrl.errors.UserError` (bad config, missing file, ...): the CLI
    prints its one-line message, plus where it was raised, without the traceback."""


class ResourceError(UserError, RuntimeError):
    """The cluster cannot hold the requested workers (too few CPUs/GPUs, or nodes)."""


class Role(enum.Enum):
    """What a worker group does; ResourcePoolManager maps each role to a resource pool. Every
    trained model (actor, reference, critic, reward model; SFT's and RM's model) is colocated in
    the ``ActorRolloutRef`` pool; ``Rollout`` is a rollout pool of its own (engines without an actor),
    ``Teacher`` the distillation teachers' pool of their own."""

    ActorRolloutRef = "actor_rollout_ref"
    Rollout = "rollout"
    Teacher = "teacher"


# ---------------------------------------------------------------- resources


class RayResourcePool:
    """``process_on_nodes[i]`` worker processes on node ``i``, each with ``cpus_per_worker``
    CPUs and, with ``use_gpu``, one GPU.

    The placement groups are created on first use and reserve the resources until
    :meth:`release`; ``max_colocate_count`` worker groups may share one pool (colocated roles
    share processes, so 1 is enough for them).
    """

    def __init__(
        self,
        process_on_nodes: list[int],
        use_gpu: bool = False,
        cpus_per_worker: int = 1,
        name_prefix: str = "hybridrl",
        max_colocate_count: int = 1,
    ) -> None:
        if not process_on_nodes or any(int(n) < 1 for n in process_on_nodes):
            raise ValueError(f"RayResourcePool: process_on_nodes={process_on_nodes} needs >= 1 process per node")
        self.process_on_nodes = [int(n) for n in process_on_nodes]
        self.use_gpu = use_gpu
        self.cpus_per_worker = int(cpus_per_worker)
        self.name_prefix = name_prefix
        self.max_colocate_count = max_colocate_count
        self._placement_groups = None

    @property
    def world_size(self) -> int:
        return sum(self.process_on_nodes)

    def bundle(self) -> dict[str, float]:
        resources = {"CPU": float(self.cpus_per_worker)}
        if self.use_gpu:
            resources["GPU"] = 1.0
        return resources

    def placement_groups(self, timeout_s: float = 120.0) -> list:
        """One STRICT_PACK placement group per node, created and waited for on first call.

        Raises:
            ResourceError: the groups cannot be placed within ``timeout_s``.
        """
        import ray
        from ray.util.placement_group import placement_group

        if self._placement_groups is None:
            tag = uuid.uuid4().hex[:8]  # names must be unique in the cluster
            groups = [
                placement_group([self.bundle()] * n, strategy="STRICT_PACK", name=f"{self.name_prefix}_{tag}_node{i}")
                for i, n in enumerate(self.process_on_nodes)
            ]
            ready, _ = ray.wait([pg.ready() for pg in groups], num_returns=len(groups), timeout=timeout_s)
            if len(ready) < len(groups):
                for pg in groups:
                    ray.util.remove_placement_group(pg)
                raise ResourceError(
                    f"could not reserve {self.process_on_nodes} worker processes with {self.bundle()} each "
                    f"within {timeout_s:.0f} s; the cluster has {ray.available_resources()}. Lower "
                    "trainer.n_gpus_per_node / trainer.nnodes / trainer.cpu_threads_per_worker, or add machines"
                )
            self._placement_groups = groups
        return self._placement_groups

    def release(self) -> None:
        import ray

        for pg in self._placement_groups or []:
            ray.util.remove_placement_group(pg)
        self._placement_groups = None


@dataclass
class ResourcePoolManager:
    """Pools by name (``{"global_pool": [n_per_node] * nnodes}``) and which role uses which pool."""

    resource_pool_spec: dict[str, list[int]]
    mapping: dict[Role, str]
    use_gpu: bool = False
    cpus_per_worker: int = 1
    resource_pool_dict: dict[str, RayResourcePool] = field(default_factory=dict)

    def create_resource_pool(self) -> None:
        """Checks the cluster has room for every pool, then makes them (colocated roles share one).

        Raises:
            ResourceError: the cluster has fewer CPUs/GPUs than the pools need.
        """
        self.check_resources()
        for name, process_on_nodes in self.resource_pool_spec.items():
            self.resource_pool_dict[name] = RayResourcePool(
                process_on_nodes,
                use_gpu=self.use_gpu,
                cpus_per_worker=self.cpus_per_worker,
                name_prefix=name,
                max_colocate_count=len([r for r, p in self.mapping.items() if p == name]),
            )

    def get_resource_pool(self, role: Role) -> RayResourcePool:
        return self.resource_pool_dict[self.mapping[role]]

    def check_resources(self) -> None:
        import ray

        total = ray.cluster_resources()
        workers = sum(sum(spec) for spec in self.resource_pool_spec.values())
        need = {"CPU": workers * self.cpus_per_worker}
        if self.use_gpu:
            need["GPU"] = workers
        for kind, amount in need.items():
            if total.get(kind, 0) < amount:
                raise ResourceError(
                    f"the Ray cluster has {total.get(kind, 0):g} {kind}s but {workers} workers need {amount:g} "
                    f"({self.resource_pool_spec}); lower trainer.n_gpus_per_node or trainer.nnodes"
                    + (" or trainer.cpu_threads_per_worker" if kind == "CPU" else "")
                    + ", or add machines"
                )


# ---------------------------------------------------------------- workers inside Ray actors


@dataclass
class RayClassWithInitArgs:
    """A worker class and the arguments to build it with, inside each host process."""

    cls: type
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    def __init__(self, cls: type, *args, **kwargs) -> None:
        self.cls, self.args, self.kwargs = cls, args, kwargs


@dataclass
class ColocatedWorkers:
    """Several roles built in the same processes: ``{"actor_rollout": RayClassWithInitArgs(...), ...}``."""

    class_dict: dict[str, RayClassWithInitArgs]


def create_colocated_worker_cls(class_dict: dict[str, RayClassWithInitArgs]) -> ColocatedWorkers:
    """verl's colocation entry point: pass the result to :class:`RayWorkerGroup`, then call
    ``spawn(prefix_set=class_dict.keys())`` for one worker group per role sharing the processes."""
    return ColocatedWorkers(dict(class_dict))


class _WorkerHost:
    """The Ray actor of one rank: holds one worker per role and runs their methods."""

    def __init__(self, env: dict[str, str]) -> None:
        os.environ.update(env)
        threads = env.get("OMP_NUM_THREADS")
        if threads:
            import torch

            torch.set_num_threads(int(threads))
        self.workers: dict[str, Any] = {}

    def master_address(self) -> tuple[str, int]:
        """This node's IP and a free TCP port, for the process-group rendezvous."""
        import ray

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def build(self, role: str, spec: RayClassWithInitArgs, env: dict[str, str]) -> int:
        os.environ.update(env)
        self.workers[role] = self._guard(role, "__init__", spec.cls, spec.args, spec.kwargs, spec.cls.__name__)
        return os.getpid()

    def call(self, role: str, method: str, args: tuple, kwargs: dict) -> Any:
        worker = self.workers[role]
        return self._guard(role, method, getattr(worker, method), args, kwargs, type(worker).__name__)

    @staticmethod
    def _guard(role, method, fn, args, kwargs, cls_name):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - re-raised with who/where, as one picklable error
            import ray

            rank = os.environ.get("RANK", "?")
            if is_user_error(exc):
                raise WorkerUserError(f"{exc} (in {cls_name}.{method}, rank {rank})") from None
            node = ray.util.get_node_ip_address()
            raise WorkerError(
                f"{cls_name}.{method} (role {role}) failed on rank {rank}, node {node}, pid {os.getpid()}: "
                f"{type(exc).__name__}: {exc}\n--- worker traceback ---\n{traceback.format_exc()}"
            ) from None


def _host_actor_cls():
    import ray

    return ray.remote(_WorkerHost)


class RayWorkerGroup(WorkerGroup):
    """``resource_pool.world_size`` ranks of a worker class (or of colocated classes) as Ray actors.

    Args:
        resource_pool: where the ranks go (one process per bundle).
        ray_cls_with_init: the worker class and its arguments, or a :class:`ColocatedWorkers`.
        cpu_threads_per_worker: torch/OpenMP threads in each process (CPU runs).
        name_prefix: Ray actor name prefix (for the dashboard).
        max_concurrency: calls a process runs at once, each in a thread of its own (Ray's
            threaded actors); 1 runs them one after the other. One-step-off-policy training uses 2,
            so that a prefetching generation runs beside the training calls.

    Raises:
        WorkerError: a worker's constructor failed on some rank.
    """

    def __init__(
        self,
        resource_pool: RayResourcePool,
        ray_cls_with_init,
        cpu_threads_per_worker: int = 1,
        name_prefix: str = "hybridrl",
        max_concurrency: int = 1,
        _hosts: list | None = None,
        _role: str | None = None,
    ) -> None:
        import ray

        self.resource_pool = resource_pool
        if isinstance(ray_cls_with_init, ColocatedWorkers):
            self._roles = dict(ray_cls_with_init.class_dict)
        else:
            self._roles = {"default": ray_cls_with_init}
        self._role = _role or next(iter(self._roles))
        super().__init__(self._roles[self._role].cls, world_size=resource_pool.world_size)
        if _hosts is not None:  # a spawned view of another group's processes
            self._hosts = _hosts
            return
        self._hosts = self._start_hosts(resource_pool, cpu_threads_per_worker, name_prefix, max_concurrency)
        try:
            host0_addr, port = ray.get(self._hosts[0].master_address.remote())
            rendezvous = {"MASTER_ADDR": host0_addr, "MASTER_PORT": str(port)}
            self.worker_pids = {}
            for role, spec in self._roles.items():  # all ranks build at once: constructors may rendezvous
                self.worker_pids[role] = self._wait([h.build.remote(role, spec, rendezvous) for h in self._hosts])
        except BaseException:
            self.shutdown()  # no half-built group keeps processes or reserved resources
            raise

    @staticmethod
    def _start_hosts(pool: RayResourcePool, threads: int, name_prefix: str, max_concurrency: int = 1) -> list:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        host_cls = _host_actor_cls()
        bundle = pool.bundle()
        # the Ray CPUs stay as configured; the threads not above the cores free at start-up, and
        # idle OpenMP threads sleep (set before the worker's torch loads: issue 33 item 7)
        omp_threads = cpu_threads.worker_threads(int(threads))
        hosts, rank = [], 0
        for pg, local_world in zip(pool.placement_groups(), pool.process_on_nodes):
            for local_rank in range(local_world):
                env = {key: os.environ[key] for key in ENV_PASSTHROUGH if key in os.environ}
                env.update(
                    RANK=str(rank),
                    WORLD_SIZE=str(pool.world_size),
                    LOCAL_RANK=str(local_rank),
                    LOCAL_WORLD_SIZE=str(local_world),
                    OMP_NUM_THREADS=str(omp_threads),
                    TOKENIZERS_PARALLELISM="false",
                    **cpu_threads.wait_policy_env(),
                )
                options = dict(
                    num_cpus=bundle["CPU"],
                    num_gpus=bundle.get("GPU", 0),
                    scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=local_rank),
                    name=f"{name_prefix}_{pool.name_prefix}_rank{rank}_{uuid.uuid4().hex[:8]}",
                    runtime_env={"env_vars": env},
                    max_concurrency=int(max_concurrency),
                )
                hosts.append(host_cls.options(**options).remote(env))
                rank += 1
        return hosts

    def spawn(self, prefix_set) -> dict[str, RayWorkerGroup]:
        """One worker group per colocated role, all running in this group's processes."""
        return {
            role: RayWorkerGroup(self.resource_pool, ColocatedWorkers(self._roles), _hosts=self._hosts, _role=role)
            for role in prefix_set
        }

    def _execute(self, method_name: str, per_rank_args: list, per_rank_kwargs: list):
        refs = [
            host.call.remote(self._role, method_name, a, k)
            for host, a, k in zip(self._hosts, per_rank_args, per_rank_kwargs)
        ]
        return self._wait(refs, method_name)

    def _wait(self, refs: list, method_name: str = "") -> list:
        """Results in rank order; the first failure is raised at once (the other ranks may be
        blocked in a collective with the failed one, so waiting for all of them could hang).

        Once one rank has answered, the others must answer within ``trainer.dist_timeout_s``
        (``HYBRIDRL_DIST_TIMEOUT_S``), the bound a collective would put on them: a rank that is
        hung or stopped outside any collective (e.g. while generating) then fails the call
        instead of holding the run forever."""
        import ray
        from ray.exceptions import RayActorError, RayError, RayTaskError

        pending = list(refs)
        timeout_s = float(os.environ.get("HYBRIDRL_DIST_TIMEOUT_S", 600))
        while pending:
            first = len(pending) == len(refs)
            done, pending = ray.wait(pending, num_returns=1, timeout=None if first else timeout_s)
            if not done:
                ranks = sorted(refs.index(ref) for ref in pending)
                raise WorkerError(
                    f"{self.worker_cls.__name__}.{method_name or 'call'}: rank(s) {ranks} gave no answer within "
                    f"trainer.dist_timeout_s={timeout_s:g} s of the other ranks (a hung or stopped worker process?); "
                    "raise trainer.dist_timeout_s if their share of the work is that much longer"
                )
            try:
                ray.get(done[0])
            except RayTaskError as exc:
                # A rank's collective fails ("connection closed by peer") when a peer process died:
                # the death is the cause to report, so give it a moment to surface.
                self._raise_if_a_rank_died(refs, pending)
                cause = getattr(exc, "cause", None)
                if isinstance(cause, WorkerError):
                    raise type(cause)(str(cause)) from None
                raise WorkerError(str(exc)) from None
            except RayActorError as exc:
                self._raise_died(refs.index(done[0]), exc)
            except RayError as exc:  # e.g. Ray's memory monitor killed the task
                rank = refs.index(done[0])
                first_line = str(exc).strip().splitlines()[0]
                raise WorkerError(
                    f"{self.worker_cls.__name__} call on rank {rank} failed in Ray: {first_line}"
                ) from None
        return ray.get(refs)

    def _raise_if_a_rank_died(self, refs: list, pending: list, grace_s: float = 3.0) -> None:
        """Raises the death of a pending rank that ends within ``grace_s`` seconds; returns otherwise."""
        import ray
        from ray.exceptions import RayActorError, RayError

        if not pending:
            return
        done, _ = ray.wait(pending, num_returns=len(pending), timeout=grace_s)
        for ref in done:
            try:
                ray.get(ref)
            except RayActorError as exc:
                self._raise_died(refs.index(ref), exc)
            except RayError:  # only a death outranks the error already in hand
                continue

    def _raise_died(self, rank: int, exc: Exception) -> None:
        raise WorkerError(
            f"{self.worker_cls.__name__} worker process of rank {rank} died: {exc}. The run cannot go on "
            "without it; look above for its last output (out of memory is a common cause)"
        ) from None

    def shutdown(self) -> None:
        """Kills the processes and frees the placement groups (also ends the spawned groups).
        Never raises: it runs while another error may be on its way to the user."""
        import ray

        if not ray.is_initialized():
            return
        for host in self._hosts:
            try:
                ray.kill(host)
            except Exception as exc:  # noqa: BLE001 - a host that is already gone
                logger.debug("ray.kill: %s", exc)
        try:
            self.resource_pool.release()
        except Exception as exc:  # noqa: BLE001
            logger.debug("releasing placement groups: %s", exc)
