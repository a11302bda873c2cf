"""Start-up checks of the PPO trainer config, and the per-worker batch sizes.

``validate_ppo_config`` raises one :class:`ConfigError` line for the first problem it finds
(naming the keys, their values and what to change) and returns notes about keys that mean
nothing on this build, so that a verl command line runs unchanged and the user knows what was
ignored. ``normalize_batch_sizes`` is the per-worker arithmetic verl's FSDP workers apply;
the workers call it too, so the start-up check and the run agree.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from hybridrl.config.errors import ConfigError

ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"
REF = "actor_rollout_ref.ref"

_HF_ENGINE = "the HF generate engine does not use it"
_FSDP_SINGLE = "FSDP sharding and offload need more than one worker; a single worker keeps the whole model"

# key -> (reason, when). Noted when the value differs from the packaged default;
# "single" rows only when there is one worker. The one place that lists ignored keys.
_NOT_YET_SPEED = "not in this build yet (same results, only slower)"
IGNORED_KEYS: dict[str, tuple[str, str]] = {
    f"{ROLLOUT}.gpu_memory_utilization": ("the HF engine has no KV-cache pool to size", "always"),
    f"{ROLLOUT}.tensor_model_parallel_size": (
        "the HF engine is not tensor-parallel; each worker generates with its own full copy", "always"),
    f"{ROLLOUT}.enforce_eager": (_HF_ENGINE + " (no CUDA graphs)", "always"),
    f"{ROLLOUT}.free_cache_engine": (_HF_ENGINE + " (no cache engine to free)", "always"),
    f"{ROLLOUT}.load_format": ("weights go from the actor to the HF engine directly", "always"),
    f"{ROLLOUT}.max_num_batched_tokens": (_HF_ENGINE + " (no token scheduler)", "always"),
    f"{ROLLOUT}.max_num_seqs": (_HF_ENGINE + " (no sequence scheduler)", "always"),
    f"{ROLLOUT}.enable_chunked_prefill": (_HF_ENGINE, "always"),
    f"{ROLLOUT}.disable_log_stats": (_HF_ENGINE, "always"),
    f"{ROLLOUT}.layered_summon": (_HF_ENGINE, "always"),
    f"{ROLLOUT}.multi_stage_wake_up": (_HF_ENGINE, "always"),
    f"{ACTOR}.ulysses_sequence_parallel_size": (
        "no sequence parallelism here; each worker holds whole sequences", "always"),
    "critic.ulysses_sequence_parallel_size": ("no sequence parallelism here", "always"),
    "reward_model.ulysses_sequence_parallel_size": ("no sequence parallelism here", "always"),
    f"{ACTOR}.use_torch_compile": ("models run in eager mode", "always"),
    "actor_rollout_ref.model.use_liger": ("no Liger kernels in this build", "always"),
    "actor_rollout_ref.model.use_fused_kernels": ("no fused kernels in this build", "always"),
    "actor_rollout_ref.model.enable_activation_offload": ("activations stay in memory", "always"),
    "actor_rollout_ref.model.use_shm": ("models load from their own path", "always"),
    "trainer.profile_steps": ("no profiler integration", "always"),
    "trainer.esi_redundant_time": ("no elastic-instance deadline", "always"),
    "trainer.default_hdfs_dir": ("checkpoints are written to trainer.default_local_dir only", "always"),
    # Speed features that change no result: accepted now, implemented by the speed work.
    "actor_rollout_ref.model.use_remove_padding": (_NOT_YET_SPEED, "always"),
    "critic.model.use_remove_padding": (_NOT_YET_SPEED, "always"),
    f"{ACTOR}.use_dynamic_bsz": (_NOT_YET_SPEED + "; micro batches count rows", "always"),
    "critic.use_dynamic_bsz": (_NOT_YET_SPEED + "; micro batches count rows", "always"),
    f"{ROLLOUT}.log_prob_use_dynamic_bsz": (_NOT_YET_SPEED, "always"),
    f"{REF}.log_prob_use_dynamic_bsz": (_NOT_YET_SPEED, "always"),
    "trainer.balance_batch": ("one worker has nothing to balance", "single"),
}

# Keys that change what is trained and that this build does not have yet: an error, not a note.
NOT_YET_SUPPORTED: dict[str, str] = {
    "actor_rollout_ref.model.lora_rank": "LoRA training",
    "reward_model.enable": "model-based rewards (a reward-model worker)",
    f"{ROLLOUT}.multi_turn.enable": "multi-turn agent rollouts",
    "data.custom_cls.path": "custom dataset classes",
    "data.sampler.class_path": "custom samplers",
    "data.datagen.path": "dynamic data generation",
    "algorithm.use_pf_ppo": "preference-feedback PPO reweighting",
}
_FSDP_ALL = ("param_offload", "optimizer_offload", "offload_policy", "reshard_after_forward",
             "fsdp_size", "forward_prefetch", "wrap_policy.min_num_params")
_FSDP_LEAVES = {  # the fsdp_config keys each role has (as in verl: no optimizer for ref / RM)
    f"{ACTOR}.fsdp_config": _FSDP_ALL,
    "critic.model.fsdp_config": _FSDP_ALL,
    f"{REF}.fsdp_config": ("param_offload", "reshard_after_forward", "forward_prefetch",
                           "wrap_policy.min_num_params"),
    "reward_model.model.fsdp_config": ("param_offload", "reshard_after_forward", "fsdp_size",
                                       "forward_prefetch", "wrap_policy.min_num_params"),
}
for _prefix, _leaves in _FSDP_LEAVES.items():
    for _leaf in _leaves:
        IGNORED_KEYS[f"{_prefix}.{_leaf}"] = (_FSDP_SINGLE, "single")

# rollout.name -> (module to import, display name) for engines mapped to HF when absent.
_OPTIONAL_ENGINES = {"vllm": ("vllm", "vLLM"), "sglang": ("sglang", "SGLang"),
                     "sglang_async": ("sglang", "SGLang")}

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
_CHOICES = {
    "trainer.device": ("cpu", "cuda", "auto"),
    "trainer.backend": ("local", "ray", "auto"),
    "algorithm.kl_ctrl.type": ("fixed", "adaptive"),
    f"{ACTOR}.loss_agg_mode": LOSS_AGG_MODES,
    "data.truncation": ("error", "left", "right", "middle"),
    "trainer.resume_mode": ("auto", "disable", "resume_path"),
    "reward_model.on_error": ("raise", "zero"),
}

_UNSET = object()  # "no such key", as a returned default
_REQUIRED = object()  # no default: a missing key is an error


def validate_ppo_config(config, world_size: int = 1) -> list[str]:
    """Check a composed PPO/GRPO config before any worker starts.

    Args:
        config: the DictConfig from :func:`hybridrl.config.load_config` (interpolations resolved).
        world_size: number of data-parallel workers (``trainer.nnodes * trainer.n_gpus_per_node``
            as the caller resolved it); the batch-size rules divide by it.

    Returns:
        list[str]: one note per key that is set to a non-default value but means nothing on this
        build or device (the caller prints them once). Empty when nothing was ignored.

    Raises:
        ConfigError: for the first problem found; the message names the keys, their values and
            what to change.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError(f"world_size={world_size!r} must be an integer >= 1 "
                          "(trainer.nnodes x trainer.n_gpus_per_node)")
    _check_values(config)
    _check_not_yet_supported(config)
    _check_batch_sizes(config, world_size)
    return ignored_key_notes(config, world_size)


