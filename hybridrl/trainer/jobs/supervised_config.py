"""The ``sft_trainer`` and ``rm_trainer`` configs, typed.

Built once at start-up from the composed YAML with :func:`sft_config` / :func:`rm_config`
(``hybridrl.config.typed.to_dataclass``: a key without a field, or a value of the wrong type, is
one line). Defaults equal the packaged YAML (a test keeps them equal, key for key). Rules on one
section live in its ``__post_init__``; :meth:`SFTConfig.validate` holds the one rule that needs
the number of workers. verl keys accepted for compatibility but meaningless here carry their
reason as field metadata (:func:`ignored`), and :func:`ignored_notes` reports those that were set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hybridrl.config.rules import one_of, two_spellings
from hybridrl.config.typed import ignored, ignored_notes, refused, refused_errors, to_dataclass
from hybridrl.data.config import ClassRefConfig
from hybridrl.errors import ConfigError
from hybridrl.trainer.jobs.sft_verl_sections import (
    ENGINE_DTYPES,
    MEGATRON_LORA_DEFAULTS,
    PROFILER_ONLY,
    FusedKernelOptions,
    MTPConfig,
    ProfilerConfig,
    SFTEngineConfig,
    TiledMLPConfig,
    WrapPolicyConfig,
)
from hybridrl.workers.config.fsdp import CheckpointConfig
from hybridrl.workers.optim import LR_SCHEDULES

__all__ = ["SFTConfig", "RMConfig", "sft_config", "rm_config", "ignored_notes", "refused_errors"]


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
        one_of("optim.lr_scheduler", self.lr_scheduler, LR_SCHEDULES)


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
        one_of("trainer.resume_mode", self.resume_mode, ("auto", "disable", "resume_path"))
        one_of("trainer.backend", self.backend, ("auto", "local", "ray"))
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
        one_of("data.truncation", self.truncation, ("error", "left", "right"))
        one_of("data.pad_mode", self.pad_mode, _PAD_MODES)
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
class SFTFSDPConfig:
    model_dtype: str = "fp32"
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)
    wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)
    cpu_offload: bool = ignored(False, "no parameter offload for SFT in this build")
    offload_params: bool = ignored(False, "no parameter offload for SFT in this build")


_DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


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


@dataclass
class SFTTrainerConfig(TrainerConfig):
    default_local_dir: str = "checkpoints/gsm8k-sft/test"
    project_name: str = "gsm8k-sft"
    experiment_name: str = "test"
    total_epochs: int = 4
    default_hdfs_dir: Optional[str] = ignored(None, "checkpoints stay in trainer.default_local_dir")
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    balance_batch: bool = ignored(True, "every worker's update is normalised by the whole batch's token count")
    profile_interval: List[int] = ignored(reason=PROFILER_ONLY, factory=lambda: [-1, -1])


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
        one_of("data.truncation", self.truncation, ("left", "drop", "error"))


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
