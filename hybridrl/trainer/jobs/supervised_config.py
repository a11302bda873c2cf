"""The ``sft_trainer`` and ``rm_trainer`` configs, typed.

Built once at start-up from the composed YAML with :func:`sft_config` / :func:`rm_config`
(``hybridrl.config.typed.to_dataclass``: a key without a field, or a value of the wrong type, is
one line). Defaults equal the packaged YAML (a test keeps them equal, key for key). Rules on one
section live in its ``__post_init__``; :meth:`SFTConfig.validate` holds the one rule that needs
the number of workers. verl keys accepted for compatibility but meaningless here carry their
reason as field metadata (:func:`ignored`), and :func:`ignored_notes` reports those that were set.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hybridrl.config.rules import two_spellings
from hybridrl.config.typed import IGNORED, REFUSED, ignored, refused, to_dataclass
from hybridrl.data.config import ClassRefConfig
from hybridrl.errors import ConfigError
from hybridrl.workers.config.fsdp import CheckpointConfig
from hybridrl.workers.optim import LR_SCHEDULES

__all__ = ["SFTConfig", "RMConfig", "sft_config", "rm_config", "ignored_notes", "refused_errors"]


def _choice(key: str, value, allowed: tuple) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not one of {', '.join(allowed)}")


def _whole_numbers(section: str, obj, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(obj, name)
        if value < 1:
            raise ConfigError(f"{section}.{name}={value!r} must be a whole number >= 1")


# ---------------------------------------------------------------- shared sections


@dataclass
class MixedPrecisionConfig:
    """``param_dtype``: the forward's compute dtype (autocast; the weights stay ``model_dtype``)."""

    param_dtype: str = "auto"


@dataclass
class SupervisedOptimConfig:
    """``optim`` of ``sft_trainer.yaml`` / ``rm_trainer.yaml`` (verl's SFT keys, not the PPO roles'
    :class:`hybridrl.workers.config.OptimConfig`): AdamW, linear warmup over ``lr_warmup_steps``
    (when > 0) or ``warmup_steps_ratio`` of the steps, then ``cosine`` (down to ``min_lr_ratio``),
    ``constant`` or ``wsd`` (:func:`hybridrl.workers.optim.lr_factor`); gradients clipped to
    ``clip_grad``. The worker reads these fields; :class:`SFTOptimConfig` folds verl's other
    spellings into them."""

    lr: float = 1e-5
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])
    weight_decay: float = 0.01
    warmup_steps_ratio: float = 0.1
    clip_grad: float = 1.0
    lr_scheduler: str = "cosine"
    lr_warmup_steps: int = -1
    min_lr_ratio: float = 0.0
    num_cycles: float = 0.5
    zero_indexed_step: bool = True

    def __post_init__(self):
        if not 0 <= self.warmup_steps_ratio <= 1:
            raise ConfigError(f"optim.warmup_steps_ratio={self.warmup_steps_ratio!r} must be a number in [0, 1]")
        if self.clip_grad <= 0:
            raise ConfigError(f"optim.clip_grad={self.clip_grad!r} must be a positive number")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"optim.min_lr_ratio={self.min_lr_ratio!r} must be a number in [0, 1]")
        _choice("optim.lr_scheduler", self.lr_scheduler, LR_SCHEDULES)


_ADAMW = "only torch.optim.AdamW is built here"


@dataclass
class SFTOptimConfig(SupervisedOptimConfig):
    """``optim`` of ``hybridrl sft``: the keys of :class:`SupervisedOptimConfig` in verl's
    ``fsdp_sft_trainer`` spelling, and verl's current (engine) spelling of the same settings:
    ``lr_warmup_steps_ratio`` (for ``warmup_steps_ratio``), ``lr_scheduler_type`` and its
    deprecated ``warmup_style`` (for ``lr_scheduler``); null: unset. Setting both spellings of one
    setting to different values is an error."""

    lr_warmup_steps_ratio: Optional[float] = None
    lr_scheduler_type: Optional[str] = None
    warmup_style: Optional[str] = None
    optimizer: str = refused("AdamW", f"optimizers other than AdamW ({_ADAMW})")
    optimizer_impl: str = refused("torch.optim", f"optimizer modules other than torch.optim ({_ADAMW})")
    override_optimizer_config: Optional[Dict[str, Any]] = refused(None, "extra optimizer arguments")
    total_training_steps: int = ignored(
        -1, "the schedule's length is the run's (trainer.total_training_steps or the epochs)"
    )

    def __post_init__(self):
        self.warmup_steps_ratio = two_spellings(
            "optim.warmup_steps_ratio",
            self.warmup_steps_ratio,
            0.1,
            "optim.lr_warmup_steps_ratio",
            self.lr_warmup_steps_ratio,
        )
        style = two_spellings(
            "optim.warmup_style", self.warmup_style, None, "optim.lr_scheduler_type", self.lr_scheduler_type
        )
        self.lr_scheduler = two_spellings(
            "optim.lr_scheduler", self.lr_scheduler, "cosine", "optim.lr_scheduler_type", style
        )
        super().__post_init__()


