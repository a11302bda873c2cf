"""Start-up checks of the PPO trainer config.

``validate_ppo_config`` raises one :class:`ConfigError` line for the first problem it finds
(naming the keys, their values and what to change) and returns notes about keys that mean
nothing on this build, so that a verl command line runs unchanged and the user knows what was
ignored. The batch-size rules are in :mod:`.batch_sizes`.
"""

from __future__ import annotations

import os
import re

from hybridrl.agents import known_agent_loops
from hybridrl.algorithms import functional
from hybridrl.algorithms.advantages import ADV_ESTIMATOR_NEEDS_GROUP, ADV_ESTIMATOR_REGISTRY, estimator_needs
from hybridrl.algorithms.config import AlgoConfig, algo_config
from hybridrl.algorithms.errors import AlgorithmConfigError, UnknownAlgorithmError
from hybridrl.algorithms.kl import kl_penalty_names
from hybridrl.algorithms.policy_loss import POLICY_LOSS_REGISTRY
from hybridrl.algorithms.rollout_corr import SECTION
from hybridrl.config.access import _UNSET, _get, _int_at_least, _number_above, _plain
from hybridrl.config.batch_sizes import _check_batch_sizes
from hybridrl.config.defaults import packaged_defaults
from hybridrl.config.key_tables import ACTOR, ROLLOUT
from hybridrl.config.typed import IGNORED, REFUSED, marked_keys
from hybridrl.data import rl_dataset
from hybridrl.errors import ConfigError
from hybridrl.models.loader import EMBEDDED_MODEL_NAMES
from hybridrl.rewards.custom import RewardConfigError
from hybridrl.rewards.manager import REWARD_MANAGERS
from hybridrl.rewards.pool import check_num_workers
from hybridrl.trainer.async_modes import check_async_modes
from hybridrl.trainer.ppo_config import PPOConfig, typed_ppo_config
from hybridrl.trainer.tracking import available_loggers
from hybridrl.workers.actor import build_policy_loss_config
from hybridrl.workers.rollout import OPTIONAL_ENGINES, ROLLOUT_REGISTRY
from hybridrl.workers.sequence_parallel import check_sequence_parallel

# From the typed config's field metadata: key -> (reason, when) for keys that mean nothing here,
# key -> feature for keys of features this build lacks.
IGNORED_KEYS: dict[str, tuple[str, str]] = marked_keys(PPOConfig, IGNORED)
NOT_YET_SUPPORTED: dict[str, str] = marked_keys(PPOConfig, REFUSED)


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
        raise ConfigError(
            f"world_size={world_size!r} must be an integer >= 1 (trainer.nnodes x trainer.n_gpus_per_node)"
        )
    config = _typed(config)
    _check_values(config)
    _check_sampling(config)
    _check_registered_names(config)
    _check_not_yet_supported(config)
    _check_lora(config)
    _check_reward_model(config)
    scoring_notes = _check_reward_scoring(config)
    _check_rollout_engine(config, world_size)
    async_notes = check_async_modes(config)
    _check_multi_turn(config)
    sp_notes = check_sequence_parallel(config, world_size, _uses_critic(config))
    _check_batch_sizes(config, world_size, _uses_critic(config))
    return scoring_notes + async_notes + sp_notes + ignored_key_notes(config, world_size)


def _typed(config):
    """``config`` as the run reads it (:func:`~hybridrl.trainer.ppo_config.typed_ppo_config`): every
    key has a field and a value of its type, and each section's own rules hold (else one
    ConfigError line). The checks below read its keys without fallbacks."""
    try:
        return typed_ppo_config(config)
    except (AlgorithmConfigError, UnknownAlgorithmError) as exc:
        raise ConfigError(str(exc)) from None


def _algorithm(config) -> AlgoConfig:
    """The typed ``algorithm`` section; its own rules (ranges, the KL controller, rollout
    correction's values) fail here as one ConfigError line."""
    try:
        return algo_config(config)
    except (AlgorithmConfigError, UnknownAlgorithmError) as exc:
        raise ConfigError(str(exc)) from None


def _uses_critic(config) -> bool:
    """The estimator needs values (GAE), so the critic's keys are in use."""
    return estimator_needs(_get(config, "algorithm.adv_estimator"), "needs_values")


