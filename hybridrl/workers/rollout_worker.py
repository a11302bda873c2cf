"""A rollout worker of its own resource pool: generation apart from training
(``trainer.v1.trainer_mode=separate_async`` with ``actor_rollout_ref.rollout.nnodes`` > 0).

As verl's standalone rollout replicas: the engines run on workers (processes, devices, nodes)
that hold no actor, and the trainer's workers hold no engine. Each rank runs its own async vLLM
engine, started from the model folder; after every update the driver hands the actor's weights
(gathered on the actor's rank 0) to every rollout rank (:meth:`RolloutWorker.update_weights`),
which loads them between pauses of its stream, so the samples in flight continue on them.
"""

from __future__ import annotations

import numpy as np
import torch

from hybridrl.controller.decorator import Dispatch, register
from hybridrl.controller.worker import Worker, resolve_device, resolve_worker_precision
from hybridrl.models import load_causal_lm, load_tokenizer, resolve_model_path
from hybridrl.protocol import DataProto
from hybridrl.workers.memory import memory_metrics
from hybridrl.workers.rollout.base import get_rollout_cls
from hybridrl.workers.stream_methods import StreamingMethods


class RolloutWorker(StreamingMethods, Worker):
    """An async vLLM engine and its stream, without an actor. ``config`` is the
    ``actor_rollout_ref`` section (``model`` and ``rollout`` are read)."""

    def __init__(self, config, device: str = "auto") -> None:
        super().__init__(config)
        self.device = resolve_device(device)  # no process group: each engine serves its own requests
        resolve_worker_precision(config, self.device, self.rank)  # auto dtypes the driver left (a GPU-less head)
        self.rollout_param_version = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Loads the model (only to start the engine from it) and starts the engine.

        Raises:
            RolloutEngineError: vLLM missing, or a model it cannot load.
        """
        model_cfg = self.config.model
        path = resolve_model_path(model_cfg.path, config_key="actor_rollout_ref.model.path")
        trust = model_cfg.trust_remote_code
        tokenizer = load_tokenizer(path, trust_remote_code=trust, chat_template=model_cfg.custom_chat_template)
        module = load_causal_lm(
            path, dtype="fp32", trust_remote_code=trust, override_config=model_cfg.override_config
        ).to(self.device)
        engine_cls = get_rollout_cls(self.config.rollout.name, "async")
        self.rollout = engine_cls(module, self.config.rollout, tokenizer, getattr(module, "generation_config", None))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def update_weights(self, state: dict[str, torch.Tensor], version: int) -> int:
        """Loads the actor's weights of ``version`` (a whole or partial state dict); the stream
        pauses around the load and its samples in flight continue on the new weights.

        Raises:
            RolloutEngineError: the engine died or missed its deadline.
        """
        if self.stream is not None:
            self.stream.pause()
        self.rollout.load_weights(state)
        self.rollout_param_version = int(version)
        if self.stream is not None:
            self.stream.resume(self.rollout_param_version)
        return self.rollout_param_version

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Responses in the :class:`~hybridrl.workers.rollout.base.BaseRollout` layout with their
        ``param_version`` (validation; training streams)."""
        output = self.rollout.generate_sequences(prompts.to("cpu"))
        output.non_tensor_batch["param_version"] = np.full(len(output), self.rollout_param_version, dtype=object)
        return output

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def get_memory_metrics(self) -> dict[str, float]:
        """This process's memory in GiB (:func:`~hybridrl.workers.memory.memory_metrics`; the engine's
        child processes not counted): the driver asks once per training step."""
        return memory_metrics(self.device)
