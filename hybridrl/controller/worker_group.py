"""WorkerGroup: one driver-side handle for ``world_size`` workers of one class.

Every method of the worker class marked with ``@register`` becomes a method of the group that
splits the driver's arguments (dispatch), runs the method on the workers (execute) and
gathers their outputs (collect). Backends only say how to run a method on the ranks.
"""

from __future__ import annotations

import inspect
from typing import Any

from hybridrl.controller.decorator import MethodSpec, collect_outputs, dispatch_args, get_method_spec


class WorkerGroup:
    """Backend-independent part of a worker group.

    Subclasses implement ``_execute(method_name, per_rank_args, per_rank_kwargs)``: run the
    method on every rank with its arguments, return the outputs in rank order.
    """

    def __init__(self, worker_cls: type, world_size: int) -> None:
        self.worker_cls = worker_cls
        self.world_size = world_size
        self._bind_registered_methods(worker_cls)

    def _bind_registered_methods(self, worker_cls: type) -> None:
        for name, func in inspect.getmembers(worker_cls, predicate=callable):
            spec = get_method_spec(func)
            if spec is not None:
                setattr(self, name, self._make_group_method(name, spec))

    def _make_group_method(self, name: str, spec: MethodSpec):
        def group_method(*args, **kwargs):
            per_args, per_kwargs, pad_size = dispatch_args(spec.dispatch_mode, self.world_size, args, kwargs)
            return collect_outputs(spec.dispatch_mode, self._execute(name, per_args, per_kwargs), pad_size)

        group_method.__name__ = name
        return group_method

    def _execute(self, method_name: str, per_rank_args: list, per_rank_kwargs: list) -> list[Any]:
        raise NotImplementedError
