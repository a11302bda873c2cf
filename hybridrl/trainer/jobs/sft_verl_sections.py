"""verl's SFT config sections that only carry its keys: the engine trainer's ``engine`` section,
the model's fused-kernel, tiled-MLP, multi-token-prediction and Megatron LoRA keys, and the
``profiler`` section. Each key is accepted with its verl default and carries why it changes
nothing here (:func:`~hybridrl.config.typed.ignored`) or which missing feature refuses it
(:func:`~hybridrl.config.typed.refused`); ``engine.dtype`` / ``engine.model_dtype`` are read
(:data:`ENGINE_DTYPES`). Split from :mod:`.supervised_config`, which builds them in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hybridrl.config.rules import one_of
from hybridrl.config.typed import ignored, refused
from hybridrl.errors import ConfigError


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
        one_of("engine.strategy", self.strategy, ("fsdp", "fsdp2"))
        if self.dtype in ("float16", "fp16"):
            raise ConfigError(
                f"engine.dtype={self.dtype!r} asks for fp16 mixed precision (it needs a loss scaler), which "
                "hybridrl sft does not have; use bfloat16 or float32"
            )
        if self.dtype is not None:
            one_of("engine.dtype", self.dtype, tuple(ENGINE_DTYPES))


# verl's engine.dtype -> model.fsdp_config.mixed_precision.param_dtype (float16 needs a loss scaler: refused)
ENGINE_DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "float32": "fp32", "fp32": "fp32"}


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


PROFILER_ONLY = "only read with profiler.enable, which hybridrl sft refuses"


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

    tool: str = ignored("torch", PROFILER_ONLY)
    enable: bool = refused(
        False, "the profiler (use py-spy or torch.profiler around hybridrl.trainer.sft_trainer.main)"
    )
    all_ranks: bool = ignored(False, PROFILER_ONLY)
    ranks: List[int] = ignored(reason=PROFILER_ONLY, factory=list)
    save_path: str = ignored("outputs/profile", PROFILER_ONLY)
    relocate_results: bool = ignored(False, PROFILER_ONLY)
    finish_hook_cmd: Optional[str] = ignored(None, PROFILER_ONLY)
    finish_hook_all_ranks: bool = ignored(False, PROFILER_ONLY)
    finish_hook_ranks: List[int] = ignored(reason=PROFILER_ONLY, factory=list)
    tool_config: Dict[str, Any] = ignored(reason=PROFILER_ONLY, factory=_profiler_tools)
