"""KL penalties between the policy and the reference model, and the KL coefficient controllers.

The per-token estimators live in :data:`KL_PENALTY_REGISTRY` (name -> function), so new forms
are added with :func:`register_kl_penalty` instead of editing an ``if`` chain.
"""

from typing import Callable, Dict, Optional, Tuple

import torch

from hybridrl.registry import Registry

from .errors import AlgorithmConfigError, AlgorithmInputError, UnknownAlgorithmError
from .functional import masked_mean

KL_PENALTIES = Registry(
    "KL penalty",
    "actor_rollout_ref.actor.kl_loss_type / algorithm.kl_penalty",
    error=UnknownAlgorithmError,
    hint="register your own with @register_kl_penalty",
)
KL_PENALTY_REGISTRY: Dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = KL_PENALTIES.table
FULL_KL = "full"  # the exact KL over the vocabulary, computed from logits by the actor


def register_kl_penalty(*names: str) -> Callable:
    """Decorator: register ``fn(logprob, ref_logprob) -> kl`` under one or more names.

    Raises:
        UnknownAlgorithmError (a ValueError): a name is taken by a different function.
        ValueError: a name is ``full`` / ends in ``+``
            (those forms are derived, see :func:`kl_penalty`).
    """

    def decorator(fn: Callable) -> Callable:
        for name in names:
            if name == FULL_KL or name.endswith("+"):
                raise ValueError(f"register_kl_penalty: {name!r} is reserved ('full' and '<name>+' are derived forms)")
            KL_PENALTIES.register(name, fn)
        return fn

    return decorator