def _choices(config) -> dict[str, tuple]:
    """key -> allowed values. The algorithm and data modules own their lists (imported here: torch)."""
    choices = {
        "trainer.device": ("cpu", "cuda", "auto"),
        "trainer.backend": ("local", "ray", "auto"),
        f"{ACTOR}.loss_agg_mode": functional.LOSS_AGG_MODES,  # read now: a module may add modes
        f"{ACTOR}.strategy": ("fsdp", "fsdp2"),
        f"{ROLLOUT}.mode": ("sync", "async"),
        "data.truncation": rl_dataset.TRUNCATIONS,
        "trainer.resume_mode": ("auto", "disable", "resume_path"),
        "reward_model.on_error": ("raise", "zero", "mask_sample", "drop_group", "retry"),
        f"{ROLLOUT}.multi_turn.format": ("hermes",),
        f"{ROLLOUT}.multi_turn.tool_response_truncate_side": ("left", "middle", "right"),
    }
    if _uses_critic(config):
        choices.update({"critic.loss_agg_mode": functional.LOSS_AGG_MODES, "critic.strategy": ("fsdp", "fsdp2")})
    return choices


def _check_values(config) -> None:
    """Single-key checks: sizes, choices, devices."""
    _int_at_least(config, "data.train_batch_size", 1)
    _int_at_least(config, "data.max_prompt_length", 1)
    _int_at_least(config, "data.max_response_length", 1)
    _int_at_least(config, f"{ROLLOUT}.n", 1)
    _int_at_least(config, f"{ACTOR}.ppo_epochs", 1)
    _int_at_least(config, "trainer.critic_warmup", 0)
    _check_run_length(config)
    for key, allowed in _choices(config).items():
        value = _get(config, key)
        if value not in allowed:
            raise ConfigError(f"{key}={value!r} is not one of {', '.join(allowed)}; set one of them")
    for key in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"):
        value = _get(config, f"{ACTOR}.{key}")
        if value is not None and not _number_above(value, 0):
            raise ConfigError(f"{ACTOR}.{key}={value!r} must be a number > 0 (0.2 is usual)")
    clip_c = _get(config, f"{ACTOR}.clip_ratio_c")
    if clip_c is not None and not _number_above(clip_c, 1):
        raise ConfigError(f"{ACTOR}.clip_ratio_c={clip_c!r} must be > 1 (the dual-clip bound; 3.0 is usual)")
    _check_policy_loss_knobs(config)
    _check_rollout_correction(config)
    _check_dapo(config)
    _check_gdpo(config)
    _check_token_baseline(config)
    if _get(config, "trainer.resume_mode") == "resume_path" and not _get(config, "trainer.resume_from_path"):
        raise ConfigError(
            "trainer.resume_mode=resume_path needs trainer.resume_from_path; "
            "set it to a global_step_* folder or use trainer.resume_mode=auto"
        )
    if _get(config, "trainer.device") == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(
                "trainer.device=cuda but no CUDA device is available to torch "
                f"{torch.__version__}; set trainer.device=cpu or trainer.device=auto"
            )
    if _uses_critic(config):
        _int_at_least(config, "critic.ppo_epochs", 1)
        value = _get(config, "critic.cliprange_value")
        if value is not None and not _number_above(value, 0):
            raise ConfigError(f"critic.cliprange_value={value!r} must be a number > 0 (0.5 is usual)")


def _check_policy_loss_knobs(config) -> None:
    """The loss hyper-parameters (``policy_loss.clip_cov_ratio``, ...), built as the actor will build them."""
    try:
        build_policy_loss_config(_get(config, ACTOR))
    except AlgorithmConfigError as exc:
        raise ConfigError(str(exc)) from None


def _check_rollout_correction(config) -> None:
    """``algorithm.rollout_correction``: its values, the engine log-probs it needs, and the loss
    bypass mode replaces."""
    corr = _algorithm(config).rollout_correction
    loss_mode = _get(config, f"{ACTOR}.policy_loss.loss_mode")
    if loss_mode == "bypass_mode" and not corr.bypass_mode:
        raise ConfigError(
            f"{ACTOR}.policy_loss.loss_mode=bypass_mode is chosen by {SECTION}.bypass_mode=true; "
            "set that instead (it also makes the rollout log-probs the old ones)"
        )
    if corr.bypass_mode and loss_mode not in ("vanilla", "bypass_mode"):
        raise ConfigError(
            f"{SECTION}.bypass_mode=true uses its own loss ({SECTION}.loss_type=ppo_clip|reinforce), "
            f"so {ACTOR}.policy_loss.loss_mode={loss_mode} cannot apply; set it back to vanilla"
        )
    if (corr.corrects or corr.bypass_mode) and not _get(config, f"{ROLLOUT}.calculate_log_probs"):
        used = "bypass_mode=true" if corr.bypass_mode else f"rollout_is={corr.rollout_is}, rollout_rs={corr.rollout_rs}"
        raise ConfigError(
            f"{SECTION}: {used} needs the engine's log-probs of the sampled tokens; set "
            f"{ROLLOUT}.calculate_log_probs=true"
        )


