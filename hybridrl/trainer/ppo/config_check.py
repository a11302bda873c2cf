"""Start-up checks of the PPO trainer config that span sections or read the registries.

Each section's own rules (a size >= 1, a value in a set, a range) are on its dataclass and ran
when the config was typed (:func:`~hybridrl.trainer.ppo.config.typed_ppo_config`); the rules
here read the typed fields by attribute. ``validate_ppo_config`` raises one :class:`ConfigError`
line for the first problem it finds (naming the keys, their values and what to change) and
returns notes about keys that mean nothing on this build, so that a verl command line runs
unchanged and the user knows what was ignored. The batch-size rules are in
:mod:`hybridrl.config.batch_sizes`.
"""

from __future__ import annotations

import importlib.util
import os
import re

from hybridrl.agents import known_agent_loops, register_agent_loops_from_file
from hybridrl.algorithms import functional
from hybridrl.algorithms.advantages import ADV_ESTIMATOR_NEEDS_GROUP, ADV_ESTIMATOR_REGISTRY
from hybridrl.algorithms.config import AlgoConfig, algo_config
from hybridrl.algorithms.distillation import get_distillation_loss_settings
from hybridrl.algorithms.errors import AlgorithmConfigError, UnknownAlgorithmError
from hybridrl.algorithms.kl import kl_penalty_names
from hybridrl.algorithms.policy_loss import POLICY_LOSS_REGISTRY
from hybridrl.algorithms.rollout_corr import SECTION, RolloutCorrectionConfig
from hybridrl.config.batch_sizes import check_batch_sizes
from hybridrl.config.defaults import packaged_defaults
from hybridrl.config.key_tables import ACTOR, ROLLOUT
from hybridrl.config.precision import runs_on_ray
from hybridrl.config.rules import one_of, plain, value_at
from hybridrl.config.typed import IGNORED, REFUSED, marked_keys
from hybridrl.errors import ConfigError
from hybridrl.models.paths import EMBEDDED_MODEL_NAMES
from hybridrl.rewards.custom import RewardConfigError
from hybridrl.rewards.manager import REWARD_MANAGERS, VERL_ONLY_MANAGERS
from hybridrl.rewards.pool import check_num_workers
from hybridrl.trainer.ppo.async_checks import check_async_modes
from hybridrl.trainer.ppo.config import PPOConfig, typed_ppo_config
from hybridrl.trainer.ppo.step_plan import needs_critic
from hybridrl.trainer.run.tracking import available_loggers
from hybridrl.workers.actor import build_policy_loss_config
from hybridrl.workers.config import CriticConfig
from hybridrl.workers.config.distillation import DistillationConfig, check_teacher_pool, distillation_notes
from hybridrl.workers.rollout import OPTIONAL_ENGINES, ROLLOUT_REGISTRY
from hybridrl.workers.rollout.tp_group import check_tp_size
from hybridrl.workers.sequence_parallel import check_sequence_parallel

# From the typed config's field metadata: key -> (reason, when) for keys that mean nothing here,
# key -> feature for keys of features this build lacks.
IGNORED_KEYS: dict[str, tuple[str, str]] = marked_keys(PPOConfig, IGNORED)
NOT_YET_SUPPORTED: dict[str, str] = marked_keys(PPOConfig, REFUSED)
_UNSET = object()  # "the packaged defaults have no such key"
# group estimators whose function treats a group of one as verl's does (mean 0, std 1: A = score),
# so rollout.n=1 runs with a note instead of stopping
GROUP_OF_ONE_AS_VERL = frozenset({"grpo", "grpo_vectorized", "rloo", "rloo_vectorized"})


