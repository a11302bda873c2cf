"""The streaming methods of the workers that run an engine for fully asynchronous training
(``trainer.v1.trainer_mode=colocate_async|separate_async``): the actor/rollout worker, and the
standalone rollout worker of a separate resource pool. Each rank streams the groups sent to it
on its own engine (:class:`~hybridrl.workers.rollout.stream.RolloutStream`)."""

from __future__ import annotations

from hybridrl.controller.decorator import Dispatch, register
from hybridrl.protocol import DataProto
from hybridrl.workers.rollout.stream import RolloutStream


class StreamingMethods:
    """Mixin for a worker with ``self.rollout`` (an async engine), ``self.rollout_param_version``
    (the version of the weights in it) and ``self.stream`` (None until the first submit)."""

    stream = None

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def stream_submit(self, prompts: DataProto | None) -> int:
        """Starts sampling ``prompts`` on this rank's engine (:class:`~hybridrl.workers.rollout.stream.RolloutStream`;
        the rows of a group, same ``uid``, consecutive) and returns the number of groups in flight.

        Raises:
            RolloutEngineError: a prompt too long for the engine; the engine failed or missed its deadline.
        """
        if self.stream is None:
            self.stream = RolloutStream(self.rollout, self.rollout_param_version)
        if prompts is not None and len(prompts):
            self.stream.submit(prompts.to("cpu"))
        return len(self.stream.in_flight())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stream_collect(self, wait_s: float) -> list[DataProto]:
        """The groups this rank finished since the last call (waiting up to ``wait_s`` seconds for one).

        Raises:
            RolloutEngineError: a group failed or the engine missed its deadline.
        """
        return self.stream.collect(wait_s) if self.stream is not None else []

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stream_idle_s(self) -> float:
        """Seconds this rank's engine has had no streamed request since the stream started."""
        return self.stream.idle_s() if self.stream is not None else 0.0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stream_pause(self) -> None:
        """Stops this rank's generation until the next :meth:`sync_rollout_weights` (colocated async:
        the trainer gets the cores while it trains)."""
        if self.stream is not None:
            self.stream.pause()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stream_close(self) -> None:
        """Cancels the groups in flight; the engine stays up (validation, the next run of the driver)."""
        if self.stream is not None:
            self.stream.close()
            self.stream = None
