"""Models that never exist whole: built on the meta device, sharded, then filled tensor by tensor.

A model of N parameters used to be read whole onto every rank (``from_pretrained``) and sharded
afterwards, so start-up needed the full model on each rank however many ranks shared it. Here a
model is built with its parameters on the meta device (no memory; buffers such as rotary
frequencies are real), optionally wrapped (LoRA) and sharded with FSDP2 while still empty, then
given memory for its own shard only (``to_empty``) and filled from the checkpoint one tensor at a
time: each rank reads its own slice of each tensor from the safetensors files (no communication).
The largest extra allocation is one slice of the largest tensor (the embedding), whatever the
model size.

The reverse direction is the same: :func:`iter_full_weights` yields a sharded model's tensors one
at a time, gathered (an all-gather per tensor), which is how a rollout engine's copy is filled and
refreshed without a full state dict in memory. Source: PyTorch FSDP2's meta-device
initialisation (``fully_shard`` then ``to_empty``), as torchtitan and verl load large models.
"""

from __future__ import annotations

import glob
import math
import os
from typing import Callable, Iterator

import torch

from hybridrl.errors import UserError

# peft's decorations of a wrapped model's parameter names (the checkpoint has the plain names)
_PEFT_PREFIX = "base_model.model."
_PEFT_INFIXES = (".base_layer", ".original_module", ".modules_to_save.default")
ADAPTER_MARKS = (".lora_A.", ".lora_B.", ".lora_embedding_A.", ".lora_embedding_B.")


class CheckpointWeightsError(UserError, ValueError):
    """A model folder whose weights cannot fill the model: a parameter the files lack."""