def _check_dapo(config) -> None:
    """Dynamic sampling (``algorithm.filter_groups``, ``data.gen_batch_size``) and the overlong buffer."""
    filtering = bool(_get(config, "algorithm.filter_groups.enable"))
    gen_batch_size = _get(config, "data.gen_batch_size")
    if gen_batch_size is not None:
        _int_at_least(config, "data.gen_batch_size", 1)
        if not filtering and gen_batch_size != _get(config, "data.train_batch_size"):
            raise ConfigError(
                f"data.gen_batch_size={gen_batch_size} only applies to dynamic sampling; set "
                "algorithm.filter_groups.enable=true or remove it"
            )
    if filtering:
        if _get(config, "algorithm.filter_groups.metric") == "seq_final_reward" and _get(
            config, "algorithm.use_kl_in_reward"
        ):
            raise ConfigError(
                "algorithm.filter_groups.metric=seq_final_reward with algorithm.use_kl_in_reward=true: "
                "groups are filtered before the KL penalty exists here; use seq_reward"
            )
    if _get(config, "reward_model.overlong_buffer.enable") and _get(config, "reward_model.reward_manager") != "dapo":
        raise ConfigError(
            "reward_model.overlong_buffer.enable=true is DAPO's shaping; set reward_model.reward_manager=dapo"
        )


def _check_token_baseline(config) -> None:
    """The optimal token baseline reads ``sum_pi_squared``, which only the actor's old-log-prob pass makes."""
    estimator = _get(config, "algorithm.adv_estimator")
    if estimator in ("optimal_token_baseline", "tir_optimal_token_baseline") and not _get(
        config, f"{ACTOR}.calculate_sum_pi_squared"
    ):
        raise ConfigError(
            f"algorithm.adv_estimator={estimator} needs sum_pi_squared from the old-log-prob pass; "
            f"set {ACTOR}.calculate_sum_pi_squared=true"
        )


def _check_gdpo(config) -> None:
    """``adv_estimator=gdpo`` names its reward components (and at most one weight each)."""
    if _get(config, "algorithm.adv_estimator") != "gdpo":
        return
    keys = _plain(_get(config, "algorithm.gdpo_reward_keys"))
    weights = _plain(_get(config, "algorithm.gdpo_reward_weights"))
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys):
        raise ConfigError(
            f"algorithm.adv_estimator=gdpo needs algorithm.gdpo_reward_keys, a list of the keys "
            f"your compute_score returns in its dict (got {keys!r}), e.g. "
            "\"['format_reward','accuracy_reward']\""
        )
    if weights is not None and (not isinstance(weights, list) or len(weights) != len(keys)):
        raise ConfigError(
            f"algorithm.gdpo_reward_weights={weights!r} must be a list with one number per "
            f"gdpo_reward_keys entry ({len(keys)}), or null"
        )


def _check_not_yet_supported(config) -> None:
    defaults = packaged_defaults()
    for key, feature in NOT_YET_SUPPORTED.items():
        value = _get(config, key)
        if _plain(value) != _plain(_get(defaults, key, _UNSET)):
            raise ConfigError(
                f"{key}={_plain(value)!r}: {feature} is not in this build of hybridrl yet; "
                f"remove the key (or set it back to {_plain(_get(defaults, key, None))!r})"
            )


