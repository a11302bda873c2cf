"""How each pass of the actor, the reference and the critic runs: frozen specs the worker builds
once (``init_model``) from its config sections and its per-worker batch sizes, and hands to
:class:`~hybridrl.workers.actor.PPOActor` / :class:`~hybridrl.workers.critic.PPOCritic` with
every call. Run settings never travel in a batch's ``meta_info`` (verl puts them there).

- :class:`ForwardSpec`: a forward-only pass (the critic's values);
- :class:`LogProbSpec`: a log-prob pass (the actor's old log-probs, the reference's log-probs);
- :class:`UpdateSpec`: a PPO update (actor or critic).

Batch sizes count responses (rows) on one worker; token budgets count valid tokens on one rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridrl.config.batch_sizes import WorkerBatchSizes
from hybridrl.protocol import DataProto
from hybridrl.workers.micro_batches import split_micro_batches

POLICY = "actor_rollout_ref"


def _budget(max_token_len: int | None, sp_size: int) -> int | None:
    """A rank's token budget over its SP group's rows: ``sp_size`` times the per-rank one (as verl)."""
    return max_token_len * sp_size if max_token_len else max_token_len


@dataclass(frozen=True)
class ForwardSpec:
    """A forward-only pass over a batch.

    Attributes:
        micro_batch_size: rows per forward on this worker (without ``use_dynamic_bsz``), >= 1.
        use_dynamic_bsz: cut the micro batches by tokens instead: at most ``max_token_len``
            valid tokens per forward on one rank.
        max_token_len: that budget (``log_prob_max_token_len_per_gpu``,
            ``forward_max_token_len_per_gpu``); read only with ``use_dynamic_bsz``.
        max_token_len_key: the budget's config key, for error messages.
        use_remove_padding: pack the valid tokens (``model.use_remove_padding``).
    """

    micro_batch_size: int
    use_dynamic_bsz: bool = False
    max_token_len: int | None = None
    max_token_len_key: str = "max_token_len"
    use_remove_padding: bool = False

    def micro_batches(self, data: DataProto, sp_size: int = 1) -> tuple[list[DataProto], list[int] | None]:
        """``data``'s micro batches and their row order (:func:`~hybridrl.workers.micro_batches.
        split_micro_batches`); ``sp_size``: the rows are an SP group's, the budget ``sp_size`` times
        larger.

        Raises:
            ConfigError: with ``use_dynamic_bsz``, a row longer than the budget.
        """
        budget = _budget(self.max_token_len, sp_size)
        return split_micro_batches(
            data, self.micro_batch_size, self.use_dynamic_bsz, budget, key=self.max_token_len_key
        )


@dataclass(frozen=True)
class LogProbSpec(ForwardSpec):
    """A log-prob pass of the policy or the reference (a :class:`ForwardSpec`, plus):

    Attributes:
        temperature: the logits are divided by it (``rollout.temperature``, as the rollout sampled).
        calculate_entropy: also return each response token's entropy.
        calculate_sum_pi_squared: also return ``sum_v pi(v)^2`` per token (``actor.calculate_sum_pi_squared``).
    """

    temperature: float = 1.0
    calculate_entropy: bool = False
    calculate_sum_pi_squared: bool = False


@dataclass(frozen=True)
class UpdateSpec:
    """A PPO update of the actor or the critic on one worker (verl's key names).

    Attributes:
        ppo_mini_batch_size: responses per optimizer step on this worker.
        ppo_micro_batch_size_per_gpu: responses per forward/backward (without ``use_dynamic_bsz``).
        ppo_epochs: passes over the batch.
        use_dynamic_bsz: cut the micro batches by tokens: at most ``ppo_max_token_len_per_gpu``
            valid tokens per forward/backward on one rank.
        ppo_max_token_len_per_gpu: that budget.
        max_token_len_key: the budget's config key, for error messages.
        temperature: the logits are divided by it (the actor's; the critic ignores it).
        use_remove_padding: pack the valid tokens (``model.use_remove_padding``).
    """

    ppo_mini_batch_size: int
    ppo_micro_batch_size_per_gpu: int
    ppo_epochs: int = 1
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: int | None = None
    max_token_len_key: str = "ppo_max_token_len_per_gpu"
    temperature: float = 1.0
    use_remove_padding: bool = False

    def micro_batches(self, mini_batch: DataProto, sp_size: int = 1) -> tuple[list[DataProto], list[int] | None]:
        """A mini batch's micro batches and their row order, as :meth:`ForwardSpec.micro_batches`.

        Raises:
            ConfigError: with ``use_dynamic_bsz``, a row longer than the budget.
        """
        budget = _budget(self.ppo_max_token_len_per_gpu, sp_size)
        return split_micro_batches(
            mini_batch, self.ppo_micro_batch_size_per_gpu, self.use_dynamic_bsz, budget, key=self.max_token_len_key
        )


@dataclass(frozen=True)
class PolicySpecs:
    """The passes of an ``ActorRolloutRefWorker``: ``log_prob`` (old log-probs, with entropy),
    ``ref_log_prob`` (the reference's; also the exact-KL pass), ``update`` (the actor's)."""

    log_prob: LogProbSpec
    ref_log_prob: LogProbSpec
    update: UpdateSpec


@dataclass(frozen=True)
class CriticSpecs:
    """The passes of a ``CriticWorker``: ``values`` and ``update``."""

    values: ForwardSpec
    update: UpdateSpec


def log_prob_spec(section, name: str, sizes: WorkerBatchSizes, world_size: int, **options) -> LogProbSpec:
    """The log-prob pass of ``actor_rollout_ref.<name>`` (``rollout`` or ``ref``): rows per forward
    from ``log_prob_micro_batch_size_per_gpu``, else the deprecated global
    ``log_prob_micro_batch_size`` / ``world_size`` (at least 1), else the actor's training micro
    batch (``sizes``); tokens per forward from ``log_prob_use_dynamic_bsz`` /
    ``log_prob_max_token_len_per_gpu``. ``options``: :class:`LogProbSpec`'s other fields."""
    micro = section.log_prob_micro_batch_size_per_gpu
    if not micro and section.log_prob_micro_batch_size:
        micro = max(1, section.log_prob_micro_batch_size // world_size)
    return LogProbSpec(
        micro_batch_size=int(micro or sizes.ppo_micro_batch_size_per_gpu),
        use_dynamic_bsz=bool(section.log_prob_use_dynamic_bsz),
        max_token_len=section.log_prob_max_token_len_per_gpu,
        max_token_len_key=f"{POLICY}.{name}.log_prob_max_token_len_per_gpu",
        **options,
    )


def update_spec(section, sizes: WorkerBatchSizes, prefix: str, **options) -> UpdateSpec:
    """The PPO update of an actor or critic ``section`` (config key ``prefix``) with its per-worker
    ``sizes``; ``options``: ``temperature``, ``use_remove_padding``."""
    return UpdateSpec(
        ppo_mini_batch_size=sizes.ppo_mini_batch_size,
        ppo_micro_batch_size_per_gpu=sizes.ppo_micro_batch_size_per_gpu,
        ppo_epochs=int(section.ppo_epochs),
        use_dynamic_bsz=bool(section.use_dynamic_bsz),
        ppo_max_token_len_per_gpu=section.ppo_max_token_len_per_gpu,
        max_token_len_key=f"{prefix}.ppo_max_token_len_per_gpu",
        **options,
    )


def policy_specs(config, sizes: WorkerBatchSizes, world_size: int) -> PolicySpecs:
    """The passes of the ``actor_rollout_ref`` section ``config`` on one of ``world_size``
    workers with the actor's per-worker ``sizes`` (``hybridrl.config.worker_batch_sizes``).
    Both log-prob passes and the update divide the logits by ``rollout.temperature`` and pack
    as ``model.use_remove_padding`` says."""
    common = {
        "temperature": float(config.rollout.temperature),
        "use_remove_padding": bool(config.model.use_remove_padding),
    }
    return PolicySpecs(
        log_prob=log_prob_spec(
            config.rollout,
            "rollout",
            sizes,
            world_size,
            calculate_entropy=True,
            calculate_sum_pi_squared=bool(config.actor.calculate_sum_pi_squared),
            **common,
        ),
        ref_log_prob=log_prob_spec(config.ref, "ref", sizes, world_size, **common),
        update=update_spec(config.actor, sizes, f"{POLICY}.actor", **common),
    )


def critic_specs(config, sizes: WorkerBatchSizes) -> CriticSpecs:
    """The passes of the ``critic`` section ``config`` with its per-worker ``sizes``: values in
    micro batches of ``forward_micro_batch_size_per_gpu`` rows (or of at most
    ``forward_max_token_len_per_gpu`` tokens with ``use_dynamic_bsz``), updates as
    :func:`update_spec`; both pack as ``critic.model.use_remove_padding`` says."""
    use_remove_padding = bool(config.model.use_remove_padding)
    values = ForwardSpec(
        micro_batch_size=int(sizes.forward_micro_batch_size_per_gpu or sizes.ppo_micro_batch_size_per_gpu),
        use_dynamic_bsz=bool(config.use_dynamic_bsz),
        max_token_len=config.forward_max_token_len_per_gpu,
        max_token_len_key="critic.forward_max_token_len_per_gpu",
        use_remove_padding=use_remove_padding,
    )
    return CriticSpecs(values, update_spec(config, sizes, "critic", use_remove_padding=use_remove_padding))
