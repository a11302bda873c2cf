"""``distillation``: on-policy distillation from one or more frozen teachers (verl's
``trainer/config/distillation/distillation.yaml``: the same keys and defaults).

The teacher is a worker role here: a frozen causal LM, sharded like the reference policy, that
scores the student's sampled responses with the HF forward (the sampled token's log-prob, or its
top-k next tokens for ``forward_kl_topk``). It runs in the trainer's own workers, or with
``nnodes`` > 0 on a Ray pool of its own of ``n_gpus_per_node`` x ``nnodes`` workers (verl's teacher
resource pool; :func:`check_teacher_pool`). verl's teacher inference servers
(``teacher_models.<name>.inference.*``, ``num_replicas``) are accepted so verl's commands run; what
they mean here is :func:`distillation_notes`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hybridrl.algorithms.distillation import DistillationLossConfig
from hybridrl.config.typed import same_as
from hybridrl.errors import ConfigError

__all__ = [
    "DistillationConfig",
    "DistillationLossSection",
    "TeacherInferenceConfig",
    "TeacherModelConfig",
    "DEFAULT_TEACHER",
    "distillation_loss_config",
    "resolve_teachers",
    "distillation_notes",
    "check_teacher_pool",
]

SECTION = "distillation"
DEFAULT_TEACHER = "teacher_model"  # verl's single-teacher entry
ROLLOUT = "${oc.select:actor_rollout_ref.rollout."


@dataclass
class DistillationLossSection:
    """``distillation.distillation_loss``: the loss's keys with verl's YAML defaults (a direct k3
    loss); :func:`distillation_loss_config` makes the frozen
    :class:`~hybridrl.algorithms.distillation.DistillationLossConfig` the losses read, and its
    rules run when the section is typed (the message names the key)."""

    loss_mode: str = "k3"
    topk: Optional[int] = 32
    use_task_rewards: bool = True
    distillation_loss_coef: float = 1.0
    loss_max_clamp: Optional[float] = None
    log_prob_min_clamp: Optional[float] = None
    use_policy_gradient: bool = False
    policy_loss_mode: str = "vanilla"
    clip_ratio: float = 0.2
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2

    def __post_init__(self):
        distillation_loss_config(self)


def distillation_loss_config(section) -> DistillationLossConfig:
    """The ``distillation.distillation_loss`` section (dataclass or the run's typed DictConfig) as
    the losses' frozen config.

    Raises:
        AlgorithmConfigError: a value out of range (one line naming the key).
    """
    return DistillationLossConfig(
        loss_mode=section.loss_mode,
        topk=section.topk,
        use_task_rewards=bool(section.use_task_rewards),
        distillation_loss_coef=float(section.distillation_loss_coef),
        loss_max_clamp=None if section.loss_max_clamp is None else float(section.loss_max_clamp),
        log_prob_min_clamp=None if section.log_prob_min_clamp is None else float(section.log_prob_min_clamp),
        use_policy_gradient=bool(section.use_policy_gradient),
        policy_loss_mode=section.policy_loss_mode,
        clip_ratio=float(section.clip_ratio),
        clip_ratio_low=float(section.clip_ratio_low),
        clip_ratio_high=float(section.clip_ratio_high),
    )


@dataclass
class TeacherInferenceConfig:
    """``distillation.teacher_models.<name>.inference``: verl's teacher inference server (shaped
    like ``actor_rollout_ref.rollout``). Here the teacher scores with the HF forward in the
    trainer's workers: ``dtype`` is the dtype it computes in and ``temperature`` divides its
    logits (both follow the rollout's, as in verl); the engine keys are not read."""

    name: Optional[str] = same_as(ROLLOUT + "name}")
    dtype: Optional[str] = same_as(ROLLOUT + "dtype}")
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = True
    cudagraph_capture_sizes: Optional[Any] = None
    free_cache_engine: bool = True
    data_parallel_size: int = 1
    expert_parallel_size: int = 1
    tensor_model_parallel_size: int = 2
    max_num_batched_tokens: int = 8192
    max_model_len: Optional[int] = None
    max_num_seqs: int = 1024
    load_format: str = "auto"
    engine_kwargs: Dict[str, Any] = field(default_factory=dict)
    limit_images: Optional[Any] = None
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    disable_log_stats: bool = True
    skip_tokenizer_init: bool = True
    prompt_length: Optional[int] = same_as(ROLLOUT + "prompt_length}")
    response_length: Optional[int] = same_as(ROLLOUT + "response_length}")
    temperature: Optional[float] = same_as(ROLLOUT + "temperature}")


@dataclass
class TeacherModelConfig:
    """``distillation.teacher_models.<name>``: ``model_path`` (an HF folder), ``key`` (the value of
    the samples' ``distillation.teacher_key`` column this teacher scores; one teacher scores all),
    ``num_replicas`` (verl's server count; not read) and ``inference``."""

    key: Optional[str] = None
    model_path: Optional[str] = None
    num_replicas: Optional[int] = 0
    inference: TeacherInferenceConfig = field(default_factory=TeacherInferenceConfig)


@dataclass
class DistillationConfig:
    """``distillation``: ``enabled``, the teachers (``teacher_models``), how samples are routed to
    them (``teacher_key``, a non-tensor column of the batch such as ``data_source``) and the loss
    (``distillation_loss``). The rules that need the teachers are :meth:`validate` (run at start-up
    when ``enabled``)."""

    enabled: bool = False
    n_gpus_per_node: int = 8
    nnodes: int = 0
    teacher_key: str = "data_source"
    teacher_models: Dict[str, TeacherModelConfig] = field(
        default_factory=lambda: {DEFAULT_TEACHER: TeacherModelConfig()}
    )
    distillation_loss: DistillationLossSection = field(default_factory=DistillationLossSection)

    def validate(self) -> None:
        """The teachers resolve (:func:`resolve_teachers`) and the loss names are registered.

        Raises:
            ConfigError: see :func:`resolve_teachers`; an unknown ``loss_mode`` /
                ``policy_loss_mode`` (one line with the known names).
        """
        from hybridrl.algorithms.distillation import get_distillation_loss_fn
        from hybridrl.algorithms.errors import UnknownAlgorithmError
        from hybridrl.algorithms.policy_loss import get_policy_loss_fn

        resolve_teachers(self)
        loss = self.distillation_loss
        try:
            get_distillation_loss_fn(loss.loss_mode)
            if loss.use_policy_gradient:
                get_policy_loss_fn(loss.policy_loss_mode)
        except UnknownAlgorithmError as exc:
            raise ConfigError(str(exc)) from None


def resolve_teachers(section) -> Dict[str, Any]:
    """``{routing key: teacher section}`` of the configured teachers (verl's
    ``_resolve_teacher_models``): the entries with a ``model_path``. One teacher scores every
    sample (its routing key is ``"default"``, its ``key`` not read); several are routed by their
    ``key``. verl drops the default entry ``teacher_model`` silently when others are added; here
    that is an error when it has a ``model_path`` too.

    Raises:
        ConfigError: no teacher has a ``model_path``; ``teacher_model`` and other teachers both
            given; with several teachers, one without ``key`` or ``model_path``, or two with one key.
    """
    entries = dict(section.teacher_models)
    prefix = f"{SECTION}.teacher_models"
    named = {name: entry for name, entry in entries.items() if entry.model_path}
    if not named:
        raise ConfigError(
            f"distillation.enabled=true needs a teacher: set {prefix}.{DEFAULT_TEACHER}.model_path (an HF folder)"
        )
    others = [name for name in entries if name != DEFAULT_TEACHER]
    if DEFAULT_TEACHER in named and others:
        raise ConfigError(
            f"{prefix}.{DEFAULT_TEACHER}.model_path is set together with other teachers ({', '.join(others)}); "
            f"verl silently drops {DEFAULT_TEACHER} then - give it another name (e.g. teacher_model1)"
        )
    if len(entries) - (DEFAULT_TEACHER in entries) <= 1 and len(named) == 1:
        return {"default": next(iter(named.values()))}
    teachers: Dict[str, Any] = {}
    for name in others:
        entry = entries[name]
        for key in ("model_path", "key"):
            if not getattr(entry, key):
                raise ConfigError(
                    f"{prefix}.{name}.{key} is not set: with several teachers each needs a model_path and a key "
                    f"(the value of the samples' distillation.teacher_key={section.teacher_key} column it scores)"
                )
        if entry.key in teachers:
            raise ConfigError(f"{prefix}.{name}.key={entry.key!r} is the key of another teacher; keys must differ")
        teachers[str(entry.key)] = entry
    return teachers


def check_teacher_pool(section, backend: str) -> None:
    """The teachers' pool of their own (``nnodes`` > 0, ``n_gpus_per_node`` workers on each node).

    Raises:
        ConfigError: a negative size, a pool without workers, or ``trainer.backend=local`` (the
            pool is Ray workers), one line naming the key.
    """
    for key in ("nnodes", "n_gpus_per_node"):
        if getattr(section, key) < 0:
            raise ConfigError(f"{SECTION}.{key}={getattr(section, key)!r} must be an integer >= 0")
    if not section.nnodes:
        return
    if section.n_gpus_per_node < 1:
        raise ConfigError(
            f"{SECTION}.nnodes={section.nnodes} with {SECTION}.n_gpus_per_node={section.n_gpus_per_node} leaves the "
            f"teachers' pool no workers; set n_gpus_per_node >= 1, or {SECTION}.nnodes=0 (the trainer's workers)"
        )
    if backend == "local":
        raise ConfigError(
            f"{SECTION}.nnodes={section.nnodes}: the teachers' pool of their own runs on Ray workers; set "
            f"trainer.backend=ray (or auto), or {SECTION}.nnodes=0 to score in the trainer's workers"
        )


def distillation_notes(section, rollout_name: str) -> List[str]:
    """One line per verl teacher-server key set here that means nothing in this build (the
    teacher scores with the HF forward, sharded like the reference)."""
    notes = []
    for name, entry in resolve_teachers(section).items():
        if entry.inference.name not in (None, "hf", rollout_name) or entry.num_replicas:
            notes.append(
                f"distillation teacher {name}: num_replicas and inference.* other than dtype and temperature are "
                "not read; the teacher scores the responses with the HF forward"
            )
    return notes