def _check_lora(config) -> None:
    """``lora_rank`` / ``lora_alpha`` / ``target_modules`` of the actor (and of the critic with GAE)."""
    prefixes = ["actor_rollout_ref.model"] + (["critic.model"] if _uses_critic(config) else [])
    for prefix in prefixes:
        rank = _get(config, f"{prefix}.lora_rank")
        if rank < 0:
            raise ConfigError(
                f"{prefix}.lora_rank={rank!r} must be 0 (full fine-tuning) or a whole number > 0 (8-64 is usual)"
            )
        if rank == 0:
            continue
        alpha = _get(config, f"{prefix}.lora_alpha")
        if not _number_above(alpha, 0):
            raise ConfigError(
                f"{prefix}.lora_alpha={alpha!r} must be a number > 0 (the update is scaled by "
                "lora_alpha / lora_rank; 16 or 2 x lora_rank is usual)"
            )
        targets = _plain(_get(config, f"{prefix}.target_modules"))
        names = [targets] if isinstance(targets, str) else targets
        if not isinstance(names, list) or not names or not all(isinstance(t, str) and t for t in names):
            raise ConfigError(
                f"{prefix}.target_modules={targets!r} must be all-linear or a list of module names, "
                "e.g. [q_proj,k_proj,v_proj,o_proj]"
            )
        try:
            import peft  # noqa: F401
        except ImportError:
            raise ConfigError(
                f"{prefix}.lora_rank={rank} needs the peft package: pip install 'hybridrl[lora]', or set lora_rank=0"
            ) from None


def _check_rollout_engine(config, world_size: int) -> None:
    """Settings the chosen engine cannot run, refused before any model loads."""
    name, mode = _get(config, f"{ROLLOUT}.name"), _get(config, f"{ROLLOUT}.mode")
    if mode == "async" and name != "vllm":
        raise ConfigError(
            f"{ROLLOUT}.mode=async: the {name!r} engine has no async server mode; "
            f"set {ROLLOUT}.name=vllm (pip install -e '.[vllm]') or {ROLLOUT}.mode=sync"
        )
    if name == "vllm" and mode != "async" and world_size > 1:
        raise ConfigError(
            f"{ROLLOUT}.name=vllm with {world_size} workers needs {ROLLOUT}.mode=async: the colocated (sync) engine "
            "runs in the worker's process and would start a process group beside the trainer's; the async engine "
            "runs in a process of its own, one per worker"
        )
    tp = _get(config, f"{ROLLOUT}.tensor_model_parallel_size")
    if _get(config, f"{ROLLOUT}.name") == "vllm" and tp > 1:
        raise ConfigError(
            f"{ROLLOUT}.tensor_model_parallel_size={tp} with {ROLLOUT}.name=vllm: tensor parallelism inside the "
            "colocated engine is not in this build (vLLM's CPU backend has none; the CUDA path is not written); "
            "set it to 1: each worker runs its own engine on its share of the batch"
        )


def _check_multi_turn(config) -> None:
    """Agent-loop keys (``rollout.multi_turn``, ``rollout.agent``, ``retriever``): files, ranges, names."""
    mt = f"{ROLLOUT}.multi_turn"
    for key in (f"{mt}.tool_config_path", f"{mt}.interaction_config_path", "retriever.corpus_path"):
        path = _get(config, key)
        if path and not os.path.isfile(os.path.expanduser(str(path))):
            raise ConfigError(f"{key}={path}: file not found; fix the path or set {key}=null")
    _int_at_least(config, f"{mt}.max_parallel_calls", 1)
    _int_at_least(config, f"{mt}.max_tool_response_length", 1)
    for key in (f"{mt}.max_assistant_turns", f"{mt}.max_user_turns", f"{mt}.max_tokens_per_turn"):
        if _get(config, key) is not None:
            _int_at_least(config, key, 1)
    _int_at_least(config, f"{mt}.search.max_turns", 0)
    _int_at_least(config, f"{mt}.search.max_obs_length", 1)
    _int_at_least(config, "retriever.topk", 1)
    if not _number_above(_get(config, "retriever.timeout"), 0):
        raise ConfigError(f"retriever.timeout={_get(config, 'retriever.timeout')!r} must be a number of seconds > 0")
    default = _get(config, f"{ROLLOUT}.agent.default_agent_loop")
    if default not in known_agent_loops():
        raise ConfigError(
            f"{ROLLOUT}.agent.default_agent_loop={default!r} is unknown; known: "
            f"{', '.join(known_agent_loops())}; pick one or register yours with @register_agent_loop"
        )
    uses_chat = _get(config, f"{mt}.tool_config_path") or _get(config, f"{mt}.interaction_config_path")
    if _get(config, f"{mt}.enable") and uses_chat and not _get(config, "data.return_raw_chat"):
        raise ConfigError(
            f"{mt}.tool_config_path / interaction_config_path need the chat messages of each row; "
            "set data.return_raw_chat=True"
        )