def validate_ppo_config(config, world_size: int = 1, algo: AlgoConfig | None = None) -> list[str]:
    """Check a composed PPO/GRPO config before any worker starts.

    Args:
        config: the run's typed config (:func:`~hybridrl.trainer.ppo.config.typed_ppo_config`),
            or the composed DictConfig from :func:`hybridrl.config.load_config`, typed here.
        world_size: number of data-parallel workers (``trainer.nnodes * trainer.n_gpus_per_node``
            as the caller resolved it); the batch-size rules divide by it.
        algo: the ``algorithm`` section as the caller typed it (``run_ppo`` types it once);
            None types it here.

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
    algo = algo if algo is not None else _typed_algorithm(config)
    uses_critic = needs_critic(config)
    _check_values(config, algo, uses_critic)
    _check_registered_names(config)
    _check_not_yet_supported(config)
    _check_lora_package(config, uses_critic)
    _check_reward_model(config.reward_model)
    scoring_notes = _check_reward_scoring(config)
    _check_rollout_engine(config, world_size)
    async_notes = check_async_modes(config, algo.rollout_correction)
    _check_multi_turn(config)
    sp_notes = check_sequence_parallel(config, world_size, uses_critic)
    check_batch_sizes(config, world_size, uses_critic)
    group_notes = _group_of_one_notes(config) + _check_distillation(config)
    return scoring_notes + async_notes + sp_notes + group_notes + ignored_key_notes(config, world_size)


def _typed(config):
    """``config`` as the run reads it (:func:`~hybridrl.trainer.ppo.config.typed_ppo_config`): every
    key has a field and a value of its type, and each section's own rules hold (else one
    ConfigError line). The checks below read its fields without fallbacks."""
    try:
        return typed_ppo_config(config)
    except (AlgorithmConfigError, UnknownAlgorithmError) as exc:
        raise ConfigError(str(exc)) from None


def _typed_algorithm(config) -> AlgoConfig:
    """The ``algorithm`` section as an :class:`AlgoConfig` (its rules held when ``config`` was
    typed), built once for the checks that use its methods (``rollout_correction.corrects``)."""
    try:
        return algo_config(config)
    except (AlgorithmConfigError, UnknownAlgorithmError) as exc:
        raise ConfigError(str(exc)) from None


def _choices(config, uses_critic: bool) -> dict[str, tuple]:
    """key -> (value, allowed values) of the keys whose values a module registers: the loss
    aggregation modes (read now: an external module may add modes)."""
    choices = {f"{ACTOR}.loss_agg_mode": (config.actor_rollout_ref.actor.loss_agg_mode, functional.LOSS_AGG_MODES)}
    if uses_critic:
        choices["critic.loss_agg_mode"] = (config.critic.loss_agg_mode, functional.LOSS_AGG_MODES)
    return choices


def _check_values(config, algo: AlgoConfig, uses_critic: bool) -> None:
    """Rules that reach beyond one section (each section's own ran when it was typed)."""
    for key, (value, allowed) in _choices(config, uses_critic).items():
        one_of(key, value, allowed)
    if uses_critic:
        CriticConfig.validate(config.critic)  # the run's section is a structured DictConfig
    _check_policy_loss_knobs(config)
    _check_rollout_correction(config, algo.rollout_correction)
    _check_dapo(config)
    _check_token_baseline(config)
    _check_cuda_here(config)


def _check_cuda_here(config) -> None:
    """``trainer.device=cuda`` needs a GPU in this process only where the workers run here (the
    local backend); Ray workers find theirs on their nodes (verl's CPU head node, GPU workers:
    Ray's placement then needs GPUs in the cluster)."""
    if config.trainer.device != "cuda" or runs_on_ray(config):
        return
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(
            "trainer.device=cuda but no CUDA device is available to torch "
            f"{torch.__version__}; set trainer.device=cpu or trainer.device=auto (or trainer.backend=ray "
            "to run the workers on GPU nodes of a Ray cluster)"
        )


def _check_policy_loss_knobs(config) -> None:
    """The loss hyper-parameters (``policy_loss.clip_cov_ratio``, ...), built as the actor will build them."""
    try:
        build_policy_loss_config(config.actor_rollout_ref.actor)
    except AlgorithmConfigError as exc:
        raise ConfigError(str(exc)) from None


def _check_rollout_correction(config, corr: RolloutCorrectionConfig) -> None:
    """``algorithm.rollout_correction`` (``corr``, typed): the engine log-probs it needs, and the
    loss bypass mode replaces (its own values were checked when it was typed)."""
    loss_mode = config.actor_rollout_ref.actor.policy_loss.loss_mode
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
    if (corr.corrects or corr.bypass_mode) and not config.actor_rollout_ref.rollout.calculate_log_probs:
        used = "bypass_mode=true" if corr.bypass_mode else f"rollout_is={corr.rollout_is}, rollout_rs={corr.rollout_rs}"
        raise ConfigError(
            f"{SECTION}: {used} needs the engine's log-probs of the sampled tokens; set "
            f"{ROLLOUT}.calculate_log_probs=true"
        )


def _check_dapo(config) -> None:
    """``data.gen_batch_size`` only with dynamic sampling (``algorithm.filter_groups``)."""
    gen_batch_size = config.data.gen_batch_size
    filtering = config.algorithm.filter_groups.enable
    if gen_batch_size is not None and not filtering and gen_batch_size != config.data.train_batch_size:
        raise ConfigError(
            f"data.gen_batch_size={gen_batch_size} only applies to dynamic sampling; set "
            "algorithm.filter_groups.enable=true or remove it"
        )


def _check_token_baseline(config) -> None:
    """The optimal token baseline reads ``sum_pi_squared``, which only the actor's old-log-prob pass makes."""
    estimator = config.algorithm.adv_estimator
    if estimator in ("optimal_token_baseline", "tir_optimal_token_baseline") and not (
        config.actor_rollout_ref.actor.calculate_sum_pi_squared
    ):
        raise ConfigError(
            f"algorithm.adv_estimator={estimator} needs sum_pi_squared from the old-log-prob pass; "
            f"set {ACTOR}.calculate_sum_pi_squared=true"
        )


def _check_not_yet_supported(config) -> None:
    defaults = packaged_defaults()
    for key, feature in NOT_YET_SUPPORTED.items():
        value = plain(value_at(config, key))
        if value != plain(value_at(defaults, key, _UNSET)):
            raise ConfigError(
                f"{key}={value!r}: {feature} is not in this build of hybridrl yet; "
                f"remove the key (or set it back to {plain(value_at(defaults, key))!r})"
            )


def _check_distillation(config) -> list[str]:
    """With ``distillation.enabled``: the teachers resolve and the loss names are registered
    (:meth:`DistillationConfig.validate`); the teacher stage runs in the synchronous step only.
    Returns the notes of verl's teacher-server keys that mean nothing here."""
    section = config.distillation
    if not section.enabled:
        return []
    DistillationConfig.validate(section)
    trainer = config.trainer
    check_teacher_pool(section, trainer.backend)
    if trainer.one_step_off_policy or trainer.v1.trainer_mode != "sync":
        raise ConfigError(
            "distillation.enabled=true runs with the synchronous trainer only; set trainer.one_step_off_policy=false "
            "and trainer.v1.trainer_mode=sync"
        )
    sp = config.actor_rollout_ref.actor.ulysses_sequence_parallel_size
    loss_mode = section.distillation_loss.loss_mode
    if sp > 1 and get_distillation_loss_settings(loss_mode).use_topk:
        raise ConfigError(
            f"distillation.distillation_loss.loss_mode={loss_mode} with {ACTOR}.ulysses_sequence_parallel_size={sp}: "
            "a top-k loss needs each row's logits on one rank; set ulysses_sequence_parallel_size=1 or use a "
            "sampled-token loss_mode (k1, k3)"
        )
    return distillation_notes(section, config.actor_rollout_ref.rollout.name)


def _check_lora_package(config, uses_critic: bool) -> None:
    """LoRA (``lora_rank`` > 0 of the actor, or of the critic when it trains) needs peft
    installed (the keys' own rules ran when they were typed)."""
    models = [("actor_rollout_ref.model", config.actor_rollout_ref.model)]
    if uses_critic:
        models.append(("critic.model", config.critic.model))
    for prefix, model in models:
        adapter = getattr(model, "lora_adapter_path", None)
        if model.lora_rank == 0 and not adapter:
            continue
        if importlib.util.find_spec("peft") is None:
            key = f"{prefix}.lora_adapter_path={adapter}" if adapter else f"{prefix}.lora_rank={model.lora_rank}"
            raise ConfigError(f"{key} needs the peft package: pip install 'hybridrl[lora]', or set lora_rank=0")


def _check_rollout_engine(config, world_size: int) -> None:
    """Settings the chosen engine (``actor_rollout_ref.rollout``) cannot run, refused before any model
    loads: an async mode for an engine without one; a vLLM tensor-parallel size that does not divide the
    workers (:func:`~hybridrl.workers.rollout.tp_group.check_tp_size`; the heads are checked when the
    model loads) or that meets an asynchronous schedule (its engines serve their own rank's requests)."""
    rollout = config.actor_rollout_ref.rollout
    name, mode = rollout.name, rollout.mode
    if mode == "async" and name != "vllm":
        raise ConfigError(
            f"{ROLLOUT}.mode=async: the {name!r} engine has no async server mode; "
            f"set {ROLLOUT}.name=vllm (pip install -e '.[vllm]') or {ROLLOUT}.mode=sync"
        )
    tp_size = int(rollout.tensor_model_parallel_size)
    if name != "vllm" or tp_size == 1:
        return
    check_tp_size(tp_size, world_size)
    mode = config.trainer.v1.trainer_mode
    schedule = f"trainer.v1.trainer_mode={mode}" if mode != "sync" else None
    if config.trainer.one_step_off_policy:
        schedule = "trainer.one_step_off_policy=true"
    if schedule:
        raise ConfigError(
            f"{ROLLOUT}.tensor_model_parallel_size={tp_size} with {schedule}: an engine that spans several workers "
            f"runs with the synchronous schedule only in this build; set {ROLLOUT}.tensor_model_parallel_size=1 "
            "(one engine per worker) or drop the asynchronous schedule"
        )


def _check_multi_turn(config) -> None:
    """Agent-loop keys (``rollout.multi_turn``, ``rollout.agent``, ``retriever``): files, names,
    and the chat messages tools need (the ranges were checked when they were typed)."""
    rollout = config.actor_rollout_ref.rollout
    multi_turn = rollout.multi_turn
    mt = f"{ROLLOUT}.multi_turn"
    for key, path in (
        (f"{mt}.tool_config_path", multi_turn.tool_config_path),
        (f"{mt}.interaction_config_path", multi_turn.interaction_config_path),
        ("retriever.corpus_path", config.retriever.corpus_path),
    ):
        if path and not os.path.isfile(os.path.expanduser(str(path))):
            raise ConfigError(f"{key}={path}: file not found; fix the path or set {key}=null")
    if rollout.agent.agent_loop_config_path:  # its names, without importing the classes
        register_agent_loops_from_file(rollout.agent.agent_loop_config_path)
    default = rollout.agent.default_agent_loop
    if default not in known_agent_loops():
        raise ConfigError(
            f"{ROLLOUT}.agent.default_agent_loop={default!r} is unknown; known: "
            f"{', '.join(known_agent_loops())}; pick one or register yours with @register_agent_loop"
        )
    uses_chat = multi_turn.tool_config_path or multi_turn.interaction_config_path
    if multi_turn.enable and uses_chat and not config.data.return_raw_chat:
        raise ConfigError(
            f"{mt}.tool_config_path / interaction_config_path need the chat messages of each row; "
            "set data.return_raw_chat=True"
        )


def _check_reward_model(reward_model) -> None:
    """``reward_model.enable``: a reward model that exists (the default path is verl's
    placeholder); the micro batch is checked with the batch sizes."""
    if not reward_model.enable:
        return
    hint = "`hybridrl rm` writes one to <trainer.default_local_dir>/global_step_<N>/huggingface"
    if not reward_model.model.path:
        raise ConfigError(f"reward_model.enable=True needs reward_model.model.path, a trained reward model; {hint}")
    for key, value in (
        ("reward_model.model.path", reward_model.model.path),
        ("reward_model.model.input_tokenizer", reward_model.model.input_tokenizer),
    ):
        exists = os.path.exists(os.path.expanduser(str(value))) or str(value).lower() in EMBEDDED_MODEL_NAMES
        if value and not exists:
            what = hint if key.endswith(".path") else "set it to the policy's model or tokenizer folder, or null"
            raise ConfigError(f"{key}={value!r} does not exist; {what}")


def _check_reward_scoring(config) -> list[str]:
    """``reward.num_workers`` (read as ``reward_model.num_workers``) and ``launch_reward_fn_async``.

    Returns a note when async scoring cannot overlap anything: dynamic sampling reads the scores
    before the log-prob passes, so they are computed first, as verl's DAPO trainer does.
    """
    reward_model = config.reward_model
    try:
        check_num_workers(plain(reward_model.num_workers))
    except RewardConfigError as exc:
        raise ConfigError(str(exc)) from None
    if reward_model.launch_reward_fn_async and config.algorithm.filter_groups.enable:
        return [
            "reward_model.launch_reward_fn_async=True: with algorithm.filter_groups.enable=True the scores "
            "decide which groups are kept before the log-prob passes, so scoring runs before them "
            "(no overlap; as verl's DAPO trainer does)"
        ]
    return []


def _check_registered(key: str, value, known, register: str, shown: str | None = None) -> None:
    """``value`` is a name registered in ``known`` (else one line naming ``key`` and ``@register``)."""
    if not isinstance(value, str) or value not in known:
        shown = shown or f"{key}={plain(value)!r}"
        raise ConfigError(
            f"{shown} is unknown; known: {', '.join(sorted(map(str, known)))}; "
            f"pick one of them or register your own with @{register}"
        )


def _group_of_one_notes(config) -> list[str]:
    """``rollout.n=1`` with an estimator of :data:`GROUP_OF_ONE_AS_VERL` runs as verl runs it (its
    examples/rollout_correction scripts): each prompt's group holds one response, whose baseline is
    0 (and std 1: verl's ``compute_grpo_outcome_advantage``; RLOO has no leave-one-out baseline), so
    the advantage is the score itself."""
    estimator, n = config.algorithm.adv_estimator, config.actor_rollout_ref.rollout.n
    if estimator not in GROUP_OF_ONE_AS_VERL or n >= 2:
        return []
    grpo = not estimator.startswith("rloo")
    scaled = " / (1 + epsilon)" if grpo and config.algorithm.norm_adv_by_std_in_grpo else ""
    baseline = "its mean is 0 and its std 1" if grpo else "no other response makes a baseline"
    return [
        f"algorithm.adv_estimator={estimator} with {ROLLOUT}.n={n}: each prompt's group holds one response, "
        f"so (as verl) {baseline} - the advantage is the response's score{scaled}, "
        f"not a comparison with other responses ({ROLLOUT}.n >= 2 compares them)"
    ]


def _check_registered_names(config) -> None:
    """Names the run looks up in registries, checked before any worker starts."""
    algorithm, actor, rollout = config.algorithm, config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    estimator = algorithm.adv_estimator
    _check_registered("algorithm.adv_estimator", estimator, ADV_ESTIMATOR_REGISTRY, "register_adv_est")
    n = rollout.n
    if estimator in ADV_ESTIMATOR_NEEDS_GROUP and n < 2 and estimator not in GROUP_OF_ONE_AS_VERL:
        raise ConfigError(
            f"algorithm.adv_estimator={estimator} compares the responses to one prompt with each other, "
            f"but {ROLLOUT}.n={n} samples one per prompt; set {ROLLOUT}.n to 2 or more (4-16 is usual), "
            "or use adv_estimator=gae, reinforce_plus_plus or remax"
        )
    if actor.use_kl_loss:
        _check_registered(f"{ACTOR}.kl_loss_type", actor.kl_loss_type, kl_penalty_names(), "register_kl_penalty")
    if algorithm.use_kl_in_reward:
        _check_registered("algorithm.kl_penalty", algorithm.kl_penalty, kl_penalty_names(), "register_kl_penalty")
    loss_mode = actor.policy_loss.loss_mode
    _check_registered(f"{ACTOR}.policy_loss.loss_mode", loss_mode, POLICY_LOSS_REGISTRY, "register_policy_loss")
    manager = config.reward_model.reward_manager
    if manager in VERL_ONLY_MANAGERS and manager not in REWARD_MANAGERS:
        raise ConfigError(f"reward_model.reward_manager={manager}: {VERL_ONLY_MANAGERS[manager]}")
    _check_registered("reward_model.reward_manager", manager, REWARD_MANAGERS, "register_reward_manager")
    _check_reward_manager_keys(REWARD_MANAGERS.get(manager), config)
    loggers = plain(config.trainer.logger)
    for name in loggers if isinstance(loggers, list) else [loggers]:  # verl also takes one name
        shown = f"trainer.logger={loggers!r}: the logger {name!r}"
        _check_registered("trainer.logger", name, available_loggers(), "register_logger", shown=shown)
    engines = set(ROLLOUT_REGISTRY) | set(OPTIONAL_ENGINES)
    _check_registered(f"{ROLLOUT}.name", rollout.name, engines, "register_rollout")


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
    device = config.trainer.device
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
    for key, (reason, when) in IGNORED_KEYS.items():
        if (
            (when == "single" and world_size > 1)
            or (when == "hf" and not _on_hf_engine(config, key))
            or (when == "cpu" and _on_cuda(config))
        ):
            continue
        value = plain(value_at(config, key))
        default = value_at(defaults, key, _UNSET)
        if default is _UNSET or value == plain(default):
            continue
        source = _interpolation_source(key)
        if source is not None and value == plain(value_at(config, source)):
            continue  # it still copies its source key; that key's own note (if any) says it once
        notes.append(f"{key}={value!r} is ignored: {reason}")
    tool = config.global_profiler.tool
    if tool in ("torch_memory", "nsys") and not _on_cuda(config):
        notes.append(f"global_profiler.tool={tool} records CUDA only: on the CPU nothing is recorded")
    name = config.actor_rollout_ref.rollout.name
    if isinstance(name, str) and name in OPTIONAL_ENGINES and name not in ROLLOUT_REGISTRY:
        notes.append(
            f"{ROLLOUT}.name={name}: this build has no {OPTIONAL_ENGINES[name]} engine; generating with the HF engine"
        )
    return notes


def _on_hf_engine(config, key: str) -> bool:
    """Whether the engine section ``key`` belongs to (the policy's rollout or the judge's) generates
    with HF, for which its vLLM keys mean nothing."""
    section = key.split(".engine_kwargs.")[0] if ".engine_kwargs." in key else key.rpartition(".")[0]
    return value_at(config, section).name in ("hf", *OPTIONAL_ENGINES)


def _interpolation_source(key: str) -> str | None:
    """The key that ``key`` copies in the packaged yaml (``${a.b}`` or the sibling ``${.b}``), or None."""
    text = value_at(packaged_defaults(resolved=False), key)
    match = re.fullmatch(r"\$\{(\.?)([\w.]+)\}", text) if isinstance(text, str) else None
    if match is None:
        return None
    return f"{key.rpartition('.')[0]}.{match.group(2)}" if match.group(1) else match.group(2)
