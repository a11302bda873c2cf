"""The PPO actor: log-probabilities of responses and the policy update.

Used for the actor (with an optimizer) and for the reference policy (without one). It holds
no config beyond the ``actor_rollout_ref.actor`` section and works on one data-parallel shard.
"""

from __future__ import annotations

import logging
from collections import defaultdict

import torch

from hybridrl.algorithms.functional import entropy_from_logits, logprobs_from_logits
from hybridrl.algorithms.kl import kl_penalty
from hybridrl.algorithms.policy_loss import PolicyLossConfig, agg_loss, get_policy_loss_fn
from hybridrl.protocol import DataProto

logger = logging.getLogger(__name__)


def autocast(module: torch.nn.Module, compute_dtype: torch.dtype):
    """Mixed precision for forward passes: fp32 master weights, matmuls in ``compute_dtype``.

    ``fsdp_config.mixed_precision.param_dtype=bf16`` turns it on; bf16 matmuls are several
    times faster on GPUs and on CPUs with AMX. With fp32 it is a no-op.
    """
    device_type = next(module.parameters()).device.type
    return torch.autocast(device_type, dtype=compute_dtype, enabled=compute_dtype != torch.float32)


def compute_dtype_of(section) -> torch.dtype:
    """The ``fsdp_config.mixed_precision.param_dtype`` of an actor/ref/critic section."""
    from hybridrl.models import to_torch_dtype

    fsdp_config = section.get("fsdp_config") or section.get("model", {}).get("fsdp_config") or {}
    return to_torch_dtype((fsdp_config.get("mixed_precision") or {}).get("param_dtype", "fp32"))


def forward_model(module, micro_batch: DataProto, compute_dtype: torch.dtype, **kwargs):
    """One forward pass over ``input_ids`` / ``attention_mask`` / ``position_ids`` (bs, seqlen)."""
    batch = micro_batch.batch
    with autocast(module, compute_dtype):
        return module(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
            use_cache=False,
            **kwargs,
        )


