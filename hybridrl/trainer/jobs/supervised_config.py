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

from hybridrl.config.typed import IGNORED, ignored, to_dataclass
from hybridrl.errors import ConfigError

__all__ = ["SFTConfig", "RMConfig", "sft_config", "rm_config", "ignored_notes"]


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
    :class:`hybridrl.workers.config.OptimConfig`): AdamW, linear warmup over ``warmup_steps_ratio``
    of the steps, then ``cosine`` (down to 0) or ``constant``; gradients clipped to ``clip_grad``."""

    lr: float = 1e-5
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])
    weight_decay: float = 0.01
    warmup_steps_ratio: float = 0.1
    clip_grad: float = 1.0
    lr_scheduler: str = "cosine"

    def __post_init__(self):
        if not 0 <= self.warmup_steps_ratio <= 1:
            raise ConfigError(f"optim.warmup_steps_ratio={self.warmup_steps_ratio!r} must be a number in [0, 1]")
        if self.clip_grad <= 0:
            raise ConfigError(f"optim.clip_grad={self.clip_grad!r} must be a positive number")
        _choice("optim.lr_scheduler", self.lr_scheduler, ("cosine", "constant"))


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
    save_freq: int = -1
    test_freq: int = -1
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
    enable: bool = False
    messages_key: str = "messages"


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

    def __post_init__(self):
        _check_batches(self, divides=False)
        _choice("data.truncation", self.truncation, ("error", "left", "right"))


@dataclass
class WrapPolicyConfig:
    min_num_params: int = ignored(0, "FSDP2 shards every decoder block")


@dataclass
class SFTFSDPConfig:
    model_dtype: str = "fp32"
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)
    wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)
    cpu_offload: bool = ignored(False, "no parameter offload for SFT in this build")
    offload_params: bool = ignored(False, "no parameter offload for SFT in this build")


@dataclass
class SFTModelConfig:
    """``model`` of ``hybridrl sft``: the causal LM and, with ``lora_rank > 0``, its LoRA adapters."""

    partial_pretrain: str = "HuggingFaceTB/SmolLM2-135M-Instruct"
    external_lib: Optional[str] = None
    enable_gradient_checkpointing: bool = True
    trust_remote_code: bool = False
    lora_rank: int = 0
    lora_alpha: float = 16
    target_modules: Any = "all-linear"
    use_liger: bool = ignored(False, "no Liger kernels in this build")
    use_shm: bool = ignored(False, "models load from their own path")
    fsdp_config: SFTFSDPConfig = field(default_factory=SFTFSDPConfig)

    def __post_init__(self):
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


@dataclass
class SFTConfig:
    """The whole ``sft_trainer`` config (``hybridrl/config/sft_trainer.yaml``)."""

    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    model: SFTModelConfig = field(default_factory=SFTModelConfig)
    optim: SupervisedOptimConfig = field(default_factory=SupervisedOptimConfig)
    ulysses_sequence_parallel_size: int = ignored(1, "no sequence parallelism in this build")
    use_remove_padding: bool = ignored(False, "micro batches are cut to their longest row instead (same results)")
    trainer: SFTTrainerConfig = field(default_factory=SFTTrainerConfig)

    def __post_init__(self):
        _check_world_size(self)


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


def ignored_notes(config, prefix: str = "") -> list[str]:
    """``"<key>=<value> is ignored: <reason>"`` for each :func:`ignored` field set to a value other
    than its default, nested sections included."""
    notes = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            notes += ignored_notes(value, f"{prefix}{f.name}.")
        elif IGNORED in f.metadata and value != f.default:
            reason, _ = f.metadata[IGNORED]
            notes.append(f"{prefix}{f.name}={value!r} is ignored: {reason}")
    return notes
