"""The memory plan of a run's config: :func:`build_plan` turns the typed PPO config (the one
``hybridrl train`` runs with) into :class:`~hybridrl.trainer.jobs.memory_plan.PlanInputs` and plans
them; :func:`suggest` tries the keys that lower the peak; :func:`startup_line` is the line
``hybridrl train`` prints. The arithmetic is :mod:`hybridrl.trainer.jobs.memory_plan`'s.
"""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

from hybridrl.config import worker_batch_sizes
from hybridrl.config.batch_sizes import check_batch_sizes
from hybridrl.config.key_tables import ACTOR, REF, ROLLOUT
from hybridrl.config.rules import at_least
from hybridrl.errors import ConfigError
from hybridrl.models import resolve_model_path
from hybridrl.trainer.jobs.memory_plan import (
    CPU_MALLOC_KEPT_GB,
    CPU_PROCESS_BASELINE_GB,
    CUDA_PROCESS_BASELINE_GB,
    GiB,
    MemoryPlan,
    Pass,
    PlanInputs,
    Role,
    Rollout,
    make_plan,
)
from hybridrl.trainer.jobs.model_shape import read_model_shape
from hybridrl.trainer.ppo.step_plan import needs_critic, needs_reference_policy

__all__ = ["build_plan", "default_device_memory_gb", "plan_device"]

# An engine in the worker's process takes the weights one tensor at a time, with transient copies
# besides; the plan counts 512 MB for them, the figure its measured runs were planned with
# (docs/scale.md). The engine of its own process holds one bucket of checkpoint_engine's size.
IN_PROCESS_SYNC_MB = 512.0

_DTYPE_BYTES = {"fp32": 4, "float32": 4, "float": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2}
MODEL = "actor_rollout_ref.model"


def _dtype_bytes(key: str, value) -> int:
    """Bytes per element of the dtype ``value`` at config ``key``."""
    value = str(value)
    if value not in _DTYPE_BYTES:
        raise ConfigError(f"{key}={value!r} is not a dtype the memory plan knows ({', '.join(_DTYPE_BYTES)})")
    return _DTYPE_BYTES[value]


def plan_device(config) -> str:
    """``cpu`` or ``cuda``: ``trainer.device`` with ``auto`` resolved as the run resolves it."""
    device = str(config.trainer.device)
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def default_device_memory_gb(config, device: str) -> float:
    """The visible device's memory (GiB): CUDA device 0's total, or on CPU this machine's RAM
    divided by the workers per node (``trainer.n_gpus_per_node``)."""
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(
                "--device-memory: trainer.device=cuda but no GPU is visible here; give the GPU's "
                "memory in GB, e.g. --device-memory 80"
            )
        return torch.cuda.get_device_properties(0).total_memory / GiB
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return ram / GiB / max(1, int(config.trainer.n_gpus_per_node))


def _shape(key: str, model):
    """The shape of the model section ``model`` at config ``key`` (its ``path``, with its
    ``override_config`` when it has one: the loader's)."""
    overrides = getattr(model, "override_config", None)
    folder = resolve_model_path(str(model.path), config_key=f"{key}.path")
    return read_model_shape(folder, f"{key}.path", dict(overrides or {}) if hasattr(model, "override_config") else None)


def _shard(workers: int, fsdp_size) -> int:
    """FSDP divisor: ``fsdp_size`` groups (hybrid sharding) when 0 < fsdp_size < workers, else all workers."""
    return int(fsdp_size) if isinstance(fsdp_size, int) and 0 < fsdp_size < workers else workers


def _sp(key: str, value) -> int:
    return at_least(key, value, 1)


def _tokens_pass(tokens: int, response_share: float, row_len: int, sp: int, **kwargs) -> Pass:
    """A pass over ``tokens`` tokens (``response_share`` of them projected on the vocabulary), split over SP."""
    return Pass(
        tokens=math.ceil(tokens / sp), logit_tokens=math.ceil(tokens * response_share / sp), row_len=row_len, **kwargs
    )