@register_kl_penalty("kl", "k1")
def _kl_k1(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    return logprob - ref_logprob


@register_kl_penalty("abs")
def _kl_abs(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    return (logprob - ref_logprob).abs()


@register_kl_penalty("mse", "k2")
def _kl_k2(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logprob - ref_logprob).square()


@register_kl_penalty("low_var_kl", "k3")
def _kl_k3(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    # k3 = r - log r - 1 with r = p_ref / p: unbiased, always >= 0, low variance.
    log_ratio = torch.clamp(ref_logprob - logprob, min=-20.0, max=20.0)
    k3 = torch.exp(log_ratio) - log_ratio - 1
    return torch.clamp(k3, min=-10.0, max=10.0)


def kl_penalty_names() -> list[str]:
    """Every name ``kl_penalty`` accepts: the registered estimators, their straight-through
    ``+`` forms, and ``full`` (exact KL, computed from logits in the actor)."""
    names = set(KL_PENALTY_REGISTRY)
    return sorted(names | {f"{name}+" for name in names} | {FULL_KL})


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from sampled-token log-probs.

    Estimators from J. Schulman, "Approximating KL Divergence" (2020 blog post), with
    ``x = logprob - ref_logprob``:

      * ``kl`` / ``k1``: ``x``
      * ``abs``: ``|x|``
      * ``mse`` / ``k2``: ``0.5 * x**2``
      * ``low_var_kl`` / ``k3``: ``exp(-x) + x - 1`` (log-ratio clamped to [-20, 20], result
        clamped to [-10, 10])
      * ``<name>+`` (e.g. ``k3+``, ``low_var_kl+``): straight-through: the value of ``<name>``
        with the gradient of ``k2``, ``k2 + sg(<name> - k2)``. The gradient of k2 w.r.t.
        ``logprob`` is ``x``, which is the unbiased gradient of KL(pi || pi_ref) under samples
        from pi, whereas k1's and k3's own gradients are biased as loss terms ("On a few pitfalls
        in KL divergence gradient estimation for RL", arXiv 2506.09477).

    ``full`` (the exact KL over the vocabulary) needs logits, not sampled log-probs: the actor
    computes it with :func:`kl_full_from_logits`.

    Args:
        logprob, ref_logprob: ``(bs, response_length)`` log-probs (nats) of the sampled tokens.
        kl_penalty: estimator name (``algorithm.kl_penalty`` or
            ``actor_rollout_ref.actor.kl_loss_type``).

    Returns:
        ``(bs, response_length)`` per-token KL estimate (not masked).

    Raises:
        UnknownAlgorithmError: unknown estimator name.
        AlgorithmInputError: ``full``, which cannot be computed from sampled log-probs.
    """
    if kl_penalty == FULL_KL:
        raise AlgorithmInputError(
            "kl_penalty 'full' is the exact KL over the vocabulary and needs the actor's and the "
            "reference's logits; use kl_full_from_logits(logits, ref_logits) (the actor and the "
            "trainer do this when kl_loss_type / algorithm.kl_penalty is 'full')"
        )
    straight_through = kl_penalty.endswith("+") and kl_penalty[:-1] in KL_PENALTY_REGISTRY
    name = kl_penalty[:-1] if straight_through else kl_penalty
    fn = KL_PENALTIES.get(name)
    value = fn(logprob, ref_logprob)
    if not straight_through:
        return value
    k2 = _kl_k2(logprob, ref_logprob)
    return k2 + (value - k2).detach()


def kl_full_from_logits(logits: torch.Tensor, ref_logits: torch.Tensor, chunk_rows: int = 1024) -> torch.Tensor:
    """Exact per-token KL(pi || pi_ref) over the whole vocabulary.

    ``KL_t = sum_v p_t(v) * (log p_t(v) - log q_t(v))`` with ``p = softmax(logits)``,
    ``q = softmax(ref_logits)``. Exact (no sampling noise) and >= 0; the gradient flows into
    ``logits`` only. The work is done in chunks of ``chunk_rows`` positions so only a chunk's
    ``(rows, vocab)`` log-softmax tensors are alive at once.

    Args:
        logits: ``(bs, response_length, vocab)`` actor logits (after temperature), may carry grad.
        ref_logits: ``(bs, response_length, vocab)`` reference logits (same temperature).
        chunk_rows: positions per chunk.

    Returns:
        ``(bs, response_length)`` KL in nats, fp32.

    Raises:
        AlgorithmInputError: the two logits tensors differ in shape.
    """
    if logits.shape != ref_logits.shape:
        raise AlgorithmInputError(
            f"kl_full_from_logits: logits {tuple(logits.shape)} and ref_logits {tuple(ref_logits.shape)} "
            "must have the same (bs, response_length, vocab) shape"
        )
    flat, ref_flat = logits.reshape(-1, logits.shape[-1]), ref_logits.reshape(-1, logits.shape[-1])
    chunks = []
    for start in range(0, flat.shape[0], chunk_rows):
        logp = torch.log_softmax(flat[start : start + chunk_rows].float(), dim=-1)
        logq = torch.log_softmax(ref_flat[start : start + chunk_rows].float(), dim=-1)
        chunks.append((logp.exp() * (logp - logq)).sum(-1))
    kl = torch.cat(chunks) if chunks else flat.new_zeros(0)
    return kl.reshape(logits.shape[:-1])


class FixedKLController:
    """Constant KL coefficient (``algorithm.kl_ctrl.type=fixed``)."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient stays fixed."""


class AdaptiveKLController:
    """Adaptive KL coefficient steering the observed KL towards ``target_kl``.

    Source: "Fine-Tuning Language Models from Human Preferences", Ziegler et al., arXiv
    1909.08593: ``e = clip(current_kl / target_kl - 1, -0.2, 0.2)``,
    ``value *= 1 + e * n_steps / horizon``.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float):
        if not target_kl or target_kl <= 0:
            raise AlgorithmConfigError(
                f"algorithm.kl_ctrl.target_kl={target_kl} must be > 0 for the adaptive KL controller"
            )
        if not horizon or horizon <= 0:
            raise AlgorithmConfigError(
                f"algorithm.kl_ctrl.horizon={horizon} must be > 0 for the adaptive KL controller"
            )
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Scale the coefficient up when KL is above target, down when below."""
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


def get_kl_controller(type: str, kl_coef: float, target_kl: Optional[float] = None, horizon: Optional[float] = None):
    """Build the KL controller named by ``algorithm.kl_ctrl.type`` ("fixed" | "adaptive").

    Raises:
        AlgorithmConfigError: unknown type, or adaptive without positive target_kl/horizon.
    """
    if type == "fixed":
        return FixedKLController(kl_coef)
    if type == "adaptive":
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise AlgorithmConfigError(f"algorithm.kl_ctrl.type={type!r} is unknown; use 'fixed' or 'adaptive'")


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_probs: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_ctrl,
    kl_penalty: str = "kl",
    full_kl: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, Dict[str, float]]:
    """Subtract the KL penalty from the scores: in-reward KL, as in PPO for RLHF.

    ``token_level_rewards = token_level_scores - beta * kl * response_mask`` with ``beta =
    kl_ctrl.value`` (read before the update). ``current_kl`` is the mean over sequences of
    each sequence's masked-mean KL; the controller is then updated with
    ``kl_ctrl.update(current_kl, n_steps=bs)``.

    Args:
        token_level_scores, old_log_probs, ref_log_prob, response_mask:
            ``(bs, response_length)``.
        kl_ctrl: a :class:`FixedKLController` or :class:`AdaptiveKLController`.
        kl_penalty: estimator name, see :func:`kl_penalty`.
        full_kl: ``(bs, response_length)`` exact per-token KL from :func:`kl_full_from_logits`;
            required when ``kl_penalty == "full"`` (the worker computes it from logits).

    Returns:
        ``(token_level_rewards, metrics)`` with metrics ``actor/reward_kl_penalty``
        (current_kl) and ``actor/reward_kl_penalty_coeff`` (beta), python floats.
    """
    mask = response_mask.to(token_level_scores.dtype)
    if kl_penalty == FULL_KL:
        if full_kl is None:
            raise AlgorithmInputError(
                "apply_kl_penalty: kl_penalty='full' needs full_kl, the per-token exact KL "
                "(bs, response_length) from kl_full_from_logits"
            )
        kld = full_kl.to(token_level_scores.dtype)
    else:
        kld = kl_penalty_fn(old_log_probs, ref_log_prob, kl_penalty).to(token_level_scores.dtype)
    kld = torch.where(mask.bool(), kld * mask, torch.zeros_like(kld))  # padding may hold NaN
    beta = kl_ctrl.value
    token_level_rewards = token_level_scores - beta * kld
    current_kl = masked_mean(kld, mask, axis=-1).mean().item()
    kl_ctrl.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    return token_level_rewards, {
        "actor/reward_kl_penalty": current_kl,
        "actor/reward_kl_penalty_coeff": float(beta),
    }


# The argument ``kl_penalty`` of apply_kl_penalty shadows the function inside it.
kl_penalty_fn = kl_penalty
