"""verl's batch-size rules: the start-up check, and the per-worker arithmetic the FSDP workers
apply (``normalize_batch_sizes``), so the check and the run agree."""

from __future__ import annotations

from hybridrl.config.access import _UNSET, _get, _int_at_least
from hybridrl.config.key_tables import ACTOR, REF, ROLLOUT
from hybridrl.errors import ConfigError


def _check_batch_sizes(config, dp: int, use_critic: bool) -> None:
    """verl's batch-size rules, as its trainer and FSDP workers apply them (the critic's with ``use_critic``)."""
    n = _get(config, f"{ROLLOUT}.n")
    train_bs = _get(config, "data.train_batch_size")
    if (train_bs * n) % dp:
        raise ConfigError(
            f"data.train_batch_size={train_bs} x {ROLLOUT}.n={n} = {train_bs * n} responses do not "
            f"split over {dp} workers; make it a multiple of {dp} or change trainer.n_gpus_per_node"
        )
    roles = [(ACTOR, _get(config, ACTOR))]
    if use_critic:
        roles.append(("critic", _get(config, "critic")))
    for prefix, cfg in roles:
        mini = _int_at_least(config, f"{prefix}.ppo_mini_batch_size", 1)
        if train_bs < mini:
            raise ConfigError(
                f"data.train_batch_size={train_bs} is smaller than {prefix}.ppo_mini_batch_size={mini}; "
                f"lower {prefix}.ppo_mini_batch_size or raise data.train_batch_size"
            )
        if train_bs % mini:
            raise ConfigError(
                f"data.train_batch_size={train_bs} is not a multiple of {prefix}.ppo_mini_batch_size={mini}, "
                f"so the last mini batch of every step would be smaller; make data.train_batch_size a "
                f"multiple of {prefix}.ppo_mini_batch_size"
            )
        normalize_batch_sizes(cfg, n, dp, prefix=prefix)
    for prefix in (ROLLOUT, REF):  # optional: the worker falls back to its own default
        _micro_per_worker(_get(config, prefix), prefix, "log_prob_micro_batch_size", dp, required=False)
    _check_token_budgets(config, use_critic)
    if _get(config, "reward_model.enable") and not _get(config, "reward_model.use_dynamic_bsz"):
        _micro_per_worker(_get(config, "reward_model"), "reward_model", "micro_batch_size", dp, required=True)


def _check_token_budgets(config, use_critic: bool) -> None:
    """With ``use_dynamic_bsz`` a micro batch holds whole rows: every token budget in use must
    hold the longest row the data can make."""
    longest = _get(config, "data.max_prompt_length") + _get(config, "data.max_response_length")
    budgets = [
        (f"{ACTOR}.use_dynamic_bsz", f"{ACTOR}.ppo_max_token_len_per_gpu"),
        (f"{ROLLOUT}.log_prob_use_dynamic_bsz", f"{ROLLOUT}.log_prob_max_token_len_per_gpu"),
        (f"{REF}.log_prob_use_dynamic_bsz", f"{REF}.log_prob_max_token_len_per_gpu"),
    ]
    if use_critic:
        budgets += [
            ("critic.use_dynamic_bsz", "critic.ppo_max_token_len_per_gpu"),
            ("critic.use_dynamic_bsz", "critic.forward_max_token_len_per_gpu"),
        ]
    for switch, key in budgets:
        if not _get(config, switch):
            continue
        budget = _int_at_least(config, key, 1)
        if budget < longest:
            raise ConfigError(
                f"{key}={budget} is smaller than data.max_prompt_length + data.max_response_length = {longest} "
                f"tokens, the longest row; raise it to at least {longest} (a few times that packs several "
                f"rows per forward) or set {switch}=false"
            )


def normalize_batch_sizes(actor_cfg_or_critic_cfg, rollout_n: int, dp: int, prefix: str | None = None) -> dict:
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
            f"split over {dp} workers; make ppo_mini_batch_size x n a multiple of {dp}"
        )
    per_worker = total // dp
    dynamic = bool(_get(cfg, "use_dynamic_bsz"))
    micro = _micro_per_worker(cfg, prefix, "ppo_micro_batch_size", dp, required=not dynamic)
    if micro is not None and not dynamic and per_worker % micro:
        raise ConfigError(
            f"{prefix}.ppo_mini_batch_size={mini} x n={rollout_n} / {dp} workers = {per_worker} responses "
            f"per worker do not split into micro batches of {micro} "
            f"({prefix}.ppo_micro_batch_size_per_gpu); pick a micro batch that divides {per_worker}"
        )
    out = {"ppo_mini_batch_size": per_worker, "ppo_micro_batch_size_per_gpu": micro}
    if is_critic:
        fwd = _micro_per_worker(cfg, prefix, "forward_micro_batch_size", dp, required=False)
        out["forward_micro_batch_size_per_gpu"] = fwd if fwd is not None else micro
    return out


def _micro_per_worker(cfg, prefix: str, name: str, dp: int, required: bool):
    """Per-worker micro batch from ``<name>_per_gpu`` or the deprecated global ``<name>`` // dp."""
    per_gpu_key = f"{name}_per_gpu"
    global_mb = _get(cfg, name)
    per_gpu = _get(cfg, per_gpu_key)
    if global_mb is not None and per_gpu is not None:
        raise ConfigError(
            f"{prefix}.{name}={global_mb} and {prefix}.{per_gpu_key}={per_gpu} are both set; "
            f"remove the deprecated {prefix}.{name} (write {prefix}.{name}=null)"
        )
    if per_gpu is not None:
        return _int_at_least(cfg, per_gpu_key, 1, prefix)
    if global_mb is not None:
        global_mb = _int_at_least(cfg, name, 1, prefix)
        if global_mb // dp < 1:
            raise ConfigError(
                f"{prefix}.{name}={global_mb} split over {dp} workers is 0 per worker; "
                f"set {prefix}.{per_gpu_key} instead (the deprecated key is divided by the workers)"
            )
        return global_mb // dp
    if required:
        raise ConfigError(
            f"{prefix}.{per_gpu_key} is not set; set it (e.g. {prefix}.{per_gpu_key}=4) "
            f"or turn on {prefix}.use_dynamic_bsz=true"
        )
    return None


def worker_batch_sizes(section, rollout_n: int, dp: int) -> dict:
    """What each of ``dp`` workers trains an actor or critic section with, computed once by the
    driver and handed to the workers: :func:`normalize_batch_sizes`, with the micro batch set to
    the whole mini batch under ``use_dynamic_bsz`` (micro batches are then cut by tokens).

    Raises:
        ConfigError: as :func:`normalize_batch_sizes`.
    """
    sizes = normalize_batch_sizes(section, rollout_n, dp)
    if sizes["ppo_micro_batch_size_per_gpu"] is None:
        sizes["ppo_micro_batch_size_per_gpu"] = sizes["ppo_mini_batch_size"]
    return sizes
