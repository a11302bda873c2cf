"""FSDP2 for the workers: sharding a model over the worker group, and the few operations that
differ between a sharded and a whole model (gradient-norm clipping, optimizer offload; a
sharded model's whole tensors stream from :mod:`hybridrl.models.materialize`).

A worker group of one keeps the plain module: there is nothing to shard, and the code below
then reduces to the ordinary torch calls, so the local backend and the Ray backend run the
same worker code. Source: PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``), per-parameter
sharding on DTensors; hybrid sharding (HSDP) with a 2-D device mesh as in verl's ``fsdp_size``.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.distributed as dist

from hybridrl.models import to_torch_dtype
from hybridrl.workers.config.fsdp import cpu_offload
from hybridrl.workers.memory import release_cached_memory


def is_sharded(module: torch.nn.Module) -> bool:
    """Whether ``module`` was wrapped by :func:`apply_fsdp2`."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def build_device_mesh(world_size: int, fsdp_size: int, device_type: str):
    """A 1-D mesh (full sharding) or, with ``1 < fsdp_size < world_size``, a 2-D
    ``("ddp", "fsdp")`` mesh: parameters sharded within groups of ``fsdp_size`` ranks and
    replicated across groups (hybrid sharding, less communication between machines).

    Raises:
        ValueError: ``fsdp_size`` does not divide the world size.
    """
    from torch.distributed.device_mesh import init_device_mesh

    if fsdp_size is None or fsdp_size <= 0 or fsdp_size >= world_size:
        return init_device_mesh(device_type, (world_size,), mesh_dim_names=("fsdp",))
    if world_size % fsdp_size:
        raise ValueError(f"fsdp_config.fsdp_size={fsdp_size} must divide the number of workers ({world_size})")
    return init_device_mesh(device_type, (world_size // fsdp_size, fsdp_size), mesh_dim_names=("ddp", "fsdp"))


def _decoder_layers(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks: the modules named by ``_no_split_modules`` (HF's own list of
    blocks that must stay whole), the natural FSDP units."""
    names = set(getattr(module, "_no_split_modules", None) or [])
    return [m for m in module.modules() if type(m).__name__ in names]


def apply_fsdp2(
    module: torch.nn.Module,
    device_type: str,
    *,
    fsdp_size: int = -1,
    reshard_after_forward: bool = True,
    param_offload: bool = False,
    param_dtype="fp32",
    reduce_dtype="fp32",
    world_size: int | None = None,
) -> torch.nn.Module:
    """Shards ``module`` in place with FSDP2: every decoder block, then the root.

    Args:
        module: an HF model on ``device_type`` (fp32 master weights for a trained model).
        device_type: ``cpu`` or ``cuda``.
        fsdp_size: workers per shard group (-1: all of them); must divide the world size.
        reshard_after_forward: free the gathered parameters after the forward (less memory,
            one more all-gather in backward).
        param_offload: parameters on CPU between uses (CUDA only; FSDP2's ``CPUOffloadPolicy``,
            with one worker too: a group of one is started when there is none).
        param_dtype: the forward's compute dtype (a name or a torch dtype).
        reduce_dtype: the dtype gradients are reduced in (fp32 keeps the update exact; a
            forward-only model never reduces).
        world_size: workers in the group; None: the default process group's.

    Returns:
        the same module, now an ``FSDPModule`` whose parameters are DTensors.

    Raises:
        ValueError: ``fsdp_size`` does not divide the world size.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    if not dist.is_initialized():  # one worker (CPU offload on CUDA): FSDP2 over a group of one
        dist.init_process_group(
            "nccl" if device_type == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1
        )
    world_size = world_size or dist.get_world_size()
    mesh = build_device_mesh(world_size, fsdp_size, device_type)
    policy = MixedPrecisionPolicy(
        param_dtype=to_torch_dtype(param_dtype), reduce_dtype=to_torch_dtype(reduce_dtype), cast_forward_inputs=True
    )
    kwargs = {"mesh": mesh, "mp_policy": policy, "reshard_after_forward": reshard_after_forward}
    if param_offload and device_type == "cuda":
        kwargs["offload_policy"] = CPUOffloadPolicy()
    for layer in _decoder_layers(module):
        fully_shard(layer, **kwargs)
    fully_shard(module, **kwargs)
    return module


def clip_grad_norm(module: torch.nn.Module, max_norm: float) -> float:
    """``torch.nn.utils.clip_grad_norm_`` for plain and sharded modules; returns the total norm
    of the whole model's gradient (the same number on every rank)."""
    params = [p for p in module.parameters() if p.grad is not None]
    if not params:
        return 0.0
    total = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if hasattr(total, "full_tensor"):  # a DTensor: the local shard's norm is partial
        total = total.full_tensor()
    return float(total)


def data_parallel_sum(value: float, device: str) -> float:
    """Sum of ``value`` over the worker group (the value itself with one worker)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    tensor = torch.tensor([float(value)], dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return float(tensor.item())


def offload_optimizer(optimizer: torch.optim.Optimizer, device: str) -> None:
    """Moves the optimizer state (Adam moments) to ``device`` ("cpu" to free accelerator memory
    between updates, the worker's device before the next step); ``fsdp_config.optimizer_offload``.

    The copies are asynchronous (``non_blocking``); a copy to the CPU ends with a
    ``torch.cuda.synchronize()``, so nothing (a checkpoint, the next step) reads a CPU tensor
    whose bytes are still on their way."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step":
                state[key] = value.to(device, non_blocking=True)
    if str(device) == "cpu" and torch.cuda.is_available():
        torch.cuda.synchronize()


def loss_normalizers(mini_batch_response_mask: torch.Tensor, loss_scale_factor=None, sp_size: int = 1) -> dict:
    """``dp_size``, ``batch_num_tokens``, ``global_batch_size`` (and ``loss_scale_factor``) for
    :func:`agg_loss` on one rank's share of a mini batch, such that data-parallel training equals
    one worker on the whole mini batch.

    The counts are the whole mini batch's, summed over the ``W`` ranks; each rank's loss is
    ``W * sum_local / N_global`` and FSDP averages gradients over the ranks, so the update is
    ``sum_all / N_global``: the token (or sequence) mean of the whole mini batch, however the
    tokens fall on ranks and micro batches.

    With sequence parallelism (``sp_size`` = S > 1) every rank holds its SP group's rows
    (``hybridrl.workers.sequence_parallel.gather_rows``), so the sum over ``W`` ranks counts each
    row ``S`` times and is divided by ``S``; the data-parallel size is ``W / S`` groups. Each of
    the ``S`` ranks computes the same group loss ``(W / S) * sum_group / N_global``; the gathered
    outputs' backward scales by ``S`` (``hybridrl.models.ulysses.gather_outputs``), so FSDP's
    average over ``W`` ranks is again ``sum_all / N_global``.
    """
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    device = mini_batch_response_mask.device.type
    tokens = data_parallel_sum(float(mini_batch_response_mask.sum().item()), device) / sp_size
    sequences = data_parallel_sum(float((mini_batch_response_mask.sum(-1) > 0).sum().item()), device) / sp_size
    world //= sp_size
    # a mini batch whose every token was rejected (rollout correction) has a zero loss, not an error
    tokens, sequences = max(tokens, 1.0), max(sequences, 1.0)
    return {
        "dp_size": world,
        "batch_num_tokens": tokens,
        "global_batch_size": sequences,
        "loss_scale_factor": loss_scale_factor,
    }


@contextlib.contextmanager
def optimizer_on_device(optimizer: torch.optim.Optimizer, device: str, offload: bool):
    """With ``offload`` (``fsdp_config.optimizer_offload``) on CUDA: the optimizer state lives on
    the CPU except during the update, and the blocks it held go back to the driver after it
    (:func:`~hybridrl.workers.memory.release_cached_memory`). A no-op on CPU, where it already lives."""
    if not offload or device == "cpu":
        yield
        return
    offload_optimizer(optimizer, device)
    try:
        yield
    finally:
        offload_optimizer(optimizer, "cpu")
        release_cached_memory(device)


def needs_fsdp(world_size: int, device: str, fsdp_config) -> bool:
    """Whether a role is wrapped with FSDP2: with more than one worker (sharding), and with one
    worker on CUDA when ``param_offload`` (or verl's ``offload_policy``) asks for FSDP2's CPU offload
    (as verl, at any world size)."""
    return world_size > 1 or (device == "cuda" and cpu_offload(fsdp_config))


def sharder(world_size: int, device: str, fsdp_config, reduce_dtype: str = "fp32"):
    """The ``shard`` a model loader applies to a role's empty model (:func:`shard_module` with the
    role's ``fsdp_config``), or None when the role stays a plain module (:func:`needs_fsdp`)."""
    if not needs_fsdp(world_size, device, fsdp_config):
        return None
    return functools.partial(shard_module, fsdp_config=fsdp_config, device=device, reduce_dtype=reduce_dtype)


def shard_module(module, fsdp_config, device: str, reduce_dtype: str = "fp32"):
    """FSDP2-shards ``module`` over the worker group with the role's typed ``fsdp_config``
    (``hybridrl.workers.config.FSDPConfig``); ``reduce_dtype``: a trained role's
    ``mixed_precision.reduce_dtype`` (forward-only roles never reduce gradients)."""
    return apply_fsdp2(
        module,
        device,
        fsdp_size=fsdp_config.fsdp_size,
        reshard_after_forward=fsdp_config.reshard_after_forward,
        param_offload=cpu_offload(fsdp_config),
        param_dtype=fsdp_config.mixed_precision.param_dtype,
        reduce_dtype=reduce_dtype,
    )


def load_options(model_cfg, device: str, world_size: int, fsdp_config, reduce_dtype: str = "fp32") -> dict:
    """``load_causal_lm`` options of a role: the ``model`` section's, on ``device``, sharded over
    the worker's group of ``world_size`` with the role's ``fsdp_config`` (:func:`sharder`)."""
    return {
        "trust_remote_code": model_cfg.trust_remote_code,
        "override_config": model_cfg.override_config,
        "device": device,
        "shard": sharder(world_size, device, fsdp_config, reduce_dtype),
    }