AFTER_EACH_EPOCH = "after_each_epoch"  # verl's SFT trainer: a save_freq / test_freq of one epoch's steps


def steps_of(freq, steps_per_epoch: int) -> int:
    """A ``trainer.save_freq`` / ``test_freq`` in steps: ``after_each_epoch`` is one epoch's."""
    return steps_per_epoch if freq == AFTER_EACH_EPOCH else int(freq)


@dataclass
class TrainerConfig:
    """``trainer``: where the run writes, how long it trains, where its workers run."""

    device: str = "auto"
    default_local_dir: str = "checkpoints/hybridrl/reward_model"
    project_name: str = "hybridrl"
    experiment_name: str = "reward_model"
    total_epochs: int = 1
    total_training_steps: Optional[int] = None
    logger: Any = field(default_factory=lambda: ["console", "file"])
    seed: int = 1
    save_freq: Any = -1  # steps between checkpoints; -1: never; "after_each_epoch" (verl's SFT trainer)
    test_freq: Any = -1  # steps between validations; -1: never; "after_each_epoch"
    val_before_train: bool = True
    max_ckpt_to_keep: Optional[int] = None
    resume_mode: str = "auto"
    resume_from_path: Optional[str] = None
    nnodes: int = 1
    n_gpus_per_node: int = 1
    backend: str = "auto"
    cpu_threads_per_worker: int = 1
    cpu_malloc_reuse: bool = True
    dist_timeout_s: float = 600

    def __post_init__(self):
        for key in ("save_freq", "test_freq"):
            value = getattr(self, key)
            if value != AFTER_EACH_EPOCH and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(
                    f"trainer.{key}={value!r} must be a whole number of steps (-1: never) or {AFTER_EACH_EPOCH}"
                )
        _choice("trainer.resume_mode", self.resume_mode, ("auto", "disable", "resume_path"))
        _choice("trainer.backend", self.backend, ("auto", "local", "ray"))
        if self.resume_mode == "resume_path" and not self.resume_from_path:
            raise ConfigError("trainer.resume_mode=resume_path needs trainer.resume_from_path=<a global_step_N folder>")
        if not self.total_training_steps and self.total_epochs < 1:
            raise ConfigError(
                f"trainer.total_epochs={self.total_epochs!r} must be >= 1 (or set trainer.total_training_steps)"
            )
        if self.nnodes < 1 or self.n_gpus_per_node < 1:
            raise ConfigError(
                f"trainer.nnodes={self.nnodes} and trainer.n_gpus_per_node={self.n_gpus_per_node} must both be >= 1"
            )

    @property
    def world_size(self) -> int:
        return self.nnodes * self.n_gpus_per_node


def _check_batches(data, divides: bool) -> None:
    """``train_batch_size``, ``micro_batch_size_per_gpu`` and ``max_length`` >= 1; the micro batch
    fits the batch (``divides``: and divides it)."""
    _whole_numbers("data", data, ("train_batch_size", "micro_batch_size_per_gpu", "max_length"))
    batch, micro = data.train_batch_size, data.micro_batch_size_per_gpu
    if divides and batch % micro:
        raise ConfigError(
            f"data.train_batch_size={batch} is not a multiple of data.micro_batch_size_per_gpu={micro}; "
            "pick a micro batch that divides the batch"
        )
    if micro > batch:
        raise ConfigError(
            f"data.micro_batch_size_per_gpu={micro} is larger than data.train_batch_size={batch}; lower it"
        )


