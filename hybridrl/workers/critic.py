"""The PPO critic: token values and the clipped value-loss update.

With sequence parallelism it works on its SP group's rows and returns its own rows' values
(:mod:`hybridrl.workers.sequence_parallel`), as the actor does. How each pass runs (micro
batches, packing) is the spec the worker hands each call (:mod:`hybridrl.workers.pass_specs`).
"""

from __future__ import annotations

from collections import defaultdict

import torch

from hybridrl.algorithms.functional import masked_mean
from hybridrl.algorithms.value_loss import compute_value_loss
from hybridrl.models.attention import use_ulysses_attention
from hybridrl.models.ulysses import UlyssesGroup
from hybridrl.protocol import DataProto
from hybridrl.workers.metric_reads import accumulate, read_metrics
from hybridrl.workers.micro_batches import restore_order
from hybridrl.workers.model_forward import ForwardOptions, compute_dtype_of, forward_response_values
from hybridrl.workers.optim import optimizer_step
from hybridrl.workers.pass_specs import ForwardSpec, UpdateSpec
from hybridrl.workers.sequence_parallel import gather_rows, own_rows, sequence_parallel_group
from hybridrl.workers.sharding import loss_normalizers

SP_KEY = "critic.ulysses_sequence_parallel_size"


class PPOCritic:
    """Args: ``config`` is the ``critic`` section as configured (value clipping, loss aggregation,
    gradient clipping, precision); batch sizes come with each call's spec.

    With ``critic.ulysses_sequence_parallel_size`` S > 1 the critic joins its SP group (a
    collective the first time, see :class:`~hybridrl.workers.actor.PPOActor`).

    Raises:
        ConfigError: S does not divide the number of workers.
        SequenceParallelError: S > 1 with a model whose attention S cannot split.
    """

    def __init__(self, config, critic_module: torch.nn.Module, critic_optimizer) -> None:
        self.config = config
        self.critic_module = critic_module
        self.critic_optimizer = critic_optimizer
        self.compute_dtype = compute_dtype_of(config.model.fsdp_config)
        self.sequence_parallel: UlyssesGroup | None = sequence_parallel_group(
            config.ulysses_sequence_parallel_size, SP_KEY
        )
        self.sp_size = self.sequence_parallel.size if self.sequence_parallel is not None else 1
        if self.sequence_parallel is not None:
            use_ulysses_attention(critic_module, self.sp_size, SP_KEY)

    def forward_options(self, spec: ForwardSpec | UpdateSpec) -> ForwardOptions:
        """Padded or packed, as the pass's ``spec.use_remove_padding`` says; over the SP group."""
        return ForwardOptions(use_remove_padding=spec.use_remove_padding, sequence_parallel=self.sequence_parallel)

    @torch.no_grad()
    def compute_values(self, data: DataProto, spec: ForwardSpec) -> torch.Tensor:
        """``(bs, response_length)`` values, zero outside ``response_mask``.

        Micro batches as ``spec`` cuts them: ``micro_batch_size`` rows, or with ``use_dynamic_bsz``
        at most ``max_token_len`` tokens per rank (S times that over an SP group's rows).

        Raises:
            ConfigError: with ``spec.use_dynamic_bsz``, a row longer than the token budget.
        """
        self.critic_module.eval()
        keys = ["responses", "input_ids", "attention_mask", "position_ids"]
        micros, order = spec.micro_batches(
            gather_rows(data.select(batch_keys=keys), self.sequence_parallel), self.sp_size
        )
        options = self.forward_options(spec)
        values = [forward_response_values(self.critic_module, micro, self.compute_dtype, options) for micro in micros]
        values = own_rows(restore_order(torch.cat(values), order), self.sequence_parallel)
        mask = data.batch["response_mask"].bool()
        return torch.where(mask, values, 0.0)  # not `* mask`: NaN * 0 is NaN

    def update_critic(self, data: DataProto, spec: UpdateSpec) -> dict[str, list[float]]:
        """Clipped value-loss updates over ``spec.ppo_epochs`` x mini batches of
        ``spec.ppo_mini_batch_size`` rows (micro-batch accumulation, micro batches as ``spec`` cuts
        them). Returns the metrics as lists (one entry per micro batch or per optimizer step).

        Raises:
            ConfigError: with ``spec.use_dynamic_bsz``, a row longer than the token budget.
        """
        self.critic_module.train()
        keys = ["responses", "response_mask", "input_ids", "attention_mask", "position_ids", "values", "returns"]
        metrics: dict[str, list[float]] = defaultdict(list)
        for _ in range(spec.ppo_epochs):
            for mini_batch in data.select(batch_keys=keys).split(spec.ppo_mini_batch_size):
                self._update_mini_batch(gather_rows(mini_batch, self.sequence_parallel), spec, metrics)
        self.critic_optimizer.zero_grad(set_to_none=True)
        return dict(metrics)

    def _update_mini_batch(self, mini_batch: DataProto, spec: UpdateSpec, metrics) -> None:
        """One optimizer step over ``mini_batch``; appends its metrics."""
        cfg = self.config
        norm = loss_normalizers(mini_batch.batch["response_mask"], cfg.loss_scale_factor, self.sp_size)
        self.critic_optimizer.zero_grad(set_to_none=True)
        # read once per mini batch (one host sync, not three per micro batch), the same values
        sums: dict[str, torch.Tensor] = {}
        pending: dict[str, list[torch.Tensor]] = defaultdict(list)
        micros, _ = spec.micro_batches(mini_batch, self.sp_size)
        options = self.forward_options(spec)
        for micro in micros:
            mb = micro.batch
            vpreds = forward_response_values(self.critic_module, micro, self.compute_dtype, options)
            vf_loss, vf_clipfrac = compute_value_loss(
                vpreds,
                mb["returns"],
                mb["values"],
                mb["response_mask"],
                cfg.cliprange_value,
                loss_agg_mode=cfg.loss_agg_mode,
                **norm,
            )
            vf_loss.backward()
            accumulate(sums, "critic/vf_loss", vf_loss)
            pending["critic/vf_clipfrac"].append(vf_clipfrac)
            pending["critic/vpred_mean"].append(masked_mean(vpreds.detach(), mb["response_mask"]))
        for key, value in read_metrics(pending, sums):
            metrics[key].append(value)
        metrics["critic/grad_norm"].append(
            optimizer_step(self.critic_module, self.critic_optimizer, cfg.grad_clip, "critic")
        )