def _check_values(config) -> None:
    """Single-key checks: sizes, choices, the estimator name, devices."""
    _int_at_least(config, "data.train_batch_size", 1)
    _int_at_least(config, "data.max_prompt_length", 1)
    _int_at_least(config, "data.max_response_length", 1)
    _int_at_least(config, f"{ROLLOUT}.n", 1)
    _int_at_least(config, f"{ACTOR}.ppo_epochs", 1)
    _int_at_least(config, "trainer.critic_warmup", 0)
    for key, allowed in _CHOICES.items():
        value = _get(config, key)
        if value not in allowed:
            raise ConfigError(f"{key}={value!r} is not one of {', '.join(allowed)}; set one of them")
    _check_adv_estimator(_get(config, "algorithm.adv_estimator"))
    for key in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"):
        value = _get(config, f"{ACTOR}.{key}", None)
        if value is not None and not _number_above(value, 0):
            raise ConfigError(f"{ACTOR}.{key}={value!r} must be a number > 0 (0.2 is usual)")
    clip_c = _get(config, f"{ACTOR}.clip_ratio_c", None)
    if clip_c is not None and not _number_above(clip_c, 1):
        raise ConfigError(f"{ACTOR}.clip_ratio_c={clip_c!r} must be > 1 (the dual-clip bound; 3.0 is usual)")
    if _get(config, "trainer.resume_mode") == "resume_path" and not _get(config, "trainer.resume_from_path", None):
        raise ConfigError("trainer.resume_mode=resume_path needs trainer.resume_from_path; "
                          "set it to a global_step_* folder or use trainer.resume_mode=auto")
    if _get(config, "trainer.device") == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("trainer.device=cuda but no CUDA device is available to torch "
                              f"{torch.__version__}; set trainer.device=cpu or trainer.device=auto")
    if _get(config, "algorithm.adv_estimator") == "gae":
        _int_at_least(config, "critic.ppo_epochs", 1)
        value = _get(config, "critic.cliprange_value", None)
        if value is not None and not _number_above(value, 0):
            raise ConfigError(f"critic.cliprange_value={value!r} must be a number > 0 (0.5 is usual)")