def _check_reward_model(config) -> None:
    """``reward_model.enable``: a reward model that exists (the default path is verl's
    placeholder) and a sane ``max_length``; the micro batch is checked with the batch sizes."""
    import os

    if not _get(config, "reward_model.enable"):
        return
    hint = "`hybridrl rm` writes one to <trainer.default_local_dir>/global_step_<N>/huggingface"
    if not _get(config, "reward_model.model.path"):
        raise ConfigError(f"reward_model.enable=True needs reward_model.model.path, a trained reward model; {hint}")
    for key in ("reward_model.model.path", "reward_model.model.input_tokenizer"):
        value = _get(config, key)
        exists = os.path.exists(os.path.expanduser(str(value))) or str(value).lower() in EMBEDDED_MODEL_NAMES
        if value and not exists:
            what = hint if key.endswith(".path") else "set it to the policy's model or tokenizer folder, or null"
            raise ConfigError(f"{key}={value!r} does not exist; {what}")
    if _get(config, "reward_model.max_length") is not None:
        _int_at_least(config, "reward_model.max_length", 2)


def _check_reward_scoring(config) -> list[str]:
    """``reward.num_workers`` (read as ``reward_model.num_workers``) and ``launch_reward_fn_async``.

    Returns a note when async scoring cannot overlap anything: dynamic sampling reads the scores
    before the log-prob passes, so they are computed first, as verl's DAPO trainer does.
    """
    try:
        check_num_workers(_plain(_get(config, "reward_model.num_workers")))
    except RewardConfigError as exc:
        raise ConfigError(str(exc)) from None
    if _get(config, "reward_model.launch_reward_fn_async") and _get(config, "algorithm.filter_groups.enable"):
        return [
            "reward_model.launch_reward_fn_async=True: with algorithm.filter_groups.enable=True the scores "
            "decide which groups are kept before the log-prob passes, so scoring runs before them "
            "(no overlap; as verl's DAPO trainer does)"
        ]
    return []


def _check_sampling(config) -> None:
    """Training samples need temperature > 0 (the actor divides logits by it); validation may be greedy."""
    temperature = _get(config, f"{ROLLOUT}.temperature")
    if not _number_above(temperature, 0):
        raise ConfigError(
            f"{ROLLOUT}.temperature={temperature!r} must be a number > 0 (training samples and their "
            f"log-probs divide the logits by it); for greedy decoding set {ROLLOUT}.val_kwargs.temperature=0"
        )
    val_temperature = _get(config, f"{ROLLOUT}.val_kwargs.temperature")
    if val_temperature < 0:
        raise ConfigError(
            f"{ROLLOUT}.val_kwargs.temperature={val_temperature!r} must be a number >= 0 (0: greedy validation)"
        )


def _check_registered_names(config) -> None:
    """Names the run looks up in registries, checked before any worker starts."""

    def check(key: str, value, known, register: str, shown: str | None = None) -> None:
        if not isinstance(value, str) or value not in known:
            shown = shown or f"{key}={_plain(value)!r}"
            raise ConfigError(
                f"{shown} is unknown; known: {', '.join(sorted(map(str, known)))}; "
                f"pick one of them or register your own with @{register}"
            )

    estimator = _get(config, "algorithm.adv_estimator")
    check("algorithm.adv_estimator", estimator, ADV_ESTIMATOR_REGISTRY, "register_adv_est")
    n = _get(config, f"{ROLLOUT}.n")
    if estimator in ADV_ESTIMATOR_NEEDS_GROUP and n < 2:
        raise ConfigError(
            f"algorithm.adv_estimator={estimator} compares the responses to one prompt with each other, "
            f"but {ROLLOUT}.n={n} samples one per prompt; set {ROLLOUT}.n to 2 or more (4-16 is usual), "
            "or use adv_estimator=gae, reinforce_plus_plus or remax"
        )
    if _get(config, f"{ACTOR}.use_kl_loss"):
        check(f"{ACTOR}.kl_loss_type", _get(config, f"{ACTOR}.kl_loss_type"), kl_penalty_names(), "register_kl_penalty")
    if _get(config, "algorithm.use_kl_in_reward"):
        check("algorithm.kl_penalty", _get(config, "algorithm.kl_penalty"), kl_penalty_names(), "register_kl_penalty")
    check(
        f"{ACTOR}.policy_loss.loss_mode",
        _get(config, f"{ACTOR}.policy_loss.loss_mode"),
        POLICY_LOSS_REGISTRY,
        "register_policy_loss",
    )
    check(
        "reward_model.reward_manager",
        _get(config, "reward_model.reward_manager"),
        REWARD_MANAGERS,
        "register_reward_manager",
    )
    _check_reward_manager_keys(REWARD_MANAGERS.get(_get(config, "reward_model.reward_manager")), config)
    loggers = _plain(_get(config, "trainer.logger"))
    for name in loggers if isinstance(loggers, list) else [loggers]:  # verl also takes one name
        check(
            "trainer.logger",
            name,
            available_loggers(),
            "register_logger",
            shown=f"trainer.logger={loggers!r}: the logger {name!r}",
        )
    check(
        f"{ROLLOUT}.name",
        _get(config, f"{ROLLOUT}.name"),
        set(ROLLOUT_REGISTRY) | set(OPTIONAL_ENGINES),
        "register_rollout",
    )


