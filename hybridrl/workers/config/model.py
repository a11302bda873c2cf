"""The ``model`` sections of the PPO roles, typed (verl's ``HFModelConfig``): which HF model a
role loads and how (LoRA, packing, gradient checkpointing)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from .fsdp import RewardModelFSDPConfig, TrainingFSDPConfig

__all__ = ["FusedKernelConfig", "PolicyModelConfig", "CriticModelConfig", "RewardModelModelConfig"]


@dataclass
class FusedKernelConfig:
    impl_backend: str = "torch"


@dataclass
class PolicyModelConfig:
    """``actor_rollout_ref.model``: the policy (actor, rollout and reference share it).

    ``lora_rank`` > 0 trains LoRA adapters (``lora_alpha``, ``target_modules``: ``all-linear`` or
    a list of names, ``exclude_modules``: names or a regex) instead of the whole model.
    """

    path: str = "HuggingFaceTB/SmolLM2-135M-Instruct"
    custom_chat_template: Optional[str] = None
    use_shm: bool = False
    external_lib: Optional[str] = None
    override_config: Dict[str, Any] = field(default_factory=dict)
    enable_gradient_checkpointing: bool = True
    enable_activation_offload: bool = False
    use_remove_padding: bool = True
    lora_rank: int = 0
    lora_alpha: float = 16
    target_modules: Any = "all-linear"
    exclude_modules: Any = None
    use_liger: bool = False
    use_fused_kernels: bool = False
    fused_kernel_options: FusedKernelConfig = field(default_factory=FusedKernelConfig)
    trust_remote_code: bool = False


@dataclass
class CriticModelConfig:
    """``critic.model``: the critic's backbone (the policy's by default) under a value head."""

    path: str = "${actor_rollout_ref.model.path}"
    use_shm: bool = False
    tokenizer_path: Optional[str] = "${actor_rollout_ref.model.path}"
    override_config: Dict[str, Any] = field(default_factory=dict)
    external_lib: Optional[str] = "${actor_rollout_ref.model.external_lib}"
    enable_gradient_checkpointing: bool = True
    enable_activation_offload: bool = False
    use_remove_padding: bool = True
    trust_remote_code: bool = "${actor_rollout_ref.model.trust_remote_code}"
    lora_rank: int = 0
    lora_alpha: float = 16
    target_modules: Any = "all-linear"
    exclude_modules: Any = None
    fsdp_config: TrainingFSDPConfig = field(default_factory=TrainingFSDPConfig)


@dataclass
class RewardModelModelConfig:
    """``reward_model.model``: a scalar-head reward model; ``input_tokenizer`` is the policy's
    (null: read the policy's token ids as they are)."""

    input_tokenizer: Optional[str] = "${actor_rollout_ref.model.path}"
    path: str = "~/models/FsfairX-LLaMA3-RM-v0.1"
    use_shm: bool = False
    external_lib: Optional[str] = "${actor_rollout_ref.model.external_lib}"
    use_remove_padding: bool = False
    use_fused_kernels: bool = False
    trust_remote_code: bool = False
    fsdp_config: RewardModelFSDPConfig = field(default_factory=RewardModelFSDPConfig)
