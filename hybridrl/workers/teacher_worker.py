"""On-policy distillation's teachers as loaded models: in the policy workers (one device, or the
trainer's workers) or on a Ray pool of their own (``distillation.nnodes`` x ``n_gpus_per_node``).

:class:`Teachers` loads every teacher of ``distillation.teacher_models``, frozen and sharded like
the reference (``actor_rollout_ref.ref.fsdp_config``) over the worker's group, and scores the
student's responses (:func:`~hybridrl.workers.teacher.teacher_scores`, each row by its teacher:
:func:`~hybridrl.workers.teacher.route_rows`). :class:`TeacherWorker` holds them on a pool of
their own, so the trainer's workers keep their memory for the student; the driver sends each
batch there once its responses are in (verl's teacher servers).
"""

from __future__ import annotations

import torch

from hybridrl.algorithms.distillation import get_distillation_loss_settings
from hybridrl.config.batch_sizes import WorkerBatchSizes
from hybridrl.controller.decorator import Dispatch, register
from hybridrl.controller.worker import Worker
from hybridrl.models import load_causal_lm, load_tokenizer, resolve_model_path
from hybridrl.models.external import import_external_lib
from hybridrl.protocol import DataProto
from hybridrl.workers.actor import PPOActor
from hybridrl.workers.config.distillation import distillation_loss_config, resolve_teachers
from hybridrl.workers.memory import memory_metrics
from hybridrl.workers.pass_specs import policy_specs
from hybridrl.workers.sharding import load_options
from hybridrl.workers.teacher import check_same_vocabulary, route_rows, teacher_scores, teacher_spec

__all__ = ["Teachers", "TeacherWorker", "teacher_pool_spec"]


def teacher_pool_spec(distillation) -> list[int]:
    """Workers per node of the teachers' pool of their own (``distillation.nnodes`` x
    ``n_gpus_per_node``, verl's teacher resource pool); empty when the run does not distil or
    ``nnodes`` is 0 (verl's default): the teachers then live in the trainer's workers."""
    if distillation is None or not distillation.enabled:
        return []
    return [int(distillation.n_gpus_per_node)] * int(distillation.nnodes)


class Teachers:
    """The run's teachers in one worker, by routing key (``"default"`` for a single teacher).

    Args:
        distillation: the ``distillation`` section.
        config: the ``actor_rollout_ref`` section (the ``ref`` role's sharding and micro batches,
            the model's ``trust_remote_code`` and ``override_config``).
        student_tokenizer, student_vocab: the student's tokenizer and embedding rows.
        ref_spec: the reference pass's :class:`~hybridrl.workers.pass_specs.LogProbSpec`.
        device, world_size: where the teachers compute and how many workers shard them.

    Raises:
        ConfigError: a teacher whose tokenizer differs from the student's, or (top-k loss) whose
            vocabulary is larger (:func:`~hybridrl.workers.teacher.check_same_vocabulary`).
    """

    def __init__(self, distillation, config, student_tokenizer, student_vocab: int, ref_spec, device, world_size):
        loss = distillation_loss_config(distillation.distillation_loss)
        use_topk = bool(get_distillation_loss_settings(loss.loss_mode).use_topk)
        self.teacher_key = distillation.teacher_key
        self.topk = int(loss.topk) if use_topk and loss.topk is not None else None
        self.world_size = world_size
        fsdp_config = config.ref.fsdp_config
        options = load_options(config.model, device, world_size, fsdp_config)
        self.models: dict[str, tuple[PPOActor, object]] = {}
        for key, entry in resolve_teachers(distillation).items():
            path = resolve_model_path(entry.model_path, config_key="distillation.teacher_models.<name>.model_path")
            dtype = entry.inference.dtype
            dtype = fsdp_config.mixed_precision.param_dtype if dtype in (None, "auto") else dtype
            module = load_causal_lm(path, dtype=dtype, **options).requires_grad_(False)
            own = load_tokenizer(path, trust_remote_code=config.model.trust_remote_code)
            vocab = int(module.config.vocab_size)
            check_same_vocabulary(key, entry.model_path, own, student_tokenizer, vocab, student_vocab, use_topk)
            self.models[key] = (PPOActor(config.ref, module), teacher_spec(ref_spec, entry.inference.temperature))

    def score(self, data: DataProto) -> DataProto:
        """``teacher_log_prob`` ``(bs, response_length)`` and, for a top-k loss,
        ``teacher_topk_log_probs`` / ``teacher_topk_ids`` ``(bs, response_length, topk)`` of the rows
        of ``data`` (on the teachers' device), each row scored by its teacher. With several workers
        every teacher scores all rows (its collectives need every rank), each row keeps its own
        teacher's.

        Raises:
            ConfigError: a row whose ``distillation.teacher_key`` value is no teacher's key.
        """
        routes = route_rows(data, self.teacher_key, self.models)
        out: dict[str, torch.Tensor] = {}
        for key, rows in routes.items():
            policy, spec = self.models[key]
            if self.world_size == 1 and len(rows) == 0:
                continue
            everyone = self.world_size > 1 or len(rows) == len(data)
            part = data if everyone else data[rows]
            for name, values in teacher_scores(policy, part, spec, self.topk).items():
                index = torch.as_tensor(rows, dtype=torch.long, device=values.device)
                if name not in out:
                    out[name] = values.new_zeros((len(data), *values.shape[1:]))
                out[name][index] = values[index] if everyone else values
        return DataProto.from_dict(tensors=out).to("cpu")


class TeacherWorker(Worker):
    """A worker of the teachers' pool (:func:`teacher_pool_spec`): no student, only the teachers,
    sharded over the pool's workers.

    Args:
        config: the ``actor_rollout_ref`` section (the student's model and tokenizer, the ``ref``
            role's sharding and log-prob micro batches).
        batch_sizes: per-worker batch sizes for this pool's world size (the reference pass's).
        distillation: the ``distillation`` section.
        device: ``trainer.device``.
    """

    def __init__(self, config, batch_sizes: WorkerBatchSizes, distillation, device: str = "auto") -> None:
        super().__init__(config, device)
        self.batch_sizes = batch_sizes
        self.distillation = distillation

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Loads the teachers (the student's tokenizer and vocabulary size to check them against)."""
        from transformers import AutoConfig

        model_cfg = self.config.model
        import_external_lib(model_cfg.external_lib)
        student = resolve_model_path(model_cfg.path, config_key="actor_rollout_ref.model.path")
        trust = model_cfg.trust_remote_code
        tokenizer = load_tokenizer(student, trust_remote_code=trust, chat_template=model_cfg.custom_chat_template)
        vocab = int(AutoConfig.from_pretrained(student, trust_remote_code=trust).vocab_size)
        specs = policy_specs(self.config, self.batch_sizes, self.world_size)
        self.teachers = Teachers(
            self.distillation, self.config, tokenizer, vocab, specs.ref_log_prob, self.device, self.world_size
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_teacher_log_prob(self, data: DataProto) -> DataProto:
        """The teachers' scores of this worker's rows (:meth:`Teachers.score`)."""
        return self.teachers.score(data.to(self.device))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def get_memory_metrics(self) -> dict[str, float]:
        """This process's memory in GiB (:func:`~hybridrl.workers.memory.memory_metrics`)."""
        return memory_metrics(self.device)