def _check_not_yet_supported(config) -> None:
    defaults = _packaged_defaults()
    for key, feature in NOT_YET_SUPPORTED.items():
        value = _get(config, key, _UNSET)
        if value is not _UNSET and _plain(value) != _plain(_get(defaults, key, _UNSET)):
            raise ConfigError(f"{key}={_plain(value)!r}: {feature} is not in this build of hybridrl yet; "
                              f"remove the key (or set it back to {_plain(_get(defaults, key, None))!r})")


def _check_adv_estimator(name) -> None:
    try:
        from hybridrl.algorithms.advantages import ADV_ESTIMATOR_REGISTRY
    except ModuleNotFoundError as exc:  # the module is not in this build: nothing to check against
        if exc.name != "hybridrl.algorithms.advantages":
            raise
        return
    if name not in ADV_ESTIMATOR_REGISTRY:
        known = ", ".join(sorted(str(k) for k in ADV_ESTIMATOR_REGISTRY))
        raise ConfigError(f"algorithm.adv_estimator={name!r} is unknown; known estimators: {known}")


def _check_batch_sizes(config, dp: int) -> None:
    """verl's batch-size rules, as its trainer and FSDP workers apply them."""
    n = _get(config, f"{ROLLOUT}.n")
    train_bs = _get(config, "data.train_batch_size")
    if (train_bs * n) % dp:
        raise ConfigError(
            f"data.train_batch_size={train_bs} x {ROLLOUT}.n={n} = {train_bs * n} responses do not "
            f"split over {dp} workers; make it a multiple of {dp} or change trainer.n_gpus_per_node")
    roles = [(ACTOR, _get(config, ACTOR))]
    if _get(config, "algorithm.adv_estimator") == "gae":
        roles.append(("critic", _get(config, "critic")))
    for prefix, cfg in roles:
        mini = _int_at_least(config, f"{prefix}.ppo_mini_batch_size", 1)
        if train_bs < mini:
            raise ConfigError(
                f"data.train_batch_size={train_bs} is smaller than {prefix}.ppo_mini_batch_size={mini}; "
                f"lower {prefix}.ppo_mini_batch_size or raise data.train_batch_size")
        if train_bs % mini:
            raise ConfigError(
                f"data.train_batch_size={train_bs} is not a multiple of {prefix}.ppo_mini_batch_size={mini}, "
                f"so the last mini batch of every step would be smaller; make data.train_batch_size a "
                f"multiple of {prefix}.ppo_mini_batch_size")
        normalize_batch_sizes(cfg, n, dp, prefix=prefix)
    for prefix in (ROLLOUT, REF):  # optional: the worker falls back to its own default
        _micro_per_worker(_get(config, prefix), prefix, "log_prob_micro_batch_size", dp, required=False)
    if _get(config, "reward_model.enable", False) and not _get(config, "reward_model.use_dynamic_bsz", False):
        _micro_per_worker(_get(config, "reward_model"), "reward_model", "micro_batch_size", dp, required=True)