def _check_world_size(config) -> None:
    batch, world_size = config.data.train_batch_size, config.trainer.world_size
    if batch % world_size:
        raise ConfigError(
            f"data.train_batch_size={batch} does not split over trainer.nnodes x trainer.n_gpus_per_node "
            f"= {world_size} workers; make it a multiple of {world_size}"
        )


# ---------------------------------------------------------------- sft_trainer


@dataclass
class MultiturnConfig:
    """``data.multiturn`` (verl's ``fsdp_sft_trainer`` spelling): ``enable`` reads rows of
    ``messages_key``; a ``tools_key`` / ``enable_thinking_key`` column, when the file has it, goes
    to the chat template as ``tools`` / ``enable_thinking``."""

    enable: bool = False
    messages_key: str = "messages"
    tools_key: str = "tools"
    enable_thinking_key: str = "enable_thinking"


_PAD_MODES = ("right", "no_padding")
_SAME_UPDATE = (
    "micro batches change memory and speed, not the update: the loss is normalised by the whole batch's token count"
)


@dataclass
class SFTDataConfig:
    """``data`` of ``hybridrl sft`` (docs/sft.md)."""

    train_files: Any = "~/data/gsm8k/train.parquet"
    val_files: Any = "~/data/gsm8k/test.parquet"
    prompt_key: str = "question"
    response_key: str = "answer"
    prompt_dict_keys: Optional[List[str]] = None
    response_dict_keys: Optional[List[str]] = None
    multiturn: MultiturnConfig = field(default_factory=MultiturnConfig)
    max_length: int = 1024
    truncation: str = "error"
    train_batch_size: int = 256
    micro_batch_size_per_gpu: int = 4
    chat_template: Optional[str] = None
    balance_dp_token: bool = ignored(
        False, "the loss is normalised by the token count of the whole batch over every worker"
    )
    use_shm: bool = ignored(False, "data and models load from their own paths")
    train_max_samples: int = -1
    val_max_samples: int = -1
    apply_chat_template_kwargs: Dict[str, Any] = field(default_factory=dict)
    custom_cls: ClassRefConfig = refused(factory=ClassRefConfig, subkeys={"path": "custom dataset classes"})
    micro_batch_size: Optional[int] = ignored(
        None, "verl's deprecated key; data.micro_batch_size_per_gpu sets the micro batch"
    )
    # verl's current (engine) spelling: rows are multi-turn, read from messages_key (null: unset)
    messages_key: Optional[str] = None
    tools_key: Optional[str] = None
    enable_thinking_key: Optional[str] = None
    enable_thinking_default: Any = None
    max_token_len_per_gpu: int = ignored(8192, _SAME_UPDATE)
    use_dynamic_bsz: bool = ignored(True, _SAME_UPDATE)
    pad_mode: str = ignored("no_padding", "micro batches are cut to their longest row (same results as either mode)")
    num_workers: int = ignored(8, "rows are tokenized once at start-up and served from memory")
    ignore_input_ids_mismatch: bool = ignored(
        False,
        "the conversation is templated once as a whole, so no per-turn token ids can mismatch; a template "
        "that renders earlier turns differently stops the run with a line saying so",
    )

    def __post_init__(self):
        _check_batches(self, divides=False)
        _choice("data.truncation", self.truncation, ("error", "left", "right"))
        _choice("data.pad_mode", self.pad_mode, _PAD_MODES)
        if self.enable_thinking_default not in (None, "none", True, False):
            raise ConfigError(
                f"data.enable_thinking_default={self.enable_thinking_default!r} is not one of none, true, false"
            )
        multi = self.multiturn
        if self.messages_key is not None:
            if multi.enable and multi.messages_key != self.messages_key:
                two_spellings(
                    "data.multiturn.messages_key", multi.messages_key, None, "data.messages_key", self.messages_key
                )
            multi.enable, multi.messages_key = True, self.messages_key
        multi.tools_key = two_spellings(
            "data.multiturn.tools_key", multi.tools_key, "tools", "data.tools_key", self.tools_key
        )
        multi.enable_thinking_key = two_spellings(
            "data.multiturn.enable_thinking_key",
            multi.enable_thinking_key,
            "enable_thinking",
            "data.enable_thinking_key",
            self.enable_thinking_key,
        )


@dataclass
class WrapPolicyConfig:
    min_num_params: int = ignored(0, "FSDP2 shards every decoder block")


