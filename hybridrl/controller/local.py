"""The in-process backend: one worker, world size 1, in the driver's own process.

This is the default on a single device. There is no serialisation and no remote call, so a
debugger's breakpoint inside a worker method just works.
"""

from __future__ import annotations

from typing import Any

from hybridrl.controller.worker_group import WorkerGroup


class LocalWorkerGroup(WorkerGroup):
    """Runs ``worker_cls(*args, **kwargs)`` in this process as rank 0 of 1."""

    def __init__(self, worker_cls: type, *args, **kwargs) -> None:
        super().__init__(worker_cls, world_size=1)
        self.workers = [worker_cls(*args, **kwargs)]

    def _execute(self, method_name: str, per_rank_args: list, per_rank_kwargs: list, ranks: list[int]) -> list[Any]:
        return [
            getattr(self.workers[r], method_name)(*a, **kw)
            for r, a, kw in zip(ranks, per_rank_args, per_rank_kwargs)
        ]
