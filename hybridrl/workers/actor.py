"""The PPO actor: log-probabilities of responses and the policy update.

Used for the actor (with an optimizer) and for the reference policy (without one). It holds
the ``actor_rollout_ref.actor`` (or ``.ref``) section and works on one data-parallel shard; how
each pass runs (micro batches, temperature, packing) is the spec the worker hands each call
(:mod:`hybridrl.workers.pass_specs`), never the batch's ``meta_info``.
With sequence parallelism it works on its SP group's rows and returns its own rows' results
(:mod:`hybridrl.workers.sequence_parallel`).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import torch

from hybridrl.algorithms.distillation import (
    DistillationLossConfig,
    distillation_ppo_loss,
    get_distillation_loss_settings,
)
from hybridrl.algorithms.errors import AlgorithmConfigError, AlgorithmInputError, check_finite_value
from hybridrl.algorithms.functional import sum_pi_squared_from_logits
from hybridrl.algorithms.kl import FULL_KL, kl_full_from_logits, kl_penalty
from hybridrl.algorithms.policy_loss import (
    POLICY_LOSS_KEYS,
    ActorLossKnobs,
    PolicyLossParams,
    agg_loss,
    get_policy_loss_fn,
)
from hybridrl.algorithms.rollout_corr import RolloutCorrectionConfig
from hybridrl.models.attention import use_ulysses_attention
from hybridrl.models.ulysses import UlyssesGroup
from hybridrl.protocol import DataProto
from hybridrl.workers.metric_reads import accumulate, read_metrics
from hybridrl.workers.micro_batches import restore_order
from hybridrl.workers.model_forward import (
    ForwardOptions,
    ResponseOutput,
    compute_dtype_of,
    forward_response,
    scatter_slots,
)
from hybridrl.workers.optim import optimizer_step
from hybridrl.workers.pass_specs import LogProbSpec, UpdateSpec
from hybridrl.workers.sequence_parallel import gather_rows, own_rows, sequence_parallel_group
from hybridrl.workers.sharding import loss_normalizers
from hybridrl.workers.teacher import TOPK_KEYS, slots_to_rows

SP_KEY = "ulysses_sequence_parallel_size"
LOSS_TOTAL = "_loss"  # the micro losses' sum: read with the metrics for the finiteness check, not reported


def build_policy_loss_config(section) -> PolicyLossParams:
    """What the policy loss reads (``config=``) from an ``actor_rollout_ref.actor`` section: its
    ``policy_loss`` section and its loss keys (:class:`ActorLossKnobs`), flat.

    Knobs under ``policy_loss`` that are null keep :class:`PolicyLossConfig`'s defaults (verl's).
    Raises ``AlgorithmConfigError`` for a value the losses cannot use (the rules of
    :class:`PolicyLossConfig` and :class:`ActorLossKnobs`); the start-up check calls this too, so
    a bad value fails before any model loads.
    """
    policy_loss = section.policy_loss
    knobs = {key: getattr(policy_loss, key) for key in POLICY_LOSS_KEYS if getattr(policy_loss, key) is not None}
    actor_keys = {f.name: getattr(section, f.name) for f in dataclasses.fields(ActorLossKnobs)}
    correction = policy_loss.rollout_correction  # copied from algorithm.* by the driver
    return PolicyLossParams(
        loss_mode=policy_loss.loss_mode,
        rollout_correction=RolloutCorrectionConfig.from_section(correction) if correction is not None else None,
        **actor_keys,
        **knobs,
    )


class PPOActor:
    """Computes log-probs and runs PPO updates on ``actor_module``.

    Args:
        config: the ``actor_rollout_ref.actor`` (or ``.ref``) section as configured: the loss,
            KL, entropy and logits-chunking settings; batch sizes come with each call's spec.
        actor_module: a causal LM.
        actor_optimizer: None for the reference policy.
        ref_module: the reference policy's module; needed only for ``kl_loss_type=full``, whose
            exact KL needs the reference logits of every micro batch.
        distillation: on-policy distillation's loss config (``distillation.enabled``): the update
            trains on :func:`~hybridrl.algorithms.distillation.distillation_ppo_loss` with the
            batch's teacher scores (``teacher_log_prob``, or the top-k tensors) instead of the
            policy loss alone.

    With the section's ``ulysses_sequence_parallel_size`` S > 1 the actor joins its SP group
    (:func:`hybridrl.workers.sequence_parallel.sequence_parallel_group`: a collective the first
    time, so every rank builds its actors in the same order, as ``init_model`` does) and switches
    the module to the split attention (the reference, same S, too).

    Raises:
        ConfigError: S does not divide the number of workers.
        SequenceParallelError: S > 1 with a model whose attention S cannot split.
    """

    def __init__(
        self,
        config,
        actor_module: torch.nn.Module,
        actor_optimizer=None,
        ref_module: torch.nn.Module | None = None,
        distillation: DistillationLossConfig | None = None,
    ) -> None:
        self.config = config
        self.distillation = distillation
        self.distillation_topk = bool(
            distillation is not None and get_distillation_loss_settings(distillation.loss_mode).use_topk
        )
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer
        self.ref_module = ref_module  # the frozen reference, for kl_loss_type=full
        self.compute_dtype = compute_dtype_of(config.fsdp_config)
        self.sequence_parallel: UlyssesGroup | None = sequence_parallel_group(
            config.ulysses_sequence_parallel_size, SP_KEY
        )
        self.sp_size = self.sequence_parallel.size if self.sequence_parallel is not None else 1
        if self.sequence_parallel is not None:
            use_ulysses_attention(actor_module, self.sp_size, SP_KEY)
        if actor_optimizer is not None:
            self.policy_loss_fn = get_policy_loss_fn(config.policy_loss.loss_mode)
            self.policy_loss_config = build_policy_loss_config(config)

    def forward_options(self, spec: LogProbSpec | UpdateSpec) -> ForwardOptions:
        """Padded or packed (the pass's ``spec.use_remove_padding``, the worker's
        ``model.use_remove_padding``); chunked logits from this section's
        ``entropy_from_logits_with_chunking`` / ``entropy_checkpointing``; the logits' log-prob and
        entropy compiled on CUDA with ``use_torch_compile`` (verl's default: true)."""
        return ForwardOptions(
            use_remove_padding=spec.use_remove_padding,
            logits_chunking=bool(self.config.entropy_from_logits_with_chunking),
            entropy_checkpointing=bool(self.config.entropy_checkpointing),
            sequence_parallel=self.sequence_parallel,
            use_torch_compile=bool(getattr(self.config, "use_torch_compile", False)),
        )

    def _forward_micro_batches(self, data: DataProto, spec: LogProbSpec) -> tuple[list[DataProto], list[int] | None]:
        """Micro batches of a log-prob pass as ``spec`` cuts them, over the SP group's rows
        (with ``use_dynamic_bsz`` a budget of ``S * max_token_len`` tokens, as verl)."""
        keys = ["responses", "input_ids", "attention_mask", "position_ids"]
        return spec.micro_batches(gather_rows(data.select(batch_keys=keys), self.sequence_parallel), self.sp_size)

    @torch.no_grad()
    def compute_log_prob(self, data: DataProto, spec: LogProbSpec):
        """Log-probs of ``data.batch["responses"]`` under the module, the pass run as ``spec`` says
        (temperature, rows or tokens per forward, packing, which extras).

        Returns ``(log_probs, entropys, sum_pi_squared)``, each ``(bs, response_length)`` fp32 in
        the rows' order, 0 where there is no response token; ``entropys`` and ``sum_pi_squared``
        (``sum_v pi(v)^2`` of each position's distribution, for the optimal token baseline) are
        None unless ``spec`` asks for them. ``sum_pi_squared`` needs each micro batch's full
        logits (no logits chunking in that pass).

        Raises:
            ConfigError: with ``spec.use_dynamic_bsz``, a row longer than the token budget.
        """
        self.actor_module.eval()
        options = self.forward_options(spec)
        micros, order = self._forward_micro_batches(data, spec)
        calculate_entropy, calculate_sum_pi_squared = spec.calculate_entropy, spec.calculate_sum_pi_squared
        outs = [
            forward_response(
                self.actor_module,
                micro,
                spec.temperature,
                self.compute_dtype,
                options,
                calculate_entropy=calculate_entropy,
                return_logits=calculate_sum_pi_squared,
            )
            for micro in micros
        ]
        sp = self.sequence_parallel
        log_probs = own_rows(restore_order(torch.cat([out.log_probs for out in outs]), order), sp)
        entropys = (
            own_rows(restore_order(torch.cat([out.entropy for out in outs]), order), sp) if calculate_entropy else None
        )
        sum_pi_squared = None
        if calculate_sum_pi_squared:
            per_micro = [scatter_slots(sum_pi_squared_from_logits(out.logits), out.slots) for out in outs]
            sum_pi_squared = own_rows(restore_order(torch.cat(per_micro), order), sp)
        return log_probs, entropys, sum_pi_squared

    @torch.no_grad()
    def compute_full_kl(self, data: DataProto, ref_module: torch.nn.Module, spec: LogProbSpec) -> torch.Tensor:
        """Exact per-token KL(actor || ref) over the vocabulary, ``(bs, response_length)`` fp32.

        For ``algorithm.kl_penalty=full``: both models see the same micro batches, cut as ``spec``
        (the reference pass's) says and at its temperature, so only one micro batch's two
        ``(rows, response_length, vocab)`` logits tensors exist at a time.
        """
        self.actor_module.eval()
        temperature = spec.temperature
        options = self.forward_options(spec)
        micros, order = self._forward_micro_batches(data, spec)
        kls = []
        for micro in micros:
            out = forward_response(
                self.actor_module, micro, temperature, self.compute_dtype, options, return_logits=True
            )
            ref = forward_response(ref_module, micro, temperature, self.compute_dtype, options, return_logits=True)
            kls.append(scatter_slots(kl_full_from_logits(out.logits, ref.logits), out.slots))
        return own_rows(restore_order(torch.cat(kls), order), self.sequence_parallel)

    def update_policy(
        self, data: DataProto, spec: UpdateSpec, on_policy: bool = False
    ) -> tuple[dict[str, list[float]], torch.Tensor | None]:
        """PPO update over ``spec.ppo_epochs`` x mini batches of ``spec.ppo_mini_batch_size`` rows,
        accumulating micro batches (``spec.ppo_micro_batch_size_per_gpu`` rows, or token budgets).

        Each micro-batch loss is normalised by the token (or sequence) count of its whole
        mini batch, so the summed gradients equal those of one pass over the mini batch.
        With ``on_policy`` (the driver skipped the old-log-prob pass, see
        :func:`hybridrl.trainer.ppo.step_plan.reuses_update_log_probs`) the old log-probs are the
        update's own, detached (the ratio is exactly 1), and ``actor/entropy`` is reported.
        Returns ``(metrics, log_probs)``: metrics as lists (one entry per micro batch or per
        optimizer step); ``on_policy``: the update's own detached log-probs ``(bs, response_length)``
        in the rows' order (the old log-probs it used), else None.

        Raises:
            AlgorithmConfigError: ``on_policy`` but the batch makes more than one optimizer step
                (``ppo_epochs`` > 1 or several mini batches).
            AlgorithmInputError: not ``on_policy`` and the batch has no ``old_log_probs``.
        """
        cfg = self.config
        self.actor_module.train()
        if not on_policy and "old_log_probs" not in data.batch.keys():
            raise AlgorithmInputError(
                "actor update: the batch has no old_log_probs; compute them first "
                "(compute_log_prob), or pass on_policy=True for a single-step update"
            )
        keys = ["responses", "response_mask", "input_ids", "attention_mask", "position_ids", "advantages"]
        if not on_policy:
            keys.append("old_log_probs")
        if "rollout_is_weights" in data.batch.keys():  # rollout correction, decoupled mode
            keys.append("rollout_is_weights")
        if cfg.use_kl_loss and cfg.kl_loss_type != FULL_KL:
            keys.append("ref_log_prob")
        if self.distillation is not None:
            keys += list(TOPK_KEYS) if self.distillation_topk else ["teacher_log_prob"]
        metrics: dict[str, list[float]] = defaultdict(list)
        options = self.forward_options(spec)
        mini_batches = data.select(batch_keys=keys).split(spec.ppo_mini_batch_size)
        if on_policy and (spec.ppo_epochs != 1 or len(mini_batches) != 1):
            raise AlgorithmConfigError(
                f"actor update: on_policy=True but the batch makes {spec.ppo_epochs * len(mini_batches)} "
                "optimizer steps; only a single-step (on-policy) update can use its own log-probs; "
                "compute old_log_probs first or set ppo_epochs=1 and ppo_mini_batch_size=data.train_batch_size"
            )
        log_probs = None
        for _ in range(spec.ppo_epochs):
            for mini_batch in mini_batches:  # with SP: the mini batch of every rank of the group
                log_probs = self._update_mini_batch(
                    gather_rows(mini_batch, self.sequence_parallel), spec, metrics, options, on_policy
                )
        self.actor_optimizer.zero_grad(set_to_none=True)
        for key in [k for k in metrics if k.startswith("distillation/") and k.endswith(("_min", "_max"))]:
            metrics[key] = [min(metrics[key]) if key.endswith("_min") else max(metrics[key])]  # verl's MIN/MAX
        return dict(metrics), own_rows(log_probs, self.sequence_parallel) if log_probs is not None else None

    def _update_mini_batch(
        self, mini_batch: DataProto, spec: UpdateSpec, metrics, options: ForwardOptions, on_policy: bool = False
    ) -> torch.Tensor | None:
        """One optimizer step; returns the detached log-probs of an on-policy mini batch, else None."""
        cfg = self.config
        temperature = spec.temperature
        norm = loss_normalizers(mini_batch.batch["response_mask"], cfg.loss_scale_factor, self.sp_size)
        self.actor_optimizer.zero_grad(set_to_none=True)
        # Micro losses are already scaled by the mini-batch size: their sums are the mini-batch
        # values, however the rows fall into micro batches (fixed row counts or token budgets).
        # Summed as fp64 tensors on the device (what adding the fp32 values' .item() gave) and read
        # once per mini batch: no host sync per micro batch for them on CUDA. So are the policy
        # loss's per-micro-batch metrics (0-dim tensors) and the total loss, whose finiteness is
        # checked from that one read, before the optimizer steps.
        loss_sums: dict[str, torch.Tensor] = {}
        pending: dict[str, list[torch.Tensor]] = defaultdict(list)  # per micro batch, in order
        # token budget per rank: S times more over an SP group's rows
        micros, order = spec.micro_batches(mini_batch, self.sp_size)
        full_kl = cfg.use_kl_loss and cfg.kl_loss_type == FULL_KL
        own_log_probs = []
        for micro in micros:
            mb = micro.batch
            response_mask = mb["response_mask"]
            out = forward_response(
                self.actor_module,
                micro,
                temperature,
                self.compute_dtype,
                options,
                calculate_entropy=cfg.entropy_coeff != 0 or on_policy,
                return_logits=full_kl or self.distillation_topk,
                entropy_grad=cfg.entropy_coeff != 0,
            )
            log_prob = out.log_probs
            if on_policy:  # the metric the skipped old-log-prob pass would have given
                own_log_probs.append(log_prob.detach())
                accumulate(
                    loss_sums, "actor/entropy", agg_loss(out.entropy.detach(), response_mask, cfg.loss_agg_mode, **norm)
                )
            old_log_prob = log_prob.detach() if on_policy else mb["old_log_probs"]
            if self.distillation is not None:
                pg_loss, pg_metrics = self._distillation_loss(mb, out, old_log_prob, norm)
            else:
                pg_loss, pg_metrics = self.policy_loss_fn(
                    old_log_prob,
                    log_prob,
                    mb["advantages"],
                    response_mask,
                    loss_agg_mode=cfg.loss_agg_mode,
                    config=self.policy_loss_config,
                    rollout_is_weights=mb.get("rollout_is_weights", None),
                    **norm,
                )
            loss = pg_loss
            if cfg.entropy_coeff != 0:
                entropy = agg_loss(out.entropy, response_mask, cfg.loss_agg_mode, **norm)
                loss = loss - cfg.entropy_coeff * entropy
                accumulate(loss_sums, "actor/entropy_loss", entropy)
            if cfg.use_kl_loss:
                kld = self._kl_to_reference(micro, out, temperature, options)
                kl_loss = agg_loss(kld, response_mask, cfg.loss_agg_mode, **norm)
                loss = loss + cfg.kl_loss_coef * kl_loss
                accumulate(loss_sums, "actor/kl_loss", kl_loss)
            loss.backward()
            accumulate(loss_sums, "actor/pg_loss", pg_loss)
            accumulate(loss_sums, LOSS_TOTAL, loss)  # NaN/inf in any micro loss -> NaN/inf here
            for key, value in pg_metrics.items():
                pending[key].append(value)
        self._append_read_metrics(metrics, pending, loss_sums, mini_batch.meta_info.get("global_steps"))
        if cfg.use_kl_loss:
            metrics["actor/kl_coef"].append(cfg.kl_loss_coef)
        metrics["actor/grad_norm"].append(
            optimizer_step(self.actor_module, self.actor_optimizer, cfg.grad_clip, "actor")
        )
        return restore_order(torch.cat(own_log_probs), order) if on_policy else None

    def _distillation_loss(self, mb, out: ResponseOutput, old_log_prob: torch.Tensor, norm: dict):
        """:func:`~hybridrl.algorithms.distillation.distillation_ppo_loss` of one micro batch: the
        task's policy loss (``use_task_rewards``) plus the distillation loss against the batch's
        teacher scores; a top-k loss reads the student's log-softmax at the teacher's top-k ids."""
        assert self.distillation is not None  # the update calls this only with a distillation loss
        topk = {}
        teacher = mb.get("teacher_log_prob", None)
        if self.distillation_topk:
            assert out.logits is not None  # asked for (return_logits) when the loss is a top-k one
            teacher_ids = mb[TOPK_KEYS[1]].long()
            log_softmax = torch.log_softmax(out.logits.float(), dim=-1)
            ids = teacher_ids if log_softmax.dim() == 3 else teacher_ids[out.slots]
            k = teacher_ids.shape[-1]
            topk = {
                "student_topk_log_probs": slots_to_rows(log_softmax.gather(-1, ids), out.slots),
                "teacher_topk_ids": teacher_ids,
                "student_topk_ids": slots_to_rows(log_softmax.detach().topk(k, dim=-1).indices, out.slots),
            }
            teacher = mb[TOPK_KEYS[0]]
        return distillation_ppo_loss(
            old_log_prob,
            out.log_probs,
            mb["advantages"] if self.distillation.use_task_rewards else None,
            mb["response_mask"],
            teacher,
            config=self.distillation,
            loss_agg_mode=self.config.loss_agg_mode,
            policy_loss_mode=self.config.policy_loss.loss_mode,
            policy_loss_config=self.policy_loss_config,
            rollout_is_weights=mb.get("rollout_is_weights", None),
            **topk,
            **norm,
        )

    @staticmethod
    def _append_read_metrics(metrics, pending: dict, loss_sums: dict, data_step) -> None:
        """Reads the mini batch's pending metrics and loss sums at once (one host sync) and
        appends them: the policy loss's metrics one value per micro batch, the sums one each.

        Raises:
            NonFiniteError: the loss of a micro batch was NaN/inf (before the optimizer steps).
        """
        read = read_metrics(pending, loss_sums)
        for key, value in read:
            if key == LOSS_TOTAL:
                check_finite_value(
                    value, "actor loss (pg_loss - entropy_coeff * entropy + kl_loss_coef * kl_loss)", data_step
                )
        for key, value in read:
            if key != LOSS_TOTAL:
                metrics[key].append(value)

    def _kl_to_reference(
        self, micro: DataProto, out: ResponseOutput, temperature: float, options: ForwardOptions
    ) -> torch.Tensor:
        """Per-token KL to the reference for the KL loss, ``(bs, response_length)``."""
        kl_type = self.config.kl_loss_type
        if kl_type != FULL_KL:
            return kl_penalty(out.log_probs, micro.batch["ref_log_prob"], kl_type)
        if self.ref_module is None:
            raise AlgorithmConfigError(
                "actor_rollout_ref.actor.kl_loss_type=full needs the reference model in the actor's "
                "worker (role actor_rollout_ref); use another kl_loss_type or enable the reference"
            )
        with torch.no_grad():
            ref = forward_response(self.ref_module, micro, temperature, self.compute_dtype, options, return_logits=True)
        return scatter_slots(kl_full_from_logits(out.logits, ref.logits), out.slots)