@dataclass
class QATConfig:
    enable: bool = refused(False, "quantization-aware training")
    mode: str = ignored("w4a16", "only read with engine.qat.enable")
    group_size: int = ignored(16, "only read with engine.qat.enable")
    ignore_patterns: List[str] = ignored(
        reason="only read with engine.qat.enable", factory=lambda: ["lm_head", "embed_tokens", "re:.*mlp.gate$"]
    )
    activation_observer: str = ignored("static_minmax", "only read with engine.qat.enable")
    quantization_config_path: Optional[str] = ignored(None, "only read with engine.qat.enable")


_OFFLOAD = "no parameter offload for SFT in this build"
_NO_ENTROPY = "SFT computes no entropy"
_SPEED = "it changes speed or memory, not the update"


def _turbo_defaults() -> dict:
    plan = {
        "param_dtype": "bf16",
        "reduce_dtype": "fp32",
        "output_dtype": "bf16",
        "fsdp_implementation": "native",
        "num_to_forward_prefetch": 1,
        "num_to_backward_prefetch": 1,
    }
    parallel = ("fully_shard_parallel_size", "tensor_parallel_size", "expert_parallel_size")
    sizes = {name: 16 if name == "fully_shard_parallel_size" else 1 for name in parallel}
    sizes.update(expert_fully_shard_parallel_size=1, ulysses_parallel_size=1)
    return {"distributed": {**sizes, "fsdp_plan": plan}}


@dataclass
class SFTEngineConfig:
    """``engine`` of verl's engine SFT trainer (``sft_trainer_engine.yaml``): ``model_dtype`` and
    ``dtype`` are the current spelling of ``model.fsdp_config.model_dtype`` /
    ``model.fsdp_config.mixed_precision.param_dtype`` (null: unset); the rest is FSDP tuning that
    does not change the update here."""

    wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)
    param_offload: bool = ignored(False, _OFFLOAD)
    optimizer_offload: bool = ignored(False, _OFFLOAD)
    offload_policy: bool = ignored(False, _OFFLOAD)
    reshard_after_forward: bool = ignored(True, "FSDP2 reshards after the forward")
    fsdp_size: int = ignored(-1, "FSDP2 shards over every worker")
    forward_prefetch: bool = ignored(False, "FSDP1 only")
    model_dtype: Optional[str] = None
    use_orig_params: bool = ignored(False, "FSDP1 only")
    seed: int = ignored(42, "trainer.seed seeds the run")
    full_determinism: bool = refused(False, "deterministic CUDA kernels (torch.use_deterministic_algorithms)")
    ulysses_sequence_parallel_size: int = ignored(1, "no sequence parallelism for SFT in this build")
    entropy_from_logits_with_chunking: bool = ignored(False, _NO_ENTROPY)
    entropy_from_logits_chunk_size: int = ignored(2048, _NO_ENTROPY)
    use_torch_compile: bool = ignored(True, "the model runs eagerly")
    entropy_checkpointing: bool = ignored(False, _NO_ENTROPY)
    forward_only: bool = ignored(False, "verl sets it for its own forward-only engines; SFT trains")
    strategy: str = ignored("fsdp", "FSDP2 shards the model over more than one worker")
    dtype: Optional[str] = None
    use_no_sync_for_gradient_accumulation: bool = ignored(False, _SPEED)
    pad_to_length: bool = ignored(False, _SPEED)
    pad_to_length_bucket: int = ignored(1024, _SPEED)
    qat: QATConfig = field(default_factory=QATConfig)
    turbo_config: Dict[str, Any] = ignored(
        reason="only read with engine.strategy=fsdp_turbo, which this build does not have", factory=_turbo_defaults
    )

    def __post_init__(self):
        _choice("engine.strategy", self.strategy, ("fsdp", "fsdp2"))
        if self.dtype in ("float16", "fp16"):
            raise ConfigError(
                f"engine.dtype={self.dtype!r} asks for fp16 mixed precision (it needs a loss scaler), which "
                "hybridrl sft does not have; use bfloat16 or float32"
            )
        if self.dtype is not None:
            _choice("engine.dtype", self.dtype, tuple(ENGINE_DTYPES))


# verl's engine.dtype -> model.fsdp_config.mixed_precision.param_dtype (float16 needs a loss scaler: refused)
ENGINE_DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "float32": "fp32", "fp32": "fp32"}


