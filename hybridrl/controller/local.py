"""The in-process backend: one worker, world size 1, in the driver's own process.

This is the default on a single device. There is no serialisation and no remote call, so a
debugger's breakpoint inside a worker method just works.
"""

from __future__ import annotations

from typing import Any

from hybridrl.controller.worker_group import WorkerGroup
from hybridrl.protocol import DataProto


def _detached(value: Any) -> Any:
    """What a remote worker would see: its own DataProto shell and meta_info.

    A remote backend pickles arguments, so a worker that moves a batch to its device or adds
    meta_info keys never touches the driver's object. Here the shell is copied (the tensors
    are shared, not copied) so that the same worker code behaves the same in both backends.
    """
    if isinstance(value, DataProto):
        return DataProto(
            batch=value.batch, non_tensor_batch=dict(value.non_tensor_batch), meta_info=dict(value.meta_info)
        )
    return value


class LocalWorkerGroup(WorkerGroup):
    """Runs ``worker_cls(*args, **kwargs)`` in this process as rank 0 of 1."""

    def __init__(self, worker_cls: type, *args, **kwargs) -> None:
        super().__init__(worker_cls, world_size=1)
        self.workers = [worker_cls(*args, **kwargs)]

    def _execute(self, method_name: str, per_rank_args: list, per_rank_kwargs: list) -> list[Any]:
        return [
            getattr(worker, method_name)(*(_detached(a) for a in args), **{k: _detached(v) for k, v in kwargs.items()})
            for worker, args, kwargs in zip(self.workers, per_rank_args, per_rank_kwargs)
        ]
