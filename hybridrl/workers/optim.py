"""Optimizer and learning-rate schedule from an ``optim`` config section (verl's keys)."""

from __future__ import annotations

import functools
import logging
import math

import torch

from hybridrl.errors import ConfigError
from hybridrl.workers.config.fsdp import floor_ratio, schedule_name
from hybridrl.workers.sharding import clip_grad_norm

logger = logging.getLogger(__name__)


FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)  # torch's fused AdamW kernels


def fused_adamw_allowed(params) -> bool:
    """Whether torch's fused AdamW (one kernel for the whole step) takes ``params``: every one a
    floating-point tensor on a CUDA device. Parameters that FSDP2's CPU offload (``param_offload``)
    keeps on the CPU, and every CPU run, keep the default (foreach) implementation."""
    params = list(params)
    return bool(params) and all(p.device.type == "cuda" and p.dtype in FUSED_DTYPES for p in params)


def build_optimizer(module: torch.nn.Module, optim_cfg) -> torch.optim.Optimizer:
    """AdamW with ``lr``, ``betas``, ``weight_decay`` from ``optim_cfg`` (an ``optim`` section);
    fused on CUDA (:func:`fused_adamw_allowed`), as torchtitan's FSDP2 training does."""
    betas = tuple(optim_cfg.betas)
    params = [p for p in module.parameters() if p.requires_grad]
    fused = {"fused": True} if fused_adamw_allowed(params) else {}
    return torch.optim.AdamW(params, lr=optim_cfg.lr, betas=betas, weight_decay=optim_cfg.weight_decay, **fused)


def build_lr_scheduler(optimizer: torch.optim.Optimizer, optim_cfg, total_training_steps: int):
    """verl's schedule: linear warmup, then constant or cosine down to the floor.

    ``optim_cfg`` is an ``optim`` section (``hybridrl.workers.config.OptimConfig``). The schedule is
    ``warmup_style`` when set (verl's older key), else ``lr_scheduler_type``. Warmup steps:
    ``lr_warmup_steps`` if > 0, else ``lr_warmup_steps_ratio x total steps``. The cosine floor is
    ``min_lr / lr`` when ``min_lr`` is set, else ``min_lr_ratio``; the cosine reaches it at the run's
    last step, or at step ``lr_decay_steps`` (warmup included; Megatron's key) and stays there.

    Raises:
        ConfigError: an unknown schedule.
    """
    warmup = optim_cfg.lr_warmup_steps
    if warmup < 0:
        warmup = int(optim_cfg.lr_warmup_steps_ratio * total_training_steps)
    style = schedule_name(optim_cfg)
    if style not in ("constant", "cosine"):
        raise ConfigError(f"optim.lr_scheduler_type={style!r} is not one of constant, cosine")
    decay_steps = optim_cfg.lr_decay_steps
    schedule = lr_schedule(
        optimizer,
        style,
        warmup,
        total_training_steps if decay_steps is None else int(decay_steps),
        min_lr_ratio=floor_ratio(optim_cfg),
        num_cycles=optim_cfg.num_cycles,
        zero_indexed_step=optim_cfg.zero_indexed_step,
    )
    if decay_steps is not None:  # after lr_decay_steps the factor stays where the decay ended
        (factor,) = schedule.lr_lambdas
        schedule.lr_lambdas = [functools.partial(_held_after, factor=factor, last=int(decay_steps))]
    return schedule


def _held_after(step: int, factor, last: int) -> float:
    return factor(min(step, last))


LR_SCHEDULES = ("constant", "cosine", "wsd")
WSD_STABLE_RATIO = 0.9  # verl's get_wsd_schedule_with_warmup default, which its SFT trainer uses


def lr_factor(
    step: int,
    style: str,
    num_warmup_steps: int,
    num_training_steps: int,
    min_lr_ratio: float = 0.0,
    num_cycles: float = 0.5,
    zero_indexed_step: bool = True,
) -> float:
    """The learning rate of ``step`` as a share of ``optim.lr``: verl's three schedules
    (``verl.utils.torch_functional``). All warm up linearly from 0 over ``num_warmup_steps``, then

    * ``constant``: 1;
    * ``cosine``: ``min + (1 - min) * (1 + cos(2 pi num_cycles p)) / 2`` over the progress ``p`` of the
      steps after the warmup (floored at ``min_lr_ratio``);
    * ``wsd`` (warmup-stable-decay): 1 for 90% of the steps after the warmup, then the cosine above
      over the rest, then ``min_lr_ratio``.

    ``zero_indexed_step=False`` counts steps from 1 (verl's ``optim.zero_indexed_step``; cosine only,
    as verl).
    """
    if style == "cosine" and not zero_indexed_step:
        step += 1
    if step < num_warmup_steps:
        return step / max(1, num_warmup_steps)
    if style == "constant":
        return 1.0
    if style == "wsd":
        remaining = max(0, num_training_steps - num_warmup_steps)
        stable = int(remaining * WSD_STABLE_RATIO)
        if step < num_warmup_steps + stable:
            return 1.0
        if step >= num_training_steps:
            return min_lr_ratio
        progress = (step - num_warmup_steps - stable) / max(1, remaining - stable)
        return (1.0 - min_lr_ratio) * max(
            0.0, 0.5 * (1.0 + math.cos(math.pi * num_cycles * 2.0 * progress))
        ) + min_lr_ratio
    progress = (step - num_warmup_steps) / max(1, num_training_steps - num_warmup_steps)
    return max(
        min_lr_ratio,
        (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * num_cycles * 2.0 * progress)) + min_lr_ratio,
    )


def lr_schedule(
    optimizer: torch.optim.Optimizer,
    style: str,
    num_warmup_steps: int,
    num_training_steps: int,
    min_lr_ratio: float = 0.0,
    num_cycles: float = 0.5,
    zero_indexed_step: bool = True,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` stepping through :func:`lr_factor` (``style``: one of :data:`LR_SCHEDULES`).

    Raises:
        ConfigError: an unknown ``style`` or a ``min_lr_ratio`` outside [0, 1].
    """
    if style not in LR_SCHEDULES:
        raise ConfigError(f"lr schedule {style!r} is not one of {', '.join(LR_SCHEDULES)}")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ConfigError(f"optim.min_lr_ratio={min_lr_ratio!r} must be a number in [0, 1]")
    factor = functools.partial(
        lr_factor,
        style=style,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        min_lr_ratio=min_lr_ratio,
        num_cycles=num_cycles,
        zero_indexed_step=zero_indexed_step,
    )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


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