@dataclass
class SFTFSDPConfig:
    model_dtype: str = "fp32"
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)
    wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)
    cpu_offload: bool = ignored(False, "no parameter offload for SFT in this build")
    offload_params: bool = ignored(False, "no parameter offload for SFT in this build")


_DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


@dataclass
class FusedKernelOptions:
    impl_backend: str = ignored("torch", "no fused kernels in this build")


@dataclass
class TiledMLPConfig:
    enabled: bool = ignored(False, "the MLP runs whole (TiledMLP only lowers peak memory)")
    num_shards: int = ignored(4, "only read with model.tiled_mlp.enabled")


_MTP = "only read with model.mtp.enable"


@dataclass
class MTPConfig:
    """verl's multi-token-prediction section (model/hf_model.yaml)."""

    enable: bool = refused(False, "multi-token prediction (MTP) layers")
    enable_train: bool = refused(False, "multi-token prediction (MTP) training")
    enable_rollout: bool = ignored(False, "SFT has no rollout")
    detach_encoder: bool = ignored(False, _MTP)
    mtp_loss_scaling_factor: float = ignored(0.1, _MTP)
    speculative_algorithm: str = ignored("EAGLE", _MTP)
    speculative_num_steps: int = ignored(2, _MTP)
    speculative_eagle_topk: int = ignored(2, _MTP)
    speculative_num_draft_tokens: int = ignored(4, _MTP)
    method: str = ignored("mtp", _MTP)
    num_speculative_tokens: int = ignored(1, _MTP)


# verl 0.9.1's model.lora (model/hf_model.yaml), read by its Megatron engine
MEGATRON_LORA_DEFAULTS: Dict[str, Any] = {
    "type": "lora",
    "merge": False,
    "rank": 0,
    "alpha": 32,
    "dropout": 0.0,
    "target_modules": ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"],
    "exclude_modules": [],
    "dropout_position": "pre",
    "lora_A_init_method": "xavier",
    "lora_B_init_method": "zero",
    "a2a_experimental": False,
    "dtype": None,
    "adapter_path": None,
    "freeze_vision_model": True,
    "freeze_vision_projection": True,
    "freeze_language_model": True,
}


@dataclass
class SFTModelConfig:
    """``model`` of ``hybridrl sft``: the causal LM and, with ``lora_rank > 0``, its LoRA adapters."""

    partial_pretrain: str = _DEFAULT_MODEL
    external_lib: Optional[str] = None
    enable_gradient_checkpointing: bool = True
    trust_remote_code: bool = False
    lora_rank: int = 0
    lora_alpha: float = 16
    target_modules: Any = "all-linear"
    use_liger: bool = ignored(False, "no Liger kernels in this build")
    use_shm: bool = ignored(False, "models load from their own path")
    fsdp_config: SFTFSDPConfig = field(default_factory=SFTFSDPConfig)
    strategy: str = ignored("fsdp2", "FSDP2 shards the model over more than one worker")
    # verl's current (engine) spelling, model/hf_model.yaml; path and custom_chat_template: null unset
    path: Optional[str] = None
    tokenizer_path: Optional[str] = None
    custom_chat_template: Optional[str] = None
    override_config: Dict[str, Any] = field(default_factory=dict)
    exclude_modules: Any = None
    hf_config_path: Optional[str] = refused(None, "a model config from another folder than the weights")
    lora_adapter_path: Optional[str] = refused(None, "starting from a saved LoRA adapter")
    enable_activation_offload: bool = ignored(False, "activations stay in device memory")
    use_remove_padding: bool = ignored(True, "micro batches are cut to their longest row instead (same results)")
    use_fused_kernels: bool = ignored(False, "no fused kernels in this build")
    fused_kernel_options: FusedKernelOptions = field(default_factory=FusedKernelOptions)
    tiled_mlp: TiledMLPConfig = field(default_factory=TiledMLPConfig)
    mtp: MTPConfig = field(default_factory=MTPConfig)
    lora: Dict[str, Any] = ignored(
        reason="Megatron's LoRA section; LoRA here is model.lora_rank / lora_alpha / target_modules "
        "(verl's FSDP engine reads those too)",
        factory=lambda: dict(MEGATRON_LORA_DEFAULTS),
    )

    def __post_init__(self):
        self.partial_pretrain = two_spellings(
            "model.partial_pretrain", self.partial_pretrain, _DEFAULT_MODEL, "model.path", self.path
        )
        if self.lora_rank < 0:
            raise ConfigError(
                f"model.lora_rank={self.lora_rank!r} must be 0 (full fine-tuning) or a positive whole number"
            )