def normalize_batch_sizes(actor_cfg_or_critic_cfg, rollout_n: int, dp: int,
                          prefix: str | None = None) -> dict:
    """Per-worker batch sizes of an actor or critic config, as verl's FSDP workers derive them.

    ``ppo_mini_batch_size`` counts prompts; a worker sees ``ppo_mini_batch_size * rollout_n // dp``
    responses per optimizer step, split into micro batches of ``ppo_micro_batch_size_per_gpu``
    (or of the deprecated global ``ppo_micro_batch_size // dp``).

    Args:
        actor_cfg_or_critic_cfg: ``actor_rollout_ref.actor`` or ``critic`` (DictConfig or dict).
        rollout_n: responses per prompt (``actor_rollout_ref.rollout.n``), >= 1.
        dp: data-parallel workers, >= 1.
        prefix: key path used in messages; guessed from the config when None.

    Returns:
        dict with ``ppo_mini_batch_size`` (responses per worker per optimizer step) and
        ``ppo_micro_batch_size_per_gpu`` (None only with ``use_dynamic_bsz``); for a critic also
        ``forward_micro_batch_size_per_gpu``.

    Raises:
        ConfigError: the mini batch does not split over the workers or into micro batches, both
            micro-batch keys are set, or neither is set without ``use_dynamic_bsz``.
    """
    cfg = actor_cfg_or_critic_cfg
    is_critic = _get(cfg, "cliprange_value", _UNSET) is not _UNSET
    prefix = prefix or ("critic" if is_critic else ACTOR)
    mini = _int_at_least(cfg, "ppo_mini_batch_size", 1, prefix)
    total = mini * rollout_n
    if total % dp:
        raise ConfigError(
            f"{prefix}.ppo_mini_batch_size={mini} x {ROLLOUT}.n={rollout_n} = {total} responses do not "
            f"split over {dp} workers; make ppo_mini_batch_size x n a multiple of {dp}")
    per_worker = total // dp
    dynamic = bool(_get(cfg, "use_dynamic_bsz", False))
    micro = _micro_per_worker(cfg, prefix, "ppo_micro_batch_size", dp, required=not dynamic)
    if micro is not None and not dynamic and per_worker % micro:
        raise ConfigError(
            f"{prefix}.ppo_mini_batch_size={mini} x n={rollout_n} / {dp} workers = {per_worker} responses "
            f"per worker do not split into micro batches of {micro} "
            f"({prefix}.ppo_micro_batch_size_per_gpu); pick a micro batch that divides {per_worker}")
    out = {"ppo_mini_batch_size": per_worker, "ppo_micro_batch_size_per_gpu": micro}
    if is_critic:
        fwd = _micro_per_worker(cfg, prefix, "forward_micro_batch_size", dp, required=False)
        out["forward_micro_batch_size_per_gpu"] = fwd if fwd is not None else micro
    return out


