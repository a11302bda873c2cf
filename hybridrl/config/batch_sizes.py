"""verl's batch-size rules: the start-up check, and the per-worker arithmetic the FSDP workers
apply (``normalize_batch_sizes``), so the check and the run agree. Sections are read by attribute
(typed config sections)."""

from __future__ import annotations

from dataclasses import dataclass

from hybridrl.config.key_tables import ACTOR, REF, ROLLOUT
from hybridrl.config.rules import at_least
from hybridrl.errors import ConfigError

__all__ = ["check_batch_sizes", "normalize_batch_sizes", "micro_per_worker", "WorkerBatchSizes", "worker_batch_sizes"]


def check_batch_sizes(config, dp: int, use_critic: bool) -> None:
    """verl's batch-size rules, as its trainer and FSDP workers apply them (the critic's with ``use_critic``).

    Raises:
        ConfigError: the batch does not split over the ``dp`` workers, into mini batches or into
            micro batches; a token budget below the longest row (one line naming the keys).
    """
    arr = config.actor_rollout_ref
    n = arr.rollout.n
    train_bs = config.data.train_batch_size
    if (train_bs * n) % dp:
        raise ConfigError(
            f"data.train_batch_size={train_bs} x {ROLLOUT}.n={n} = {train_bs * n} responses do not "
            f"split over {dp} workers; make it a multiple of {dp} or change trainer.n_gpus_per_node"
        )
    roles = [(ACTOR, arr.actor)] + ([("critic", config.critic)] if use_critic else [])
    for prefix, section in roles:
        mini = at_least(f"{prefix}.ppo_mini_batch_size", section.ppo_mini_batch_size, 1)
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
        normalize_batch_sizes(section, n, dp, prefix=prefix)
    for prefix, section in ((ROLLOUT, arr.rollout), (REF, arr.ref)):  # optional: the worker's default
        micro_per_worker(section, prefix, "log_prob_micro_batch_size", dp, required=False)
    _check_token_budgets(config, use_critic)
    reward_model = config.reward_model
    if reward_model.enable and not reward_model.use_dynamic_bsz:
        micro_per_worker(reward_model, "reward_model", "micro_batch_size", dp, required=True)