_PROFILER = "only read with profiler.enable, which hybridrl sft refuses"


def _profiler_tools() -> dict:
    token_range = {"profile_token_start": None, "profile_token_end": None}
    schedule = {"skip_first": 0, "wait": 0, "warmup": 0, "active": 0, "repeat": 0}
    return {
        "npu": {"contents": [], "level": "level0", "analysis": True, "discrete": False, "name": "npu", **token_range},
        "nsys": {"discrete": None, "name": "nsight"},
        "torch": {"contents": [], "discrete": False, "name": "torch", **token_range, "schedule": schedule},
        "torch_memory": {
            "trace_alloc_max_entries": 100000,
            "stack_depth": 32,
            "memory_snapshot_num_steps": 1,
            "name": "torch_memory",
        },
        "precision_debugger": {"config_path": None, "steps": None, "stages": None, "name": "precision_debugger"},
    }


@dataclass
class ProfilerConfig:
    """verl's ``profiler`` section (profiler/profiler.yaml)."""

    tool: str = ignored("torch", _PROFILER)
    enable: bool = refused(
        False, "the profiler (use py-spy or torch.profiler around hybridrl.trainer.sft_trainer.main)"
    )
    all_ranks: bool = ignored(False, _PROFILER)
    ranks: List[int] = ignored(reason=_PROFILER, factory=list)
    save_path: str = ignored("outputs/profile", _PROFILER)
    relocate_results: bool = ignored(False, _PROFILER)
    finish_hook_cmd: Optional[str] = ignored(None, _PROFILER)
    finish_hook_all_ranks: bool = ignored(False, _PROFILER)
    finish_hook_ranks: List[int] = ignored(reason=_PROFILER, factory=list)
    tool_config: Dict[str, Any] = ignored(reason=_PROFILER, factory=_profiler_tools)


@dataclass
class SFTTrainerConfig(TrainerConfig):
    default_local_dir: str = "checkpoints/gsm8k-sft/test"
    project_name: str = "gsm8k-sft"
    experiment_name: str = "test"
    total_epochs: int = 4
    default_hdfs_dir: Optional[str] = ignored(None, "checkpoints stay in trainer.default_local_dir")
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    balance_batch: bool = ignored(True, "every worker's update is normalised by the whole batch's token count")
    profile_interval: List[int] = ignored(reason=_PROFILER, factory=lambda: [-1, -1])


@dataclass
class SFTConfig:
    """The whole ``sft_trainer`` config (``hybridrl/config/sft_trainer.yaml``)."""

    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    model: SFTModelConfig = field(default_factory=SFTModelConfig)
    optim: SFTOptimConfig = field(default_factory=SFTOptimConfig)
    ulysses_sequence_parallel_size: int = ignored(1, "no sequence parallelism in this build")
    use_remove_padding: bool = ignored(False, "micro batches are cut to their longest row instead (same results)")
    trainer: SFTTrainerConfig = field(default_factory=SFTTrainerConfig)
    # verl's engine SFT trainer (sft_trainer_engine.yaml)
    engine: SFTEngineConfig = field(default_factory=SFTEngineConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)

    def __post_init__(self):
        """Folds verl's engine spellings that live in another section than the older key."""
        self.data.chat_template = two_spellings(
            "data.chat_template",
            self.data.chat_template,
            None,
            "model.custom_chat_template",
            self.model.custom_chat_template,
        )
        fsdp = self.model.fsdp_config
        fsdp.model_dtype = two_spellings(
            "model.fsdp_config.model_dtype", fsdp.model_dtype, "fp32", "engine.model_dtype", self.engine.model_dtype
        )
        if self.engine.dtype is not None:  # the compute dtype (``auto`` is resolved before the config is typed)
            fsdp.mixed_precision.param_dtype = ENGINE_DTYPES[self.engine.dtype]
        _check_world_size(self)
        errors = refused_errors(self)
        if errors:
            raise ConfigError(errors[0])


# ---------------------------------------------------------------- rm_trainer