def forward_response_logits(module, micro_batch: DataProto, temperature: float,
                            compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Logits that predict each response token, ``(bs, response_length, vocab)``, in fp32.

    Only the last ``response_length + 1`` positions are projected on the vocabulary
    (``logits_to_keep``), so the prompt never costs a ``(tokens x vocab)`` logits tensor.
    """
    response_length = micro_batch.batch["responses"].shape[-1]
    output = forward_model(module, micro_batch, compute_dtype, logits_to_keep=response_length + 1)
    logits = output.logits[:, :-1, :].float()
    return logits / temperature if temperature != 1.0 else logits


class PPOActor:
    """Computes log-probs and runs PPO updates on ``actor_module``.

    Args:
        config: the ``actor_rollout_ref.actor`` (or ``.ref``) section; ``ppo_mini_batch_size``
            and ``ppo_micro_batch_size_per_gpu`` already normalised to this worker (rows).
        actor_module: a causal LM.
        actor_optimizer: None for the reference policy.
    """

    def __init__(self, config, actor_module: torch.nn.Module, actor_optimizer=None) -> None:
        self.config = config
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer
        self.compute_dtype = compute_dtype_of(config)
        if actor_optimizer is not None:
            policy_loss = config.get("policy_loss") or {}
            self.policy_loss_fn = get_policy_loss_fn(policy_loss.get("loss_mode", "vanilla"))
            self.policy_loss_config = PolicyLossConfig(
                clip_ratio=config.clip_ratio,
                clip_ratio_low=config.get("clip_ratio_low"),
                clip_ratio_high=config.get("clip_ratio_high"),
                clip_ratio_c=config.get("clip_ratio_c", 3.0),
            )

    @torch.no_grad()
    def compute_log_prob(self, data: DataProto, calculate_entropy: bool = False):
        """Log-probs of ``data.batch["responses"]`` under the module.

        ``data.meta_info`` must hold ``micro_batch_size`` (rows per forward) and
        ``temperature``. Returns ``(log_probs, entropys)``, both ``(bs, response_length)``
        fp32; ``entropys`` is None unless asked for.
        """
        self.actor_module.eval()
        temperature = data.meta_info["temperature"]
        keys = ["responses", "input_ids", "attention_mask", "position_ids"]
        log_probs, entropys = [], []
        for micro in data.select(batch_keys=keys).split(data.meta_info["micro_batch_size"]):
            logits = forward_response_logits(self.actor_module, micro, temperature, self.compute_dtype)
            log_probs.append(logprobs_from_logits(logits, micro.batch["responses"]))
            if calculate_entropy:
                entropys.append(entropy_from_logits(logits))
        return torch.cat(log_probs), (torch.cat(entropys) if calculate_entropy else None)

    def update_policy(self, data: DataProto) -> dict[str, list[float]]:
        """PPO update over ``ppo_epochs`` x mini batches, accumulating micro batches.

        Each micro-batch loss is normalised by the token (or sequence) count of its whole
        mini batch, so the summed gradients equal those of one pass over the mini batch.
        Returns metrics as lists (one entry per micro batch or per optimizer step).
        """
        cfg = self.config
        self.actor_module.train()
        keys = ["responses", "response_mask", "input_ids", "attention_mask", "position_ids",
                "old_log_probs", "advantages"]
        if cfg.use_kl_loss:
            keys.append("ref_log_prob")
        metrics: dict[str, list[float]] = defaultdict(list)
        for _ in range(cfg.ppo_epochs):
            for mini_batch in data.select(batch_keys=keys).split(cfg.ppo_mini_batch_size):
                self._update_mini_batch(mini_batch, data.meta_info["temperature"], metrics)
        self.actor_optimizer.zero_grad(set_to_none=True)
        return dict(metrics)

    def _update_mini_batch(self, mini_batch: DataProto, temperature: float, metrics) -> None:
        cfg = self.config
        norm = {
            "global_num_tokens": mini_batch.batch["response_mask"].sum().item(),
            "global_batch_size": len(mini_batch),
        }
        self.actor_optimizer.zero_grad(set_to_none=True)
        # Micro losses are already scaled by the mini-batch size: their sums are the mini-batch values.
        loss_sums: dict[str, float] = defaultdict(float)
        for micro in mini_batch.split(cfg.ppo_micro_batch_size_per_gpu):
            mb = micro.batch
            response_mask = mb["response_mask"]
            logits = forward_response_logits(self.actor_module, micro, temperature, self.compute_dtype)
            log_prob = logprobs_from_logits(logits, mb["responses"])
            pg_loss, pg_metrics = self.policy_loss_fn(
                mb["old_log_probs"], log_prob, mb["advantages"], response_mask,
                loss_agg_mode=cfg.loss_agg_mode, config=self.policy_loss_config, **norm,
            )
            loss = pg_loss
            if cfg.entropy_coeff != 0:
                entropy = agg_loss(entropy_from_logits(logits), response_mask, cfg.loss_agg_mode, **norm)
                loss = loss - cfg.entropy_coeff * entropy
                loss_sums["actor/entropy_loss"] += entropy.item()
            if cfg.use_kl_loss:
                kld = kl_penalty(log_prob, mb["ref_log_prob"], cfg.kl_loss_type)
                kl_loss = agg_loss(kld, response_mask, cfg.loss_agg_mode, **norm)
                loss = loss + cfg.kl_loss_coef * kl_loss
                loss_sums["actor/kl_loss"] += kl_loss.item()
            loss.backward()
            loss_sums["actor/pg_loss"] += pg_loss.item()
            for key, value in pg_metrics.items():
                metrics[key].append(value)
        for key, value in loss_sums.items():
            metrics[key].append(value)
        if cfg.use_kl_loss:
            metrics["actor/kl_coef"].append(cfg.kl_loss_coef)
        metrics["actor/grad_norm"].append(self._optimizer_step())

    def _optimizer_step(self) -> float:
        grad_norm = torch.nn.utils.clip_grad_norm_(self.actor_module.parameters(), self.config.grad_clip)
        if not torch.isfinite(grad_norm):
            logger.warning("actor: grad_norm is %s; this update is skipped", grad_norm.item())
            self.actor_optimizer.zero_grad(set_to_none=True)
        else:
            self.actor_optimizer.step()
        return grad_norm.item()
