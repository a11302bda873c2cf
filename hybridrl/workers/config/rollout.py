"""The generation engines' sections of the PPO config, typed (verl's ``RolloutConfig``):
``actor_rollout_ref.rollout`` (the policy's engine) and ``reward_model.rollout`` (an LLM judge's),
which share :class:`EngineConfig`. Defaults are the packaged ``ppo_trainer.yaml``'s; docs/rollout.md
says what each key does on the HF and vLLM engines."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from hybridrl.agents.config import AgentLoopConfig, MultiTurnConfig

__all__ = ["EngineConfig", "SamplingConfig", "TraceConfig", "RolloutConfig"]

ACTOR = "${actor_rollout_ref.actor."


@dataclass
class EngineConfig:
    """An engine that generates: ``name`` (``hf`` | ``vllm``), ``mode`` (``sync`` | ``async``), its
    sampling, and lengths in tokens (``ignore_eos``: always ``response_length``); with
    ``calculate_log_probs`` it also returns ``rollout_log_probs``. The vLLM keys size the engine
    (``kv_cache_memory_gb`` in GiB; null: 1 on CPU); ``engine_timeout_s`` is the longest wait on
    it, in seconds. The defaults are the judge's (``reward_model.rollout``); ``hybridrl gen`` has
    its own (:class:`hybridrl.trainer.generation_config.GenerationRolloutConfig`)."""

    name: str = "hf"
    mode: str = "sync"
    dtype: str = "auto"
    prompt_length: int = 1024
    response_length: int = 64
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    micro_batch_size: Optional[int] = 64
    fast_decoding: bool = True
    ignore_eos: bool = False
    calculate_log_probs: bool = False
    disable_log_stats: bool = True
    tensor_model_parallel_size: int = 1
    gpu_memory_utilization: float = 0.5
    kv_cache_memory_gb: Optional[float] = None
    enforce_eager: bool = True
    max_model_len: Optional[int] = None
    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 8192
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    free_cache_engine: bool = False
    load_format: str = "dummy"
    cpu_threads: Optional[int] = None
    seed: int = 0
    engine_timeout_s: float = 900
    engine_kwargs: Dict[str, Any] = field(default_factory=lambda: {"vllm": {}})


@dataclass
class SamplingConfig:
    """``rollout.val_kwargs``: sampling for validation (greedy by default), ``n`` responses per prompt."""

    top_k: int = -1
    top_p: float = 1.0
    temperature: float = 0
    n: int = 1
    do_sample: bool = False


@dataclass
class TraceConfig:
    backend: Optional[str] = None
    token2text: bool = False


@dataclass
class RolloutConfig(EngineConfig):
    """``actor_rollout_ref.rollout``: the policy's engine, the samples per prompt (``n``), its
    log-prob passes, agent loops (``multi_turn``, ``agent``) and validation sampling."""

    prompt_length: int = "${data.max_prompt_length}"
    response_length: int = "${data.max_response_length}"
    do_sample: bool = True
    micro_batch_size: Optional[int] = 256
    free_cache_engine: bool = True
    load_format: str = "dummy_dtensor"
    engine_kwargs: Dict[str, Any] = field(default_factory=lambda: {
        "vllm": {"swap_space": None, "disable_mm_preprocessor_cache": False},
        "sglang": {"attention_backend": None}})
    use_fire_sampling: bool = False
    nnodes: int = 0
    n_gpus_per_node: int = 1
    layered_summon: bool = False
    log_prob_micro_batch_size: Optional[int] = None
    log_prob_micro_batch_size_per_gpu: Optional[int] = None
    log_prob_use_dynamic_bsz: bool = ACTOR + "use_dynamic_bsz}"
    log_prob_max_token_len_per_gpu: int = ACTOR + "ppo_max_token_len_per_gpu}"
    n: int = 1
    multi_stage_wake_up: bool = False
    val_kwargs: SamplingConfig = field(default_factory=SamplingConfig)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    calculate_log_probs: bool = True
    agent: AgentLoopConfig = field(default_factory=AgentLoopConfig)
    update_weights_bucket_megabytes: int = 512
    trace: TraceConfig = field(default_factory=TraceConfig)