@dataclass
class RMDataConfig:
    """``data`` of ``hybridrl rm`` (docs/rlhf.md)."""

    train_files: Any = "~/data/hh_rlhf/train.parquet"
    val_files: Any = "~/data/hh_rlhf/test.parquet"
    prompt_key: str = "prompt"
    chosen_key: str = "chosen"
    rejected_key: str = "rejected"
    margin_key: Optional[str] = None
    max_length: int = 512
    truncation: str = "left"
    train_batch_size: int = 32
    micro_batch_size_per_gpu: int = 4
    chat_template: Optional[str] = None
    train_max_samples: int = -1
    val_max_samples: int = -1
    seed: int = 1

    def __post_init__(self):
        _check_batches(self, divides=True)
        _choice("data.truncation", self.truncation, ("left", "drop", "error"))


@dataclass
class RMFSDPConfig:
    model_dtype: str = "fp32"
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)


@dataclass
class RMModelConfig:
    """``model`` of ``hybridrl rm``: the backbone the scalar head goes on."""

    path: Optional[str] = "HuggingFaceTB/SmolLM2-135M-Instruct"
    external_lib: Optional[str] = None
    override_config: Dict[str, Any] = field(default_factory=dict)
    enable_gradient_checkpointing: bool = False
    trust_remote_code: bool = False
    fsdp_config: RMFSDPConfig = field(default_factory=RMFSDPConfig)

    def __post_init__(self):
        if not self.path:
            raise ConfigError(
                "model.path is not set; set it to the backbone (an HF folder, a .gguf file, "
                "or HuggingFaceTB/SmolLM2-135M-Instruct)"
            )


@dataclass
class RMConfig:
    """The whole ``rm_trainer`` config (``hybridrl/config/rm_trainer.yaml``)."""

    data: RMDataConfig = field(default_factory=RMDataConfig)
    model: RMModelConfig = field(default_factory=RMModelConfig)
    optim: SupervisedOptimConfig = field(default_factory=SupervisedOptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    def __post_init__(self):
        _check_world_size(self)


# ---------------------------------------------------------------- building


def sft_config(config) -> SFTConfig:
    """The composed ``sft_trainer`` config, typed.

    Raises:
        ConfigError: a key without a field, a value of the wrong type, or a broken rule (one line
            naming the key, the value and what to change).
    """
    return to_dataclass(SFTConfig, config, "")


def rm_config(config) -> RMConfig:
    """The composed ``rm_trainer`` config, typed (raises as :func:`sft_config`)."""
    return to_dataclass(RMConfig, config, "")


def _default(f: dataclasses.Field):
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _changed(value, f: dataclasses.Field) -> bool:
    """Whether ``value`` differs from the field's default (a ``${...}`` default copies another key)."""
    default = _default(f)
    return not (isinstance(default, str) and default.startswith("${")) and value != default


def ignored_notes(config, prefix: str = "") -> list[str]:
    """``"<key>=<value> is ignored: <reason>"`` for each :func:`ignored` field set to a value other
    than its default, nested sections included."""
    notes = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            notes += ignored_notes(value, f"{prefix}{f.name}.")
        elif IGNORED in f.metadata and _changed(value, f):
            reason, _ = f.metadata[IGNORED]
            notes.append(f"{prefix}{f.name}={value!r} is ignored: {reason}")
    return notes


def refused_errors(config, prefix: str = "") -> list[str]:
    """One line for each :func:`refused` field (or refused key inside a section) set to a value
    other than its default: the key, its value and the feature this build does not have."""
    errors = []
    for f in dataclasses.fields(config):
        value, key = getattr(config, f.name), f"{prefix}{f.name}"
        marks = f.metadata.get(REFUSED)
        if isinstance(marks, dict):  # refused keys inside a section
            defaults = _default(f)
            for sub, feature in marks.items():
                if getattr(value, sub) != getattr(defaults, sub):
                    errors.append(_refusal(f"{key}.{sub}", getattr(value, sub), feature))
        elif marks is not None and _changed(value, f):
            errors.append(_refusal(key, value, marks))
        elif dataclasses.is_dataclass(value):
            errors += refused_errors(value, f"{key}.")
    return errors


def _refusal(key: str, value, feature: str) -> str:
    return f"{key}={value!r} asks for {feature}, which hybridrl sft does not have; remove {key}"