def _micro_per_worker(cfg, prefix: str, name: str, dp: int, required: bool):
    """Per-worker micro batch from ``<name>_per_gpu`` or the deprecated global ``<name>`` // dp."""
    per_gpu_key = f"{name}_per_gpu"
    global_mb = _get(cfg, name, None)
    per_gpu = _get(cfg, per_gpu_key, None)
    if global_mb is not None and per_gpu is not None:
        raise ConfigError(
            f"{prefix}.{name}={global_mb} and {prefix}.{per_gpu_key}={per_gpu} are both set; "
            f"remove the deprecated {prefix}.{name} (write {prefix}.{name}=null)")
    if per_gpu is not None:
        return _int_at_least(cfg, per_gpu_key, 1, prefix)
    if global_mb is not None:
        global_mb = _int_at_least(cfg, name, 1, prefix)
        if global_mb // dp < 1:
            raise ConfigError(
                f"{prefix}.{name}={global_mb} split over {dp} workers is 0 per worker; "
                f"set {prefix}.{per_gpu_key} instead (the deprecated key is divided by the workers)")
        return global_mb // dp
    if required:
        raise ConfigError(
            f"{prefix}.{per_gpu_key} is not set; set it (e.g. {prefix}.{per_gpu_key}=4) "
            f"or turn on {prefix}.use_dynamic_bsz=true")
    return None


def ignored_key_notes(config, world_size: int = 1) -> list[str]:
    """Notes for keys that mean nothing on this build or device and are set to non-defaults."""
    defaults = _packaged_defaults()
    notes = []
    for key, (reason, when) in IGNORED_KEYS.items():
        if when == "single" and world_size > 1:
            continue
        value = _get(config, key, _UNSET)
        default = _get(defaults, key, _UNSET)
        if value is _UNSET or default is _UNSET or _plain(value) == _plain(default):
            continue
        notes.append(f"{key}={_plain(value)!r} is ignored: {reason}")
    name = _get(config, f"{ROLLOUT}.name", "hf")
    if name in _OPTIONAL_ENGINES:
        module, display = _OPTIONAL_ENGINES[name]
        if importlib.util.find_spec(module) is None:
            notes.append(f"{ROLLOUT}.name={name}: {display} is not installed; generating with the HF engine")
    return notes


_DEFAULTS_CACHE: dict[str, Any] = {}


def _packaged_defaults():
    """The packaged ppo_trainer.yaml, resolved (OmegaConf only: it has no Hydra directives)."""
    if "ppo" not in _DEFAULTS_CACHE:
        from importlib.resources import files

        from omegaconf import OmegaConf

        text = files("hybridrl.config").joinpath("ppo_trainer.yaml").read_text()
        cfg = OmegaConf.create(text)
        OmegaConf.resolve(cfg)
        _DEFAULTS_CACHE["ppo"] = cfg
    return _DEFAULTS_CACHE["ppo"]


def _get(cfg, key: str, default=_REQUIRED):
    """Value at dotted ``key`` of a DictConfig or a plain dict; ConfigError when absent and no default."""
    node = cfg
    for part in key.split("."):
        try:
            node = node[part]
        except (KeyError, TypeError, AttributeError, IndexError) as exc:
            if default is not _REQUIRED:
                return default
            raise ConfigError(f"the config has no key '{key}'; add it (e.g. +{key}=...) "
                              "or start from the packaged ppo_trainer.yaml") from exc
    return node


def _int_at_least(cfg, key: str, minimum: int, prefix: str | None = None) -> int:
    value = _get(cfg, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        name = f"{prefix}.{key}" if prefix else key
        raise ConfigError(f"{name}={value!r} must be an integer >= {minimum}; set {name} to one")
    return value


def _number_above(value, bound: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > bound


def _plain(value):
    """DictConfig/ListConfig -> dict/list so values compare by content."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