def empty_model(build: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """``build()`` with every parameter on the meta device and every buffer real (on the CPU).

    Buffers stay real because most are computed at construction and never saved (rotary
    frequencies): a meta buffer would have no way back to its value. ``build`` is e.g.
    ``lambda: AutoModelForCausalLM.from_config(config, dtype=...)``.
    """
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        model = build()
    if hasattr(model, "tie_weights"):  # the context re-creates each registered parameter: ties break
        model.tie_weights()
    return model


def materialize(
    module: torch.nn.Module, device: str | torch.device, shard: Callable[[torch.nn.Module], object] | None = None
) -> torch.nn.Module:
    """Gives the meta parameters of ``module`` (from :func:`empty_model`) memory on ``device``:
    after ``shard`` (FSDP2's ``fully_shard``) only this rank's shard. Parameter values are
    undefined until loaded (:func:`load_weights`); buffers keep their values.

    Returns ``module``, now on ``device``.
    """
    buffers = {name: buf.detach().clone() for name, buf in module.named_buffers()}
    if shard is not None:
        shard(module)
    module.to_empty(device=device)
    if hasattr(module, "tie_weights"):  # to_empty gives each module its own new parameter: tie again
        module.tie_weights()
    with torch.no_grad():
        for name, buf in module.named_buffers():
            if name in buffers:
                buf.copy_(buffers[name])
    return module


def checkpoint_name(param_name: str) -> str:
    """The name a parameter has in an HF checkpoint: ``param_name`` without peft's decorations
    (``base_model.model.``, ``.base_layer``, ``.original_module``, ``.modules_to_save.default``)."""
    name = param_name.removeprefix(_PEFT_PREFIX)
    for infix in _PEFT_INFIXES:
        name = name.replace(infix + ".", ".")
    return name


def is_adapter_param(param_name: str) -> bool:
    """Whether ``param_name`` is a LoRA adapter's (never in a base checkpoint)."""
    return any(mark in param_name for mark in ADAPTER_MARKS)


def weight_files(folder: str) -> list[str]:
    """The safetensors files of an HF model folder (one file, or the shards an index lists).

    Raises:
        FileNotFoundError: the folder has no ``*.safetensors`` file.
    """
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise FileNotFoundError(
            f"no *.safetensors file in {folder} (hybridrl reads safetensors weights only: "
            "save the model with save_pretrained(safe_serialization=True))"
        )
    return files


def _local_region(target: torch.Tensor, global_shape) -> tuple[slice, ...] | None:
    """The index of this rank's shard of a DTensor ``target`` in its whole tensor; None for a plain tensor."""
    if not hasattr(target, "device_mesh"):
        return None
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(tuple(global_shape), target.device_mesh, target.placements)
    return tuple(slice(start, start + size) for size, start in zip(shape, offset))


@torch.no_grad()
def write_full_tensor(target: torch.Tensor, full: torch.Tensor) -> None:
    """Copies a whole tensor into ``target``: a plain tensor, or this rank's shard of a DTensor
    (a view of the slice is copied: no communication, no second full-size tensor); the copy
    casts to ``target``'s dtype and device on the fly."""
    region = _local_region(target, full.shape)
    if region is None:
        target.copy_(full)
    else:
        target.to_local().copy_(full[region])


@torch.no_grad()
def _read_into(target: torch.Tensor, handle, key: str) -> None:
    """``target`` <- tensor ``key`` of an open safetensors file: only this rank's slice is read
    for a DTensor shard, the whole tensor for a plain one (cast on the fly)."""
    part = handle.get_slice(key)
    region = _local_region(target, part.get_shape())
    if region is None:
        target.copy_(handle.get_tensor(key))
    else:
        target.to_local().copy_(part[region])


def _prefix_variants(name: str, prefix: str) -> tuple[str, ...]:
    """``name`` as is, with and without the model's ``base_model_prefix`` (a backbone-only
    checkpoint lacks it; a causal-LM checkpoint loaded into a value model has it)."""
    if not prefix:
        return (name,)
    stripped = name.removeprefix(prefix + ".")
    return (name, stripped) if stripped != name else (name, f"{prefix}.{name}")


def load_weights(module: torch.nn.Module, folder: str, base_model_prefix: str = "") -> set[str]:
    """Fills ``module``'s parameters and persistent buffers from the safetensors files of
    ``folder``, one tensor at a time; a sharded parameter reads only its own slice.

    Checkpoint tensors the module lacks (a causal LM's ``lm_head`` in a value model) are skipped.

    Returns:
        the names (as ``module.named_parameters`` gives them) of the parameters that no tensor
        of the checkpoint filled (heads and adapters the checkpoint cannot have).
    """
    from safetensors import safe_open

    targets: dict[str, list[torch.Tensor]] = {}
    for name, tensor in list(module.named_parameters()) + _persistent_buffers(module):
        targets.setdefault(checkpoint_name(name), []).append(tensor)
    filled: set[str] = set()
    for path in weight_files(folder):
        with safe_open(path, framework="pt") as f:
            keys = list(f.keys())
        for key in keys:
            match = next((n for n in _prefix_variants(key, base_model_prefix) if n in targets), None)
            if match is None:
                continue
            # reopened per tensor: the mapped pages of the tensors already read leave the RSS
            with safe_open(path, framework="pt") as f:
                for target in targets[match]:
                    _read_into(target, f, key)
            filled.add(match)
    return {name for name, _ in module.named_parameters() if checkpoint_name(name) not in filled}


def _persistent_buffers(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    out = []
    for prefix, sub in module.named_modules():
        for name, buf in sub.named_buffers(recurse=False):
            if buf is not None and name not in sub._non_persistent_buffers_set:
                out.append((f"{prefix}.{name}" if prefix else name, buf))
    return out


@torch.no_grad()
def init_adapter_params(module: torch.nn.Module, names: set[str], seed: int = 0) -> set[str]:
    """Initialises the LoRA adapter parameters among ``names`` as peft does by default
    (``lora_A``: Kaiming-uniform with ``a=sqrt(5)``, ``lora_B``: zeros, so the adapted model starts
    equal to its base), drawing each whole tensor from a generator seeded by ``seed`` and the
    parameter's name: every rank and every world size gets the same adapter.

    Returns the names among ``names`` that are not adapter parameters.
    """
    params = dict(module.named_parameters())
    rest = set()
    for name in sorted(names):
        if not is_adapter_param(name):
            rest.add(name)
            continue
        param = params[name]
        full = torch.zeros(param.shape, dtype=torch.float32)
        if "_A." in name:
            fan_in = param.shape[1]
            bound = math.sqrt(6.0 / ((1 + 5) * fan_in))  # kaiming_uniform_(a=sqrt(5)): gain^2 = 2 / (1 + a^2)
            gen = torch.Generator().manual_seed(seed * 1_000_003 + _stable_hash(checkpoint_name(name)))
            full.uniform_(-bound, bound, generator=gen)
        write_full_tensor(param, full)
    return rest


def _stable_hash(text: str) -> int:
    """A hash of ``text`` that is the same in every process (``hash()`` is salted per process)."""
    import zlib

    return zlib.crc32(text.encode())


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of an FSDP2 shard (an all-gather: a collective), or the tensor itself."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def iter_full_weights(
    module: torch.nn.Module, skip_adapters: bool = True, dtype: torch.dtype | None = None, gather: bool = True
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(checkpoint name, whole tensor)`` of every entry of the state dict, one at a time: a
    sharded tensor is all-gathered just before it is yielded, so the peak is one tensor, not a
    state dict. A collective on a sharded module: every rank must consume it in full. Tied
    weights come under each of their names (an engine may refresh a layer only when named).
    LoRA adapter parameters are left out (``skip_adapters``): the names are the base model's.
    ``dtype``: floating-point shards are cast before the gather (half the traffic and memory of
    an fp32 gather when the receiver computes in bf16). ``gather=False`` yields the shards
    (DTensors) as they are, for :func:`copy_weights` to gather straight into its tensors."""
    for name, tensor in module.state_dict(keep_vars=True).items():
        if skip_adapters and is_adapter_param(name):
            continue
        tensor = tensor.detach()
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        yield checkpoint_name(name), full_tensor(tensor) if gather else tensor


@torch.no_grad()
def gather_into(target: torch.Tensor, source: torch.Tensor) -> None:
    """``target`` (a whole, plain tensor) <- ``source`` (a whole tensor, or a DTensor shard of one),
    cast on the fly. A dim-0 shard over a 1-D mesh that splits evenly is all-gathered straight
    into ``target`` (no full-size temporary); other layouts gather a full tensor first. A
    collective for a DTensor: every rank of its mesh calls it."""
    if not hasattr(source, "device_mesh"):
        target.copy_(source)
        return
    import torch.distributed as dist

    mesh, placements = source.device_mesh, source.placements
    world = mesh.size()
    if (
        mesh.ndim == 1
        and placements[0].is_shard(0)
        and target.is_contiguous()
        and target.dim() > 0
        and target.shape[0] % world == 0
        and source.to_local().shape[0] == target.shape[0] // world
    ):
        dist.all_gather_into_tensor(target, source.to_local().to(target.dtype).contiguous(), group=mesh.get_group())
    else:
        target.copy_(source.full_tensor())


@torch.no_grad()
def copy_weights(target: torch.nn.Module, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
    """Copies ``(name, tensor)`` pairs into the plain module ``target`` (cast to its dtypes); a
    DTensor shard is gathered straight into the target tensor (:func:`gather_into`).

    Raises:
        KeyError: a name ``target`` does not have.
    """
    own = target.state_dict(keep_vars=True)
    for name, tensor in weights:
        if name not in own:
            raise KeyError(f"weight copy: the target model has no {name!r}")
        gather_into(own[name].data, tensor)