def _check_token_budgets(config, use_critic: bool) -> None:
    """With ``use_dynamic_bsz`` a micro batch holds whole rows: every token budget in use must
    hold the longest row the data can make."""
    longest = config.data.max_prompt_length + config.data.max_response_length
    actor, rollout, ref = (
        config.actor_rollout_ref.actor,
        config.actor_rollout_ref.rollout,
        config.actor_rollout_ref.ref,
    )
    budgets = [
        (
            f"{ACTOR}.use_dynamic_bsz",
            actor.use_dynamic_bsz,
            f"{ACTOR}.ppo_max_token_len_per_gpu",
            actor.ppo_max_token_len_per_gpu,
        ),
        (
            f"{ROLLOUT}.log_prob_use_dynamic_bsz",
            rollout.log_prob_use_dynamic_bsz,
            f"{ROLLOUT}.log_prob_max_token_len_per_gpu",
            rollout.log_prob_max_token_len_per_gpu,
        ),
        (
            f"{REF}.log_prob_use_dynamic_bsz",
            ref.log_prob_use_dynamic_bsz,
            f"{REF}.log_prob_max_token_len_per_gpu",
            ref.log_prob_max_token_len_per_gpu,
        ),
    ]
    if use_critic:
        critic = config.critic
        budgets += [
            (
                "critic.use_dynamic_bsz",
                critic.use_dynamic_bsz,
                "critic.ppo_max_token_len_per_gpu",
                critic.ppo_max_token_len_per_gpu,
            ),
            (
                "critic.use_dynamic_bsz",
                critic.use_dynamic_bsz,
                "critic.forward_max_token_len_per_gpu",
                critic.forward_max_token_len_per_gpu,
            ),
        ]
    for switch, on, key, value in budgets:
        if not on:
            continue
        budget = at_least(key, value, 1)
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
        actor_cfg_or_critic_cfg: the typed ``actor_rollout_ref.actor`` or ``critic`` section.
        rollout_n: responses per prompt (``actor_rollout_ref.rollout.n``), >= 1.
        dp: data-parallel workers, >= 1.
        prefix: key path used in messages; guessed from the section when None.

    Returns:
        dict with ``ppo_mini_batch_size`` (responses per worker per optimizer step) and
        ``ppo_micro_batch_size_per_gpu`` (None only with ``use_dynamic_bsz``); for a critic also
        ``forward_micro_batch_size_per_gpu``.

    Raises:
        ConfigError: the mini batch does not split over the workers or into micro batches, both
            micro-batch keys are set, or neither is set without ``use_dynamic_bsz``.
    """
    section = actor_cfg_or_critic_cfg
    is_critic = hasattr(section, "cliprange_value")
    prefix = prefix or ("critic" if is_critic else ACTOR)
    mini = at_least(f"{prefix}.ppo_mini_batch_size", section.ppo_mini_batch_size, 1)
    total = mini * rollout_n
    if total % dp:
        raise ConfigError(
            f"{prefix}.ppo_mini_batch_size={mini} x {ROLLOUT}.n={rollout_n} = {total} responses do not "
            f"split over {dp} workers; make ppo_mini_batch_size x n a multiple of {dp}"
        )
    per_worker = total // dp
    dynamic = bool(section.use_dynamic_bsz)
    micro = micro_per_worker(section, prefix, "ppo_micro_batch_size", dp, required=not dynamic)
    # Ulysses SP: a group of sp workers trains the union of its rows (verl: dp = workers / sp)
    sp = int(getattr(section, "ulysses_sequence_parallel_size", 1) or 1)
    rows = per_worker * sp
    if micro is not None and not dynamic and rows % micro:
        split = f"{dp} workers = {rows} responses per worker"
        if sp > 1:
            split = f"{dp} workers x {sp} = {rows} responses per sequence-parallel group"
        raise ConfigError(
            f"{prefix}.ppo_mini_batch_size={mini} x n={rollout_n} / {split} "
            f"do not split into micro batches of {micro} "
            f"({prefix}.ppo_micro_batch_size_per_gpu); pick a micro batch that divides {rows}"
        )
    out = {"ppo_mini_batch_size": per_worker, "ppo_micro_batch_size_per_gpu": micro}
    if is_critic:
        fwd = micro_per_worker(section, prefix, "forward_micro_batch_size", dp, required=False)
        out["forward_micro_batch_size_per_gpu"] = fwd if fwd is not None else micro
    return out


def micro_per_worker(section, prefix: str, name: str, dp: int, required: bool):
    """Per-worker micro batch from ``<name>_per_gpu`` or the deprecated global ``<name>`` // dp
    (``name``: a field pair of the typed ``section``, e.g. ``log_prob_micro_batch_size``).

    Raises:
        ConfigError: both set, a value below 1, a global one that is 0 per worker, or neither set
            when ``required``.
    """
    per_gpu_key = f"{name}_per_gpu"
    global_mb = getattr(section, name)
    per_gpu = getattr(section, per_gpu_key)
    if global_mb is not None and per_gpu is not None:
        raise ConfigError(
            f"{prefix}.{name}={global_mb} and {prefix}.{per_gpu_key}={per_gpu} are both set; "
            f"remove the deprecated {prefix}.{name} (write {prefix}.{name}=null)"
        )
    if per_gpu is not None:
        return at_least(f"{prefix}.{per_gpu_key}", per_gpu, 1)
    if global_mb is not None:
        global_mb = at_least(f"{prefix}.{name}", global_mb, 1)
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


@dataclass(frozen=True)
class WorkerBatchSizes:
    """What one of the data-parallel workers trains an actor or critic with, in responses (rows)
    on that worker; verl's names.

    Attributes:
        ppo_mini_batch_size: responses per optimizer step on this worker
            (``ppo_mini_batch_size x rollout.n / workers``).
        ppo_micro_batch_size_per_gpu: responses per forward/backward of the update (the whole
            mini batch under ``use_dynamic_bsz``, where micro batches are cut by tokens instead);
            also the log-prob passes' micro batch when their own keys are unset.
        forward_micro_batch_size_per_gpu: a critic's responses per values forward
            (``forward_micro_batch_size[_per_gpu]``, else its training micro batch); None for an actor.
    """

    ppo_mini_batch_size: int
    ppo_micro_batch_size_per_gpu: int
    forward_micro_batch_size_per_gpu: int | None = None


def worker_batch_sizes(section, rollout_n: int, dp: int) -> WorkerBatchSizes:
    """What each of ``dp`` workers trains an actor or critic section with, computed once by the
    driver and handed to the workers: :func:`normalize_batch_sizes`, with the micro batch set to
    the whole mini batch under ``use_dynamic_bsz`` (micro batches are then cut by tokens).

    Raises:
        ConfigError: as :func:`normalize_batch_sizes`.
    """
    sizes = normalize_batch_sizes(section, rollout_n, dp)
    micro = sizes["ppo_micro_batch_size_per_gpu"] or sizes["ppo_mini_batch_size"]
    forward = None
    if "forward_micro_batch_size_per_gpu" in sizes:  # a critic
        forward = sizes["forward_micro_batch_size_per_gpu"] or micro
    return WorkerBatchSizes(sizes["ppo_mini_batch_size"], micro, forward)
