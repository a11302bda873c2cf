"""Sequence-parallel (Ulysses) groups of workers, and the rows each group works on.

The driver splits a batch over all ``W`` workers (``Dispatch.DP_COMPUTE_PROTO``), as without
sequence parallelism. With ``ulysses_sequence_parallel_size = S`` the workers form ``W / S`` groups
of ``S`` consecutive ranks. Inside a worker, the ``S`` ranks of a group all-gather their rows
(:func:`gather_rows`), so that each works on the group's union of rows, in the same order; the
model forward splits every packed row of a micro batch over the group
(:mod:`hybridrl.models.ulysses`), and each rank returns only its own rows' results
(:func:`own_rows`). The data-parallel size of the loss normalisation is then ``W / S``
(``hybridrl.workers.sharding.loss_normalizers``). No dispatch mode changes.

Source: DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv:2309.14509); verl gives each SP group the
same rows by its dispatch instead.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from hybridrl.errors import ConfigError
from hybridrl.models.ulysses import UlyssesGroup, model_config_problem
from hybridrl.protocol import DataProto

logger = logging.getLogger(__name__)

_GROUPS: dict[tuple[int, int], UlyssesGroup] = {}


def sequence_parallel_group(size: int, key: str) -> UlyssesGroup | None:
    """This rank's SP group of ``size`` consecutive ranks (None for ``size`` 1).

    A collective the first time a size is asked for: every rank of the default process group
    must call it, in the same order (``init_model`` does); later calls return the same group.

    Args:
        size: ``ulysses_sequence_parallel_size``.
        key: its config key, for messages.

    Raises:
        ConfigError: ``size`` < 1, or it does not divide the number of workers.
    """
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if size < 1 or world % size:
        raise ConfigError(f"{key}={size} must be >= 1 and divide the number of workers ({world})")
    if size == 1:
        return None
    if (size, world) not in _GROUPS:
        rank = dist.get_rank()
        mine = None
        for start in range(0, world, size):  # every rank creates every group, in the same order
            group = dist.new_group(list(range(start, start + size)))
            if start <= rank < start + size:
                mine = UlyssesGroup(group=group, size=size, rank=rank - start)
        _GROUPS[(size, world)] = mine
        if rank == 0:
            logger.info("sequence parallelism (Ulysses): %d groups of %d workers", world // size, size)
    return _GROUPS[(size, world)]


def gather_rows(data: DataProto, sp: UlyssesGroup | None) -> DataProto:
    """The rows of every rank of the SP group, rank after rank (tensors only; ``meta_info`` kept).

    Args:
        data: this rank's ``n`` rows; every rank of the group must hold the same number of rows
            with the same tensor keys and shapes (the dispatch gives equal chunks).

    Returns:
        ``S * n`` rows, the same on every rank of the group; ``data`` itself without a group.

    Raises:
        RuntimeError: the ranks hold different numbers of rows.
    """
    if sp is None:
        return data
    n = torch.tensor([len(data)], device=_device(data))
    counts = [torch.zeros_like(n) for _ in range(sp.size)]
    dist.all_gather(counts, n, group=sp.group)
    if any(int(c) != len(data) for c in counts):
        raise RuntimeError(
            f"sequence parallelism: the ranks of a group hold {[int(c) for c in counts]} rows; "
            "they must hold the same number"
        )
    tensors = {}
    for key, value in data.batch.items():
        parts = [torch.empty_like(value) for _ in range(sp.size)]
        dist.all_gather(parts, value.contiguous(), group=sp.group)
        tensors[key] = torch.cat(parts)
    return DataProto.from_dict(tensors=tensors, meta_info=dict(data.meta_info))


def own_rows(values: torch.Tensor, sp: UlyssesGroup | None) -> torch.Tensor:
    """This rank's rows of a result over :func:`gather_rows`' ``S * n`` rows: ``(n, ...)``."""
    if sp is None:
        return values
    n = values.shape[0] // sp.size
    return values[sp.rank * n : (sp.rank + 1) * n]


def _device(data: DataProto) -> torch.device:
    return next(iter(data.batch.values())).device


def check_sequence_parallel(config, world_size: int, uses_critic: bool) -> list[str]:
    """The start-up rules of ``ulysses_sequence_parallel_size`` (actor, reference, critic) on the
    typed PPO config; called by ``hybridrl.trainer.ppo.config_check``.

    Returns:
        a note saying sequence parallelism is on (and how the workers are grouped), or nothing.

    Raises:
        ConfigError: one line: the reference's size differs from the actor's; a size does not
            divide ``world_size``; SP with ``use_remove_padding=false``; a model (read from its
            ``config.json``) whose attention heads the size cannot split, or whose attention cannot
            be split at all.
    """
    actor, ref = config.actor_rollout_ref.actor, config.actor_rollout_ref.ref
    key = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
    if ref.ulysses_sequence_parallel_size != actor.ulysses_sequence_parallel_size:
        raise ConfigError(
            f"actor_rollout_ref.ref.ulysses_sequence_parallel_size={ref.ulysses_sequence_parallel_size} "
            f"must equal {key}={actor.ulysses_sequence_parallel_size}: the reference runs in the "
            "actor's workers, on the same groups; remove the ref's key"
        )
    roles = [(key, actor.ulysses_sequence_parallel_size, "actor_rollout_ref.model", config.actor_rollout_ref.model)]
    if uses_critic:
        roles.append(
            (
                "critic.ulysses_sequence_parallel_size",
                config.critic.ulysses_sequence_parallel_size,
                "critic.model",
                config.critic.model,
            )
        )
    notes = []
    for key, size, model_key, model in roles:
        if size == 1:
            continue
        if world_size % size:
            raise ConfigError(
                f"{key}={size} must divide the number of workers ({world_size}: trainer.nnodes x "
                "trainer.n_gpus_per_node); pick a divisor or change the worker count"
            )
        if not model.use_remove_padding:
            raise ConfigError(f"{key}={size} splits packed sequences: it needs {model_key}.use_remove_padding=true")
        problem = model_config_problem(model.path, size)
        if problem:
            raise ConfigError(
                f"{key}={size}: {problem} ({model_key}.path={model.path}); set a size that does, or {key}=1"
            )
        notes.append(
            f"{key}={size}: Ulysses sequence parallelism on; {world_size} workers form "
            f"{world_size // size} group(s) of {size}, each splitting every packed sequence over its workers"
        )
    return notes
