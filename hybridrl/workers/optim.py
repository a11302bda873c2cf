"""Optimizer and learning-rate schedule from an ``optim`` config section (verl's keys)."""

from __future__ import annotations

import logging
import math

import torch

from hybridrl.errors import ConfigError
from hybridrl.workers.sharding import clip_grad_norm

logger = logging.getLogger(__name__)


def build_optimizer(module: torch.nn.Module, optim_cfg) -> torch.optim.Optimizer:
    """AdamW with ``lr``, ``betas``, ``weight_decay`` from ``optim_cfg`` (an ``optim`` section)."""
    betas = tuple(optim_cfg.betas)
    return torch.optim.AdamW(
        [p for p in module.parameters() if p.requires_grad],
        lr=optim_cfg.lr,
        betas=betas,
        weight_decay=optim_cfg.weight_decay,
    )


def build_lr_scheduler(optimizer: torch.optim.Optimizer, optim_cfg, total_training_steps: int):
    """verl's schedule: linear warmup, then constant or cosine down to ``min_lr_ratio``.

    ``optim_cfg`` is an ``optim`` section (``hybridrl.workers.config.OptimConfig``). Warmup steps:
    ``lr_warmup_steps`` if > 0, else ``lr_warmup_steps_ratio x total steps``.

    Raises:
        ConfigError: an unknown ``warmup_style``.
    """
    from transformers import get_constant_schedule_with_warmup, get_cosine_with_min_lr_schedule_with_warmup

    warmup = optim_cfg.lr_warmup_steps
    if warmup < 0:
        warmup = int(optim_cfg.lr_warmup_steps_ratio * total_training_steps)
    style = optim_cfg.warmup_style
    if style == "constant":
        return get_constant_schedule_with_warmup(optimizer, num_warmup_steps=warmup)
    if style == "cosine":
        return get_cosine_with_min_lr_schedule_with_warmup(
            optimizer,
            num_warmup_steps=warmup,
            num_training_steps=total_training_steps,
            num_cycles=optim_cfg.num_cycles,
            min_lr_rate=optim_cfg.min_lr_ratio or 0.0,  # null (the critic's default): 0
        )

    raise ConfigError(f"optim.warmup_style={style!r} is not one of constant, cosine")


def optimizer_step(module: torch.nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float, role: str) -> float:
    """Clips the gradient to ``max_grad_norm`` and steps; a non-finite gradient norm skips the
    update (with a warning naming ``role``) instead of writing NaN into the weights. One
    implementation for every trained model (actor, critic, SFT, reward model), plain or FSDP2.

    Returns:
        the gradient norm before clipping (the same on every rank).
    """
    grad_norm = clip_grad_norm(module, max_grad_norm)
    if math.isfinite(grad_norm):
        optimizer.step()
    else:
        logger.warning("%s: grad_norm is %s; this update is skipped", role, grad_norm)
        optimizer.zero_grad(set_to_none=True)
    return grad_norm