def _check_reward_manager_keys(manager_cls, config) -> None:
    """A reward manager that reads keys of its own checks them here (its ``check_config``, e.g. the judge's)."""
    check_config = getattr(manager_cls, "check_config", None)
    if check_config is not None:
        try:
            check_config(config)
        except RewardConfigError as exc:
            raise ConfigError(str(exc)) from exc


def _on_cuda(config) -> bool:
    """Whether ``trainer.device`` computes on CUDA (``auto``: when torch sees a GPU)."""
    device = _get(config, "trainer.device")
    if device == "auto":
        import torch

        return torch.cuda.is_available()
    return device == "cuda"


def ignored_key_notes(config, world_size: int = 1) -> list[str]:
    """Notes for keys that mean nothing on this build or device and are set to non-defaults, and
    for a ``rollout.name`` in :data:`~hybridrl.workers.rollout.OPTIONAL_ENGINES` that has no registered
    engine (runs on HF)."""
    defaults = packaged_defaults()
    notes = []
    name = _get(config, f"{ROLLOUT}.name")
    for key, (reason, when) in IGNORED_KEYS.items():
        if (
            (when == "single" and world_size > 1)
            or (when == "hf" and not _on_hf_engine(config, key))
            or (when == "cpu" and _on_cuda(config))
        ):
            continue
        value = _get(config, key)
        default = _get(defaults, key, _UNSET)
        if default is _UNSET or _plain(value) == _plain(default):
            continue
        source = _interpolation_source(key)
        if source is not None and _plain(value) == _plain(_get(config, source)):
            continue  # it still copies its source key; that key's own note (if any) says it once
        notes.append(f"{key}={_plain(value)!r} is ignored: {reason}")
    if isinstance(name, str) and name in OPTIONAL_ENGINES:
        if name not in ROLLOUT_REGISTRY:
            notes.append(
                f"{ROLLOUT}.name={name}: this build has no {OPTIONAL_ENGINES[name]} engine; "
                "generating with the HF engine"
            )
    return notes


def _on_hf_engine(config, key: str) -> bool:
    """Whether the engine section ``key`` belongs to (the policy's rollout or the judge's) generates
    with HF, for which its vLLM keys mean nothing."""
    section = key.split(".engine_kwargs.")[0] if ".engine_kwargs." in key else key.rpartition(".")[0]
    return _get(config, f"{section}.name") in ("hf", *OPTIONAL_ENGINES)


def _interpolation_source(key: str) -> str | None:
    """The key that ``key`` copies in the packaged yaml (``${a.b}`` or the sibling ``${.b}``), or None."""
    text = _get(packaged_defaults(resolved=False), key, None)
    match = re.fullmatch(r"\$\{(\.?)([\w.]+)\}", text) if isinstance(text, str) else None
    if match is None:
        return None
    return f"{key.rpartition('.')[0]}.{match.group(2)}" if match.group(1) else match.group(2)


def _check_run_length(config) -> None:
    """Numbers that decide how long a run trains and what it saves: checked before any model
    loads, so a typo does not fail after the first step, and a run that would train nothing
    (``total_epochs=0``, ``total_training_steps=-1``) does not exit 0 having done nothing."""
    _int_at_least(config, "trainer.total_epochs", 1)
    steps = _get(config, "trainer.total_training_steps")
    if steps is not None:
        _int_at_least(config, "trainer.total_training_steps", 1, hint="or null (total_epochs x batches per epoch)")
    optimizers = [f"{ACTOR}.optim"] + (["critic.optim"] if _uses_critic(config) else [])
    for section in optimizers:
        lr = _get(config, f"{section}.lr")
        if not _number_above(lr, 0):
            raise ConfigError(f"{section}.lr={lr!r} must be a number > 0 (1e-6 is usual for full fine-tuning)")
