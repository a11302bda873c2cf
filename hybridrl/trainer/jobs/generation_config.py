"""The ``generation`` config (``hybridrl generate``), typed.

:func:`generation_config` builds it once at start-up from the composed YAML
(``hybridrl/config/generation.yaml``) with ``hybridrl.config.typed.to_dataclass``: a key without a
field, or a value of the wrong type, is one line. Defaults equal the YAML's (a test keeps them
equal, key for key). The ``rollout`` section is an :class:`~hybridrl.workers.config.EngineConfig`
with generation's defaults, so the rollout engines read the same typed fields as in PPO.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from hybridrl.config.typed import to_dataclass
from hybridrl.trainer.ppo.config import RayInitConfig
from hybridrl.workers.config import EngineConfig

__all__ = ["GenerationConfig", "GenerationRolloutConfig", "generation_config"]


@dataclass
class GenerationTrainerConfig:
    """``trainer``: ``device`` (cpu | cuda | auto); one process (``nnodes``, ``n_gpus_per_node`` ignored)."""

    nnodes: int = 1
    n_gpus_per_node: int = 1
    device: str = "auto"


@dataclass
class GenerationDataConfig:
    """``data``: ``n_samples`` responses for every prompt of ``path`` (a parquet or a list of them),
    in batches of ``batch_size`` prompts (the unit of resuming; batch ``b`` samples with ``seed + b``)."""

    path: Any = "~/data/rlhf/math/test.parquet"
    prompt_key: str = "prompt"
    n_samples: int = 5
    output_path: str = "~/data/generation/responses.parquet"
    batch_size: int = 128
    max_prompt_length: int = "${rollout.prompt_length}"
    truncation: str = "error"
    apply_chat_template_kwargs: Dict[str, Any] = field(default_factory=dict)
    seed: int = 0


@dataclass
class GenerationModelConfig:
    """``model``: the policy to sample from (an HF folder, a .gguf, or the embedded SmolLM2)."""

    path: str = "HuggingFaceTB/SmolLM2-135M-Instruct"
    external_lib: Optional[str] = None
    trust_remote_code: bool = False
    custom_chat_template: Optional[str] = None


@dataclass
class GenerationRolloutConfig(EngineConfig):
    """``rollout``: the engine that samples (:class:`EngineConfig`) with generation's defaults
    (verl's generation.yaml: top-k 50, top-p 0.7, sampling); the log-prob keys and ``n`` are
    accepted for verl command lines and ignored (``data.n_samples`` sets the responses)."""

    top_k: int = 50
    top_p: float = 0.7
    prompt_length: int = 1536
    response_length: int = 512
    do_sample: bool = True
    micro_batch_size: Optional[int] = 256
    free_cache_engine: bool = True
    load_format: str = "dummy_dtensor"
    log_prob_micro_batch_size: Optional[int] = None
    log_prob_micro_batch_size_per_gpu: Optional[int] = 8
    use_fire_sampling: bool = False
    n: int = 1


@dataclass
class GenerationFSDPConfig:
    fsdp_size: int = -1


@dataclass
class GenerationActorConfig:
    """``actor``: ignored (verl builds a rollout-only worker from it)."""

    strategy: str = "fsdp"
    ulysses_sequence_parallel_size: int = 1
    fsdp_config: GenerationFSDPConfig = field(default_factory=GenerationFSDPConfig)


@dataclass
class GenerationConfig:
    """The whole ``generation`` config."""

    trainer: GenerationTrainerConfig = field(default_factory=GenerationTrainerConfig)
    data: GenerationDataConfig = field(default_factory=GenerationDataConfig)
    model: GenerationModelConfig = field(default_factory=GenerationModelConfig)
    rollout: GenerationRolloutConfig = field(default_factory=GenerationRolloutConfig)
    actor: GenerationActorConfig = field(default_factory=GenerationActorConfig)
    ray_init: RayInitConfig = field(default_factory=RayInitConfig)  # ignored: no Ray in this job


def generation_config(config) -> GenerationConfig:
    """The composed ``generation`` config, typed.

    Raises:
        ConfigError: a key without a field, or a value of the wrong type (one line naming the key).
    """
    return to_dataclass(GenerationConfig, config, "")
