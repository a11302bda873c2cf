"""The ``model`` sections of the PPO roles, typed (verl's ``HFModelConfig``): which HF model a
role loads and how (LoRA, packing, gradient checkpointing)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from hybridrl.config.rules import number_above, plain
from hybridrl.config.typed import ignored
from hybridrl.errors import ConfigError

from .fsdp import FSDPConfig, TrainingFSDPConfig

_OWN_PATH = "models load from their own path"
_IN_MEMORY = "activations stay in memory"
_NO_FUSED = "no fused kernels in this build"

__all__ = ["FusedKernelConfig", "PolicyModelConfig", "CriticModelConfig", "RewardModelModelConfig"]


def check_lora(prefix: str, model) -> None:
    """``<prefix>.lora_rank`` / ``lora_alpha`` / ``target_modules`` of a model section: rank 0
    (full fine-tuning) or LoRA with a positive alpha and the modules to adapt.

    Raises:
        ConfigError: one line naming the key, what is wrong and the usual values.
    """
    rank = model.lora_rank
    if rank < 0:
        raise ConfigError(
            f"{prefix}.lora_rank={rank!r} must be 0 (full fine-tuning) or a whole number > 0 (8-64 is usual)"
        )
    if rank == 0:
        return
    if not number_above(model.lora_alpha, 0):
        raise ConfigError(
            f"{prefix}.lora_alpha={model.lora_alpha!r} must be a number > 0 (the update is scaled by "
            "lora_alpha / lora_rank; 16 or 2 x lora_rank is usual)"
        )
    targets = plain(model.target_modules)
    names = [targets] if isinstance(targets, str) else targets
    if not isinstance(names, list) or not names or not all(isinstance(t, str) and t for t in names):
        raise ConfigError(
            f"{prefix}.target_modules={targets!r} must be all-linear or a list of module names, "
            "e.g. [q_proj,k_proj,v_proj,o_proj]"
        )


@dataclass
class FusedKernelConfig:
    impl_backend: str = ignored("torch", _NO_FUSED)


@dataclass
class PolicyModelConfig:
    """``actor_rollout_ref.model``: the policy (actor, rollout and reference share it).

    ``lora_rank`` > 0 trains LoRA adapters (``lora_alpha``, ``target_modules``: ``all-linear`` or
    a list of names, ``exclude_modules``: names or a regex) instead of the whole model;
    ``lora_adapter_path`` (verl's key) trains a saved peft adapter folder on, with its own rank and
    targets (the reference is the model without it).
    """

    path: str = "HuggingFaceTB/SmolLM2-135M-Instruct"
    custom_chat_template: Optional[str] = None
    use_shm: bool = ignored(False, _OWN_PATH)
    external_lib: Optional[str] = None
    override_config: Dict[str, Any] = field(default_factory=dict)
    enable_gradient_checkpointing: bool = True
    enable_activation_offload: bool = ignored(False, _IN_MEMORY)
    use_remove_padding: bool = True
    lora_rank: int = 0
    lora_alpha: float = 16
    target_modules: Any = "all-linear"
    exclude_modules: Any = None
    lora_adapter_path: Optional[str] = None
    use_liger: bool = ignored(False, "no Liger kernels in this build")
    use_fused_kernels: bool = ignored(False, _NO_FUSED)
    fused_kernel_options: FusedKernelConfig = field(default_factory=FusedKernelConfig)
    trust_remote_code: bool = False

    def __post_init__(self):
        check_lora("actor_rollout_ref.model", self)


@dataclass
class CriticModelConfig:
    """``critic.model``: the critic's backbone (the policy's by default) under a value head."""

    path: str = "${actor_rollout_ref.model.path}"
    use_shm: bool = ignored(False, _OWN_PATH)
    tokenizer_path: Optional[str] = ignored("${actor_rollout_ref.model.path}", "the critic reads the actor's token ids")
    override_config: Dict[str, Any] = field(default_factory=dict)
    external_lib: Optional[str] = "${actor_rollout_ref.model.external_lib}"
    enable_gradient_checkpointing: bool = True
    enable_activation_offload: bool = ignored(False, _IN_MEMORY)
    use_remove_padding: bool = True
    trust_remote_code: bool = "${actor_rollout_ref.model.trust_remote_code}"
    lora_rank: int = 0
    lora_alpha: float = 16
    target_modules: Any = "all-linear"
    exclude_modules: Any = None
    fsdp_config: TrainingFSDPConfig = field(default_factory=TrainingFSDPConfig)

    def validate(self) -> None:
        """The LoRA keys, checked when the critic trains (``algorithm.adv_estimator`` needs values).

        Raises:
            ConfigError: as :func:`check_lora`.
        """
        check_lora("critic.model", self)


@dataclass
class RewardModelModelConfig:
    """``reward_model.model``: a scalar-head reward model; ``input_tokenizer`` is the policy's
    (null: read the policy's token ids as they are)."""

    input_tokenizer: Optional[str] = "${actor_rollout_ref.model.path}"
    path: str = "~/models/FsfairX-LLaMA3-RM-v0.1"
    use_shm: bool = ignored(False, _OWN_PATH)
    external_lib: Optional[str] = "${actor_rollout_ref.model.external_lib}"
    use_remove_padding: bool = ignored(False, "not in this build yet (same results, only slower) for the reward model")
    use_fused_kernels: bool = ignored(False, _NO_FUSED)
    trust_remote_code: bool = False
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
