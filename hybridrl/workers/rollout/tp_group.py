"""One rollout engine across ``rollout.tensor_model_parallel_size`` workers (verl's rollout TP group).

The workers of a process group split into groups of T consecutive ranks. The first rank of each
(its leader) runs the group's engine with ``tensor_parallel_size=T``, in a process of its own
whose T vLLM workers split every layer's heads and MLP between them; the other ranks hold no
engine. A generation gathers the group's rows on the leader (one batch for its engine) and hands
every rank the responses of its own rows back, so the trainer's data-parallel split stays as it
is. A weight sync gathers the actor's whole tensors (a collective over every rank when the actor
is FSDP-sharded); the leader hands them to its engine, which shards each as it loads it. On CUDA
they go by CUDA IPC from every rank's GPU (:mod:`.cuda_ipc`): each of the engine's workers opens
the copy on its own GPU.

On CUDA the group's engine runs on the group's devices (``CUDA_VISIBLE_DEVICES`` of its ranks);
on CPU its T workers share the machine's cores.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

import torch
import torch.distributed as dist

from hybridrl.errors import ConfigError
from hybridrl.models import to_torch_dtype
from hybridrl.protocol import DataProto
from hybridrl.workers.rollout import cuda_ipc
from hybridrl.workers.rollout.base import BaseRollout, RolloutEngineError, policy_weights
from hybridrl.workers.rollout.weight_files import bucket_bytes

TP_KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"


def check_tp_size(tp_size: int, world_size: int, num_attention_heads: int | None = None) -> None:
    """Raises a one-line :class:`ConfigError` naming ``rollout.tensor_model_parallel_size`` when
    ``tp_size`` < 1, does not divide the ``world_size`` workers, or does not divide the model's
    ``num_attention_heads`` (each TP rank computes whole heads)."""
    if tp_size < 1 or world_size % tp_size:
        raise ConfigError(
            f"{TP_KEY}={tp_size} must be >= 1 and divide the number of workers ({world_size}: trainer.nnodes x "
            "trainer.n_gpus_per_node): each engine spans that many workers"
        )
    if num_attention_heads is not None and num_attention_heads % tp_size:
        raise ConfigError(
            f"{TP_KEY}={tp_size} does not divide the model's {num_attention_heads} attention heads "
            "(each tensor-parallel rank computes whole heads); pick a divisor of it"
        )


def _physical_device() -> str:
    """This worker's CUDA device as the machine numbers it ("" without CUDA): its index among the
    devices Ray (``CUDA_VISIBLE_DEVICES``) left it, mapped back."""
    if not torch.cuda.is_available():
        return ""
    index = torch.cuda.current_device()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible.split(",")[index].strip() if visible else str(index)


class _LeaderFailed:
    """What a failed leader sends its followers instead of their rows."""

    def __init__(self, text: str) -> None:
        self.text = text


class RolloutTPGroup:
    """This rank's rollout TP group: T consecutive ranks of the default process group, the first
    their leader. Every rank of the process group must build it (it creates every group).

    Args:
        tp_size: ``rollout.tensor_model_parallel_size``.
        rank, world_size: this worker's place in the default process group.

    Raises:
        ConfigError: ``tp_size`` does not divide ``world_size`` (:func:`check_tp_size`).
    """

    def __init__(self, tp_size: int, rank: int, world_size: int) -> None:
        check_tp_size(tp_size, world_size)
        self.size = tp_size
        self.leader = rank - rank % tp_size
        self.is_leader = rank == self.leader
        self.group = None
        self.devices: list[str] = []
        if tp_size == 1:
            return
        for start in range(0, world_size, tp_size):  # every rank creates every group, in the same order
            group = dist.new_group(list(range(start, start + tp_size)), backend="gloo")
            if start == self.leader:
                self.group = group
        devices: list = [None] * tp_size
        dist.all_gather_object(devices, _physical_device(), group=self.group)
        if all(devices):  # the engine's T workers run on the group's devices
            self.devices = devices

    @contextlib.contextmanager
    def engine_devices(self):
        """While the leader starts its engine: the group's devices visible to the processes it spawns
        (CUDA; nothing to do on CPU)."""
        if not self.devices:
            yield
            return
        before = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(self.devices)
        try:
            yield
        finally:
            if before is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = before

    def run_on_leader(self, rows: DataProto, generate: Callable[[DataProto], DataProto]) -> DataProto:
        """``generate`` of the group's rows, run once on the leader; returns this rank's part of
        the output (the output of a row's samples in the row's place: ``generate`` may return k
        rows per input row, e.g. ``n`` samples, as long as every row gets the same k).

        Raises:
            RolloutEngineError: the leader's generation failed (on every rank of the group; the
                leader re-raises its own error).
        """
        if self.size == 1:
            return generate(rows)
        parts: list | None = [None] * self.size if self.is_leader else None
        dist.gather_object(rows, parts, dst=self.leader, group=self.group)
        share: list = [None]
        if not self.is_leader:
            dist.scatter_object_list(share, None, src=self.leader, group=self.group)
            if isinstance(share[0], _LeaderFailed):
                raise RolloutEngineError(
                    f"the rollout engine of rank {self.leader} (this rank's TP group leader) failed: {share[0].text}"
                )
            return share[0]
        assert parts is not None
        try:
            output = generate(DataProto.concat(parts))
            sizes = [len(p) for p in parts]
            per_row, extra = divmod(len(output), sum(sizes))
            if extra:
                raise RolloutEngineError(
                    f"the engine returned {len(output)} rows for {sum(sizes)} prompts; it must return the same "
                    "number of samples for every prompt"
                )
            starts = [per_row * sum(sizes[:i]) for i in range(len(sizes) + 1)]
            outputs: list = [output.slice(starts[i], starts[i + 1]) for i in range(len(sizes))]
        except Exception as exc:
            dist.scatter_object_list(
                share, [_LeaderFailed(f"{type(exc).__name__}: {exc}")] * self.size, src=self.leader, group=self.group
            )
            raise
        dist.scatter_object_list(share, outputs, src=self.leader, group=self.group)
        return share[0]


class TPFollowerRollout(BaseRollout):
    """The rollout of a rank that is not its TP group's leader: no engine; it takes its part in
    the collectives of a weight sync (every rank gathers the sharded actor's tensors) and, on
    CUDA, hands the leader's engine the copy on its own GPU (:mod:`.cuda_ipc`).

    Args:
        actor_module: the trained policy (plain, FSDP-sharded or LoRA).
        config: the rollout section (its ``dtype`` and weight bucket, as the leader's engine reads them).
        group: this rank's TP group.
    """

    def __init__(self, actor_module: torch.nn.Module, config, group: RolloutTPGroup) -> None:
        self.group = group
        self.ipc = cuda_ipc.serves(next(actor_module.parameters()).device)
        self.dtype = to_torch_dtype(config.dtype)
        # the leader's size (both from the actor module): the group's buffers take the same buckets
        self.ipc_bytes = cuda_ipc.buffer_bytes(bucket_bytes(config), actor_module, self.dtype)
        self.sync_weights(actor_module, everything=True)  # the leader's engine starts from these

    @torch.no_grad()
    def sync_weights(self, actor_module: torch.nn.Module, everything: bool = False) -> None:
        """This rank's part of a weight sync.

        Raises:
            RolloutEngineError: the leader's engine did not take a bucket (naming the leader).
        """
        pairs = policy_weights(actor_module, everything)
        if not self.ipc:
            for _ in pairs:
                pass
            return
        for _ in cuda_ipc.update_infos(pairs, self.dtype, self.ipc_bytes, self.group.group):
            error = cuda_ipc.share_outcome(self.group.group, None)
            if error is not None:
                raise RolloutEngineError(
                    f"the rollout engine of rank {self.group.leader} (this rank's TP group leader) could not "
                    f"load the weights: {error}"
                )
        torch.cuda.ipc_collect()

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        raise RolloutEngineError(
            "a rank that is not its TP group's leader has no engine; generate through RolloutTPGroup.run_on_leader"
        )
