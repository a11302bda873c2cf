"""How weights reach a vLLM engine of its own process as files: bucket-sized safetensors files in a
folder in RAM (``/dev/shm`` where there is one) that the engine reloads in place.

This is the async engine's transport on the CPU, and on CUDA when ``HYBRIDRL_ASYNC_WEIGHTS_DIR``
names a folder (else CUDA IPC serves there, :mod:`.cuda_ipc`). A bucket holds whole decoder layers, at most
``rollout.checkpoint_engine.update_weights_bucket_megabytes``; one bucket is in RAM at a time, and
its file leaves RAM once the engine has read it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator

import torch

from hybridrl.workers.rollout.base import RolloutEngineError

WEIGHTS_FILE = "model.safetensors"
FOLDER_PREFIX = "hybridrl-vllm-async-"
WEIGHTS_DIR_ENV = "HYBRIDRL_ASYNC_WEIGHTS_DIR"  # a folder of the user's choice for the weights file
BUCKET_KEY = "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"


def bucket_bytes(config) -> int:
    """The weight-sync bucket of a rollout section, in bytes (verl's MB are MiB); an engine section
    without the key (the judge's, ``hybridrl gen``'s) loads its weights in one bucket."""
    engine = getattr(config, "checkpoint_engine", None)
    megabytes = getattr(engine, "update_weights_bucket_megabytes", None)
    return int(megabytes) * 2**20 if megabytes else 2**62


_LAYER_WHOLE = " (a layer's tensors go in one: vLLM fuses q/k/v and gate/up)"
_LAYER = re.compile(r"^(.*\.layers\.\d+)\.")


def weight_buckets(
    pairs: Iterable[tuple[str, torch.Tensor]], limit_bytes: int, dtype: torch.dtype
) -> Iterator[dict[str, torch.Tensor]]:
    """``(name, tensor)`` pairs grouped in order into dicts of at most ``limit_bytes`` (sized in the
    engine's ``dtype``), a decoder layer's tensors (``*.layers.<i>.*``) always in one bucket: vLLM
    fuses q/k/v and gate/up as it loads them, and a reload that brings part of a fused group
    leaves the rest of it wrong (measured: log-probs off by 45 nats). A bucket is yielded before
    the next layer is taken, so a lazy ``pairs`` (gathered shards) holds one bucket at a time.

    Raises:
        RolloutEngineError: a layer or tensor larger than ``limit_bytes``, naming it and
            ``rollout.checkpoint_engine.update_weights_bucket_megabytes``.
    """
    itemsize = torch.empty((), dtype=dtype).element_size()
    bucket: dict[str, torch.Tensor] = {}
    size = 0
    for unit_name, group in itertools.groupby(pairs, key=lambda pair: _unit(pair[0])):
        unit = dict(group)
        unit_size = sum(t.numel() for t in unit.values()) * itemsize
        if unit_size > limit_bytes:
            raise RolloutEngineError(
                f"{BUCKET_KEY}={limit_bytes // 2**20}: {unit_name} takes {unit_size / 2**20:.1f} MB, more than "
                f"a bucket{_LAYER_WHOLE if len(unit) > 1 else ''}; raise it to at least {-(-unit_size // 2**20)}"
            )
        if bucket and size + unit_size > limit_bytes:
            yield bucket
            bucket, size = {}, 0
        bucket.update(unit)
        size += unit_size
    if bucket:
        yield bucket


def _unit(name: str) -> str:
    """The decoder layer a parameter belongs to (``model.layers.3``), or the name itself."""
    match = _LAYER.match(name)
    return match.group(1) if match else name


def ram_dir() -> str | None:
    """The folder for the weights handed to the engine: ``$HYBRIDRL_ASYNC_WEIGHTS_DIR`` when set,
    else ``/dev/shm`` (in RAM) where there is one, else None (the default temp dir)."""
    if os.environ.get(WEIGHTS_DIR_ENV):
        return os.environ[WEIGHTS_DIR_ENV]
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def check_room_for_weights(folder: str, needed_bytes: int) -> None:
    """Raises a one-line :class:`RolloutEngineError` when ``folder`` has less than ``needed_bytes``
    free: Docker gives a container a 64 MB ``/dev/shm`` unless told otherwise, and a weights file
    that does not fit would die half-written (a bus error or ENOSPC deep in safetensors)."""
    free = shutil.disk_usage(folder).free
    if needed_bytes <= free:
        return
    mib = 2**20
    raise RolloutEngineError(
        f"rollout.mode=async hands the weights to the vLLM engine as a file in {folder}: it needs "
        f"{needed_bytes / mib:.0f} MiB there and {free / mib:.0f} MiB is free; give it more room (in Docker: "
        f"docker run --shm-size=<weights x 2, e.g. 16g>), or set {WEIGHTS_DIR_ENV} to a folder with room"
    )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def sweep_orphan_folders(parent: str | None) -> list[str]:
    """Removes the engine folders (``<parent>/hybridrl-vllm-async-<pid>-*``) whose process is gone: a
    killed worker never reaches ``close()``, and its folder would stay in RAM (with the weights
    file, if it died mid-load). Returns the removed paths."""
    parent = parent or tempfile.gettempdir()
    removed = []
    for name in os.listdir(parent):
        owner = name[len(FOLDER_PREFIX) :].split("-", 1)[0] if name.startswith(FOLDER_PREFIX) else ""
        if owner.isdigit() and not _pid_alive(int(owner)):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
            removed.append(os.path.join(parent, name))
    return removed


def write_weights_file(
    folder: str, state: dict[str, torch.Tensor], dtype: torch.dtype, filename: str = WEIGHTS_FILE
) -> None:
    """``state`` in ``dtype`` as the safetensors file ``filename`` of ``folder``, written atomically.

    Tied tensors (one storage under two names, e.g. ``lm_head`` and ``embed_tokens``) are
    written under both names, the second as a copy (safetensors stores no shared tensors):
    vLLM refreshes the CPU kernels' packed copy of a layer only when the reload names it
    (measured: without ``lm_head.weight`` the output layer kept its old weights).

    Raises:
        RolloutEngineError: ``folder`` has no room for the file (:func:`check_room_for_weights`).
    """
    from safetensors.torch import save_file

    itemsize = torch.empty((), dtype=dtype).element_size()
    check_room_for_weights(folder, sum(t.numel() for t in state.values()) * itemsize + 2**20)
    seen, tensors = set(), {}
    for name, tensor in state.items():
        tensor = tensor.detach().to(device="cpu", dtype=dtype).contiguous()
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        tensors[name] = tensor.clone() if key in seen else tensor
        seen.add(key)
    path = os.path.join(folder, filename)
    save_file(tensors, path + ".tmp", metadata={"format": "pt"})
    os.replace(path + ".tmp", path)


def drop_weight_files(folder: str) -> None:
    """The engine has read the weights: their files leave RAM at once. (The folder goes when the
    rollout is shut down or collected; the folder of a process killed before that is removed by
    the next engine's start, :func:`sweep_orphan_folders`.)"""
    for name in os.listdir(folder):
        if name.endswith(".safetensors"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(folder, name))