def _forward_micro(section, prefix: str, name: str, workers: int, fallback: int):
    """Rows per forward: ``<name>_per_gpu``, else the deprecated global ``<name>`` / workers, else ``fallback``."""
    per_gpu = getattr(section, f"{name}_per_gpu")
    if per_gpu is not None:
        return at_least(f"{prefix}.{name}_per_gpu", per_gpu, 1)
    total = getattr(section, name)
    return max(1, int(total) // workers) if total else fallback


def _lengths(config) -> tuple[int, int, int]:
    prompt = at_least("data.max_prompt_length", config.data.max_prompt_length, 1)
    response = at_least("data.max_response_length", config.data.max_response_length, 1)
    at_least(f"{ROLLOUT}.response_length", config.actor_rollout_ref.rollout.response_length, 1)
    return prompt, response, prompt + response


def _actor_role(config, workers: int, cuda: bool, shape, train_micro: int) -> Role:
    arr = config.actor_rollout_ref
    actor, model, rollout = arr.actor, arr.model, arr.rollout
    _, response, seq = _lengths(config)
    share, sp = response / seq, _sp(f"{ACTOR}.ulysses_sequence_parallel_size", actor.ulysses_sequence_parallel_size)
    temp_copy = 4 if float(rollout.temperature) != 1.0 else 0
    entropy_grad = 4 if actor.entropy_coeff and not actor.entropy_checkpointing else 0
    chunked = bool(actor.entropy_from_logits_with_chunking)
    update_tokens = int(actor.ppo_max_token_len_per_gpu) if actor.use_dynamic_bsz else train_micro * seq
    lp_rows = _forward_micro(rollout, ROLLOUT, "log_prob_micro_batch_size", workers, train_micro)
    lp_tokens = int(rollout.log_prob_max_token_len_per_gpu) if rollout.log_prob_use_dynamic_bsz else lp_rows * seq
    lora = at_least(f"{MODEL}.lora_rank", model.lora_rank, 0)
    adapters = shape.lora_param_count(lora, model.target_modules, model.exclude_modules) if lora else 0
    fsdp = actor.fsdp_config
    return Role(
        shape=shape,
        params=shape.param_count() + adapters,
        weight_bytes=_dtype_bytes(f"{ACTOR}.fsdp_config.model_dtype", fsdp.model_dtype),
        compute_bytes=_dtype_bytes(
            f"{ACTOR}.fsdp_config.mixed_precision.param_dtype", fsdp.mixed_precision.param_dtype
        ),
        shard=_shard(workers, fsdp.fsdp_size),
        trainable=adapters or shape.param_count(),
        param_offload=bool(fsdp.param_offload),
        optimizer_offload=bool(fsdp.optimizer_offload),
        checkpointing=bool(model.enable_gradient_checkpointing),
        reshard_after_forward=bool(fsdp.reshard_after_forward),
        fsdp=workers > 1 or (cuda and fsdp.param_offload),
        passes={
            "update_actor": _tokens_pass(
                update_tokens, share, seq, sp, train=True, chunked=chunked, extra_logit_bytes=temp_copy + entropy_grad
            ),
            "old_log_prob": _tokens_pass(lp_tokens, share, seq, sp, chunked=chunked, extra_logit_bytes=temp_copy),
        },
    )


def _ref_pass_tokens(config, workers: int, train_micro: int) -> int:
    """Tokens per forward of the reference pass (the teachers score the same micro batches)."""
    ref = config.actor_rollout_ref.ref
    rows = _forward_micro(ref, REF, "log_prob_micro_batch_size", workers, train_micro)
    return int(ref.log_prob_max_token_len_per_gpu) if ref.log_prob_use_dynamic_bsz else rows * _lengths(config)[2]


def _reference_role(config, workers: int, cuda: bool, actor: Role, train_micro: int) -> Role:
    ref = config.actor_rollout_ref.ref
    _, response, seq = _lengths(config)
    tokens = _ref_pass_tokens(config, workers, train_micro)
    temp_copy = 4 if float(config.actor_rollout_ref.rollout.temperature) != 1.0 else 0
    lora = int(config.actor_rollout_ref.model.lora_rank) > 0
    compute = _dtype_bytes(
        f"{REF}.fsdp_config.mixed_precision.param_dtype", ref.fsdp_config.mixed_precision.param_dtype
    )
    offload = bool(ref.fsdp_config.param_offload)
    sp = _sp(f"{REF}.ulysses_sequence_parallel_size", ref.ulysses_sequence_parallel_size)
    return Role(
        shape=actor.shape,
        params=actor.params,
        weight_bytes=actor.weight_bytes if lora else compute,
        compute_bytes=compute,
        shard=actor.shard if lora else _shard(workers, ref.fsdp_config.fsdp_size),
        param_offload=actor.param_offload if lora else offload,
        own_copy=not lora,
        reshard_after_forward=bool(ref.fsdp_config.reshard_after_forward),
        fsdp=actor.fsdp if lora else (workers > 1 or (cuda and offload)),
        passes={
            "ref_log_prob": _tokens_pass(
                tokens,
                response / seq,
                seq,
                sp,
                extra_logit_bytes=temp_copy,
                chunked=bool(ref.entropy_from_logits_with_chunking),
            )
        },
    )


def _teacher_roles(config, workers: int, cuda: bool, train_micro: int) -> tuple:
    """``(name, Role)`` of each distillation teacher: frozen, sharded like the reference, in its
    ``inference.dtype``, scoring the reference pass's micro batches (top-k tensors are small: not counted)."""
    if not config.distillation.enabled or config.distillation.nnodes > 0:  # on a pool of their own: see _notes
        return ()
    ref = config.actor_rollout_ref.ref
    _, response, seq = _lengths(config)
    tokens = _ref_pass_tokens(config, workers, train_micro)
    roles = []
    for name, teacher in config.distillation.teacher_models.items():
        if not teacher.model_path:
            continue
        key = f"distillation.teacher_models.{name}"
        shape = _shape(key, SimpleNamespace(path=teacher.model_path))
        compute = _dtype_bytes(f"{key}.inference.dtype", teacher.inference.dtype)
        role = Role(
            shape=shape,
            params=shape.param_count(),
            weight_bytes=compute,
            compute_bytes=compute,
            shard=_shard(workers, ref.fsdp_config.fsdp_size),
            param_offload=False,
            reshard_after_forward=bool(ref.fsdp_config.reshard_after_forward),
            fsdp=workers > 1,
            passes={"teacher_log_prob": _tokens_pass(tokens, response / seq, seq, 1)},
        )
        roles.append((f"teacher:{name}", role))
    return tuple(roles)


def _critic_role(config, workers: int, cuda: bool) -> Role:
    critic = config.critic
    n = int(config.actor_rollout_ref.rollout.n)
    _, _, seq = _lengths(config)
    shape = _shape("critic.model", critic.model)
    micro = worker_batch_sizes(critic, n, workers).ppo_micro_batch_size_per_gpu
    update = int(critic.ppo_max_token_len_per_gpu) if critic.use_dynamic_bsz else micro * seq
    rows = _forward_micro(critic, "critic", "forward_micro_batch_size", workers, micro)
    forward = int(critic.forward_max_token_len_per_gpu) if critic.use_dynamic_bsz else rows * seq
    sp = _sp("critic.ulysses_sequence_parallel_size", critic.ulysses_sequence_parallel_size)
    model = critic.model
    lora = at_least("critic.model.lora_rank", model.lora_rank, 0)
    params = shape.scalar_head_param_count()
    adapters = shape.lora_param_count(lora, model.target_modules, model.exclude_modules) if lora else 0
    trainable = adapters + shape.hidden_size + 1 if lora else params  # LoRA: the adapters and the value head
    fsdp = model.fsdp_config
    return Role(
        shape=shape,
        params=params + adapters,
        weight_bytes=_dtype_bytes("critic.model.fsdp_config.model_dtype", fsdp.model_dtype),
        compute_bytes=_dtype_bytes(
            "critic.model.fsdp_config.mixed_precision.param_dtype", fsdp.mixed_precision.param_dtype
        ),
        shard=_shard(workers, fsdp.fsdp_size),
        trainable=trainable,
        param_offload=bool(fsdp.param_offload),
        optimizer_offload=bool(fsdp.optimizer_offload),
        checkpointing=bool(model.enable_gradient_checkpointing),
        reshard_after_forward=bool(fsdp.reshard_after_forward),
        fsdp=workers > 1 or (cuda and fsdp.param_offload),
        passes={
            "update_critic": _tokens_pass(update, 0.0, seq, sp, train=True),
            "values": _tokens_pass(forward, 0.0, seq, sp),
        },
    )


def _reward_model_role(config, workers: int, cuda: bool, per_worker_rows: int) -> Role:
    rm = config.reward_model
    _, _, seq = _lengths(config)
    shape = _shape("reward_model.model", rm.model)
    row_len = int(rm.max_length) if rm.max_length else seq
    rows = _forward_micro(rm, "reward_model", "micro_batch_size", workers, per_worker_rows)
    fsdp = rm.model.fsdp_config
    return Role(
        shape=shape,
        params=shape.scalar_head_param_count(),
        weight_bytes=_dtype_bytes("reward_model.model.fsdp_config.model_dtype", rm.model.fsdp_config.model_dtype),
        compute_bytes=_dtype_bytes(
            "reward_model.model.fsdp_config.mixed_precision.param_dtype",
            rm.model.fsdp_config.mixed_precision.param_dtype,
        ),
        shard=_shard(workers, fsdp.fsdp_size),
        param_offload=bool(fsdp.param_offload),
        reshard_after_forward=bool(fsdp.reshard_after_forward),
        fsdp=workers > 1 or (cuda and fsdp.param_offload),
        passes={"reward_model": _tokens_pass(rows * row_len, 0.0, row_len, 1)},
    )


def _rollout(config, device_memory_gb: float, cuda: bool, actor: Role, per_worker_rows: int, workers: int) -> Rollout:
    rollout = config.actor_rollout_ref.rollout
    dtype = _dtype_bytes(f"{ROLLOUT}.dtype", rollout.dtype)
    micro = rollout.micro_batch_size
    if micro is not None:
        micro = at_least(f"{ROLLOUT}.micro_batch_size", micro, 1)
    params = actor.shape.param_count()
    engine = "vllm" if rollout.name == "vllm" else "hf"
    vllm_gb = 0.0
    if engine == "vllm":
        fraction = float(rollout.gpu_memory_utilization)
        if not 0 < fraction <= 1:
            raise ConfigError(f"{ROLLOUT}.gpu_memory_utilization={fraction} must be in (0, 1]")
        kv_gb = rollout.kv_cache_memory_gb
        if kv_gb is not None and float(kv_gb) <= 0:
            raise ConfigError(f"{ROLLOUT}.kv_cache_memory_gb={kv_gb} must be > 0 (GiB) or null")
        weights_gb = params * dtype / GiB / int(rollout.tensor_model_parallel_size)  # each TP rank's share
        if cuda:
            vllm_gb = fraction * device_memory_gb if kv_gb is None else weights_gb + float(kv_gb)
        else:
            vllm_gb = weights_gb + (float(kv_gb) if kv_gb is not None else 1.0)
    if engine == "vllm" and (rollout.mode == "async" or workers > 1):  # the engine of its own process: buckets
        bucket = min(float(rollout.checkpoint_engine.update_weights_bucket_megabytes), params * dtype / (1 << 20))
    else:
        bucket = IN_PROCESS_SYNC_MB
    return Rollout(
        shape=actor.shape,
        params=params,
        engine=engine,
        dtype_bytes=dtype,
        micro_batch=min(micro or per_worker_rows, per_worker_rows),
        prompt_len=int(config.data.max_prompt_length),
        response_len=int(rollout.response_length),
        bucket_mb=bucket,
        vllm_gb=vllm_gb,
        vllm_sleeps=bool(rollout.free_cache_engine),
    )


def _notes(config, device: str, workers: int) -> list[str]:
    notes = []
    arr, critic_fsdp = config.actor_rollout_ref, config.critic.model.fsdp_config
    switches = {
        f"{ACTOR}.fsdp_config.param_offload": arr.actor.fsdp_config.param_offload,
        f"{ACTOR}.fsdp_config.optimizer_offload": arr.actor.fsdp_config.optimizer_offload,
        f"{REF}.fsdp_config.param_offload": arr.ref.fsdp_config.param_offload,
        "critic.model.fsdp_config.param_offload": critic_fsdp.param_offload,
        "critic.model.fsdp_config.optimizer_offload": critic_fsdp.optimizer_offload,
    }
    offloaded = [key for key, on in switches.items() if on]
    if device == "cpu" and offloaded:
        notes.append(f"on CPU the device memory is the host memory: {', '.join(offloaded)} saves nothing (not counted)")
    if int(config.actor_rollout_ref.model.lora_rank) > 0 and needs_reference_policy(config):
        notes.append("the reference is the actor with its LoRA adapters off: no copy of its own")
    if config.reward_model.reward_manager == "judge":
        notes.append("the LLM judge of reward_model.reward_manager=judge is not planned")
    if device == "cpu" and config.trainer.cpu_malloc_reuse:
        notes.append(
            f"trainer.cpu_malloc_reuse=true keeps freed memory resident for speed: "
            f"{CPU_MALLOC_KEPT_GB} GB per process counted (process/malloc_kept); false for the leanest run"
        )
    section = config.distillation
    if section.enabled and section.nnodes > 0:
        notes.append(
            f"the distillation teachers run on a pool of their own (distillation.nnodes={section.nnodes} x "
            f"n_gpus_per_node={section.n_gpus_per_node}): not in this plan of the trainer's workers"
        )
    return notes


def build_plan(config, device_memory_gb: float | None = None) -> MemoryPlan:
    """The memory plan of a typed PPO config (auto dtypes resolved), for ``device_memory_gb``
    GiB per device (None: :func:`default_device_memory_gb`).

    Raises:
        ConfigError: a size that makes no sense (naming its key), the batch-size rules;
        ModelPathError / ModelConfigError: a model path without config.json, an unknown architecture.
    """
    device = plan_device(config)
    cuda = device == "cuda"
    trainer = config.trainer
    workers = at_least("trainer.nnodes", trainer.nnodes, 1) * at_least(
        "trainer.n_gpus_per_node", trainer.n_gpus_per_node, 1
    )
    if device_memory_gb is None:
        device_memory_gb = default_device_memory_gb(config, device)
    _lengths(config)
    use_critic = needs_critic(config)
    check_batch_sizes(config, workers, use_critic)
    n = int(config.actor_rollout_ref.rollout.n)
    train_micro = worker_batch_sizes(config.actor_rollout_ref.actor, n, workers).ppo_micro_batch_size_per_gpu
    filtering = bool(config.algorithm.filter_groups.enable)
    batch = (filtering and config.data.gen_batch_size) or config.data.train_batch_size
    per_worker_rows = math.ceil(int(batch) * n / workers)
    shape = _shape(MODEL, config.actor_rollout_ref.model)
    actor = _actor_role(config, workers, cuda, shape, train_micro)
    inputs = PlanInputs(
        device=device,
        workers=workers,
        device_memory_gb=float(device_memory_gb),
        baseline_gb=CUDA_PROCESS_BASELINE_GB if cuda else CPU_PROCESS_BASELINE_GB,
        malloc_kept_gb=CPU_MALLOC_KEPT_GB if device == "cpu" and config.trainer.cpu_malloc_reuse else 0.0,
        actor=actor,
        rollout=_rollout(config, float(device_memory_gb), cuda, actor, per_worker_rows, workers),
        reference=(
            _reference_role(config, workers, cuda, actor, train_micro) if needs_reference_policy(config) else None
        ),
        critic=_critic_role(config, workers, cuda) if use_critic else None,
        reward_model=_reward_model_role(config, workers, cuda, per_worker_rows) if config.reward_model.enable else None,
        teachers=_teacher_roles(config, workers, cuda, train_micro),
        notes=tuple(_notes(config, device, workers)),
    )
    return make_plan(inputs)
