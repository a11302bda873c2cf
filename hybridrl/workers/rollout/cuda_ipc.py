"""How weights reach a vLLM engine of its own process on the trainer's GPU: CUDA IPC handles,
through vLLM's weight-transfer API (backend ``ipc``, packed), the way verl's engines take them.

The trainer copies its weights, in the engine's dtype, into one GPU buffer of at most a bucket
(``rollout.checkpoint_engine.update_weights_bucket_megabytes``) and sends the engine a handle to
it; the engine's worker opens the buffer on the same device, clones each tensor out of it and
loads it (vLLM's layerwise reload fuses q/k/v and gate/up once a layer's tensors are all in, so a
layer may span buckets). The next bucket overwrites the buffer only after the engine has answered
for this one. Nothing passes through a file: Docker's 64 MB ``/dev/shm`` does not matter, and the
cost is one bucket of GPU memory in the trainer's process while a sync runs.

An engine spanning a TP group's GPUs (``tensor_model_parallel_size`` T > 1,
:mod:`.tp_group`) takes the bucket from all T of them: every rank of the group has gathered the
same whole tensors, packs them into a buffer on its own GPU, and the ranks' handles are merged by
GPU (vLLM's handles map a GPU's UUID to its copy), so each of the engine's T workers opens the copy
on its own GPU. The ranks then learn together whether the engine took the bucket
(:func:`share_outcome`) before any of them overwrites its buffer. A run that names a folder for the
weights (``HYBRIDRL_ASYNC_WEIGHTS_DIR``) takes the files of :mod:`.weight_files` instead.
"""

from __future__ import annotations

import base64
import os
import pickle
from collections.abc import Iterable, Iterator

import torch
import torch.distributed as dist

from hybridrl.workers.rollout.base import RolloutEngineError
from hybridrl.workers.rollout.weight_files import BUCKET_KEY, WEIGHTS_DIR_ENV

ENGINE_KWARGS = {"weight_transfer_config": {"backend": "ipc"}}
INIT_INFO = {"packed": True}  # one reusable buffer, not one IPC allocation per tensor
# The handles hold torch classes, so they travel pickled; only the engine process (spawned by
# this one, on a local socket) is allowed to read pickles, this process never reads any.
ENGINE_ENV = {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}


def serves(device: torch.device) -> bool:
    """Whether the weights go to the engine by CUDA IPC: a rollout on CUDA, unless
    ``HYBRIDRL_ASYNC_WEIGHTS_DIR`` asks for files."""
    return device.type == "cuda" and not os.environ.get(WEIGHTS_DIR_ENV)


def buffer_bytes(bucket: int, model: torch.nn.Module, dtype: torch.dtype) -> int:
    """The transfer buffer: a bucket, or the whole model in ``dtype`` when that is smaller (a
    section without a bucket key loads in one bucket, which must not mean 2**62 bytes)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return max(1, min(bucket, sum(p.numel() for p in model.parameters()) * itemsize))


def _this_gpu() -> tuple[torch.device, str]:
    """This process's CUDA device and its physical UUID (what the engine's worker matches)."""
    index = torch.cuda.current_device()
    return torch.device("cuda", index), str(torch.cuda.get_device_properties(index).uuid)


def _producer():
    from vllm.distributed.weight_transfer.packed_tensor import packed_ipc_producer

    return packed_ipc_producer


def update_infos(
    pairs: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype, limit_bytes: int, group=None
) -> Iterator[dict]:
    """The ``update_info`` of each bucket for vLLM's packed IPC engine: ``names``, ``dtype_names``,
    ``shapes``, ``tensor_sizes`` and the pickled handle of the buffer that holds them.

    Args:
        pairs: ``(name, whole tensor)`` as the HF model names them (gathered shards), any device.
        dtype: the engine's; tensors are cast on the GPU as they are packed.
        limit_bytes: the buffer's size (:func:`buffer_bytes`).
        group: a TP group's process group: every rank of it iterates in lockstep (a collective per
            bucket) and the handles name every rank's GPU; None: this rank's GPU alone.

    The caller resumes the generator only once the engine has loaded the yielded bucket: the next
    bucket is written into the same buffer.

    Raises:
        RolloutEngineError: a tensor larger than a bucket, naming it and the bucket key.
    """
    device, uuid = _this_gpu()
    itemsize = torch.empty((), dtype=dtype).element_size()

    def on_device() -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in pairs:
            size = tensor.numel() * itemsize
            if size > limit_bytes:
                raise RolloutEngineError(
                    f"{BUCKET_KEY}={limit_bytes // 2**20}: {name} takes {size / 2**20:.1f} MB, more than a bucket; "
                    f"raise it to at least {-(-size // 2**20)}"
                )
            # cast here, not in the producer: it reads a chunk's dtypes and shapes off what it is given
            yield name, tensor.detach().to(device=device, dtype=dtype)

    for chunk in _producer()(on_device(), uuid, lambda item: item[1], limit_bytes):
        handles = chunk.ipc_handle
        if group is not None:
            every_rank: list = [None] * dist.get_world_size(group)
            dist.all_gather_object(every_rank, handles, group=group)
            handles = {gpu: args for rank_handles in every_rank for gpu, args in rank_handles.items()}
        yield {
            "names": chunk.names,
            "dtype_names": chunk.dtype_names,
            "shapes": chunk.shapes,
            "tensor_sizes": chunk.tensor_sizes,
            "ipc_handles_pickled": base64.b64encode(pickle.dumps(handles)).decode("ascii"),
        }


def share_outcome(group, error: str | None) -> str | None:
    """What the group's leader (its first rank) reports for a bucket, for every rank of ``group``:
    None when the engine took it, else the leader's error text; ``error`` is this rank's report (a
    follower's is not read). A collective; without a group, ``error`` itself."""
    if group is None:
        return error
    reports: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(reports, error, group=group)
    return reports[0]
