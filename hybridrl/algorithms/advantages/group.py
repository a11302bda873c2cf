"""Group-based outcome advantage estimators: GRPO, Pass@k, RLOO, REINFORCE++-baseline, OPO, GPG.

Each prompt is sampled ``n`` times (``actor_rollout_ref.rollout.n``); the responses sharing a
prompt uid (``index``, ``(bs,)``) form a *group*, and each response's scalar score
``score_i = sum_t token_level_rewards[i, t]`` is compared with its group. The advantage is one
number per response, broadcast over its tokens and multiplied by ``response_mask``.

All group statistics come from :func:`compute_group_stats` (vectorised scatter sums, no Python
loop over groups). Registered on import of :mod:`hybridrl.algorithms.advantages`.
"""

from typing import NamedTuple, Sequence, Tuple

import numpy as np
import torch

from ..errors import AlgorithmConfigError, AlgorithmInputError
from ..functional import masked_whiten
from .base import group_ids, outcome_scores, register_adv_est


class GroupStats(NamedTuple):
    """Per-response statistics of the response's group; every field but ``num_groups`` is ``(bs,)``."""

    group: torch.Tensor  # long group number of each response, 0..num_groups-1 in first-seen order
    num_groups: int
    count: torch.Tensor  # size of the group
    mean: torch.Tensor  # mean score of the group
    std: torch.Tensor  # unbiased (n - 1) std of the group's scores; 0 for a group of one


def _group_reduce(values: torch.Tensor, group: torch.Tensor, num_groups: int, reduce: str = "sum") -> torch.Tensor:
    """``(num_groups,)`` reduction (``sum``/``amax``/``amin``) of ``values (bs,)`` per group."""
    return values.new_zeros(num_groups).scatter_reduce(0, group, values, reduce=reduce, include_self=False)


def compute_group_stats(scores: torch.Tensor, index: Sequence) -> GroupStats:
    """Size, mean and unbiased std of each response's group, broadcast back to the responses.

    Args:
        scores: ``(bs,)`` float scores.
        index: ``(bs,)`` group ids (the prompt uids; any hashable objects).

    Returns:
        :class:`GroupStats` with ``(bs,)`` fields.

    Raises:
        AlgorithmInputError: ``index`` is None or does not have ``bs`` entries.
    """
    group = group_ids(index, scores.shape[0]).to(scores.device)
    num_groups = int(group.max().item()) + 1 if group.numel() else 0
    count = _group_reduce(torch.ones_like(scores), group, num_groups)
    mean = _group_reduce(scores, group, num_groups) / count
    sq_dev = _group_reduce((scores - mean[group]) ** 2, group, num_groups)
    std = torch.sqrt(sq_dev / (count - 1).clamp_min(1))
    return GroupStats(group, num_groups, count[group], mean[group], std[group])


def _broadcast(adv: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    return adv.unsqueeze(-1) * response_mask.to(adv.dtype)


def _baseline_or_zero(stats: GroupStats, baseline: torch.Tensor) -> torch.Tensor:
    """A group of one has no other response to compare with: baseline 0 (advantage = score)."""
    return torch.where(stats.count > 1, baseline, torch.zeros_like(baseline))


@register_adv_est("grpo", needs_group=True)
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    **kwargs,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage: the response score normalised within its prompt's group.

    Source: "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language
    Models", Shao et al., arXiv 2402.03300. ``norm_adv_by_std_in_grpo=False`` is Dr. GRPO
    ("Understanding R1-Zero-Like Training: A Critical Perspective", arXiv 2503.20783).

    ``A_i = (score_i - mean_g) / (std_g + epsilon)`` with the unbiased (``n - 1``) std, or
    ``A_i = score_i - mean_g`` without std normalisation. Group of one: mean 0 and std 1 are
    used, so its advantage is its score (``/ (1 + epsilon)``).

    Args:
        token_level_rewards: ``(bs, response_length)``.
        response_mask: ``(bs, response_length)``.
        index: ``(bs,)`` array of group ids (the prompt uid strings).
        epsilon: added to the std to avoid division by zero.
        norm_adv_by_std_in_grpo: divide by the group std (GRPO) or not (Dr. GRPO).

    Returns:
        ``(advantages, returns)``, both ``(bs, response_length)``; ``returns == advantages``.

    Raises:
        AlgorithmInputError: ``index`` is missing or has the wrong length, shapes differ, or
            the rewards hold NaN/inf.
    """
    scores = outcome_scores(token_level_rewards, response_mask)
    with torch.no_grad():
        stats = compute_group_stats(scores, index)
        adv = scores - _baseline_or_zero(stats, stats.mean)
        if norm_adv_by_std_in_grpo:
            adv = adv / (torch.where(stats.count > 1, stats.std, torch.ones_like(stats.std)) + epsilon)
        advantages = _broadcast(adv, response_mask)
    return advantages, advantages.clone()


@register_adv_est("grpo_passk", needs_group=True)
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    **kwargs,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Pass@k advantage: only the best response of each group learns, from its margin.

    Source: the leave-one-out max-of-k policy gradient of "Optimizing Language Models for
    Inference Time Objectives using Reinforcement Learning", Tang et al., arXiv 2503.19595
    (the paper verl cites); see also "Pass@k Training for Adaptively Balancing Exploration and
    Exploitation of Large Reasoning Models", Chen et al., arXiv 2508.10751.

    In each group the best response gets ``A = r_max - r_second_max`` (divided by
    ``std_g + epsilon``, the unbiased group std, when ``norm_adv_by_std_in_grpo``); all other
    responses get 0. With a tie for the best, ``r_max == r_second_max`` and the whole group
    gets 0. ``norm_adv_by_std_in_grpo`` is ``algorithm.norm_adv_by_std_in_grpo`` (the driver
    passes it; verl reads it from its ``config`` argument, swallowed here by ``**kwargs``).

    Group of one: there is no second response, so the margin is undefined; as in verl this
    raises (``rollout.n >= 2`` avoids it).

    Args:
        token_level_rewards, response_mask: ``(bs, response_length)``.
        index: ``(bs,)`` prompt uids.
        epsilon: added to the std.
        norm_adv_by_std_in_grpo: divide the margin by the group std.

    Returns:
        ``(advantages, returns)``, both ``(bs, response_length)``; ``returns == advantages``.

    Raises:
        AlgorithmInputError: a group has a single response, ``index`` is missing or has the
            wrong length, shapes differ, or the rewards hold NaN/inf.
    """
    scores = outcome_scores(token_level_rewards, response_mask)
    with torch.no_grad():
        stats = compute_group_stats(scores, index)
        single = (stats.count < 2).nonzero()
        if single.numel():
            first_uid = np.asarray(index, dtype=object).reshape(-1)[int(single[0])]
            raise AlgorithmInputError(
                f"grpo_passk needs at least 2 responses per prompt, but {single.numel()} prompt(s) "
                f"have one (e.g. uid {first_uid!r}); set actor_rollout_ref.rollout.n >= 2"
            )
        g, n_g = stats.group, stats.num_groups
        pos = torch.arange(scores.shape[0], device=scores.device)
        r_max = _group_reduce(scores, g, n_g, "amax")
        # The first response reaching the group max is "the best"; ties give a zero margin anyway.
        best_pos = _group_reduce(torch.where(scores == r_max[g], pos, pos.numel()), g, n_g, "amin")
        best = pos == best_pos[g]
        others = torch.where(best, torch.full_like(scores, -torch.inf), scores)
        r_second = _group_reduce(others, g, n_g, "amax")
        adv = torch.where(best, scores - r_second[g], torch.zeros_like(scores))
        if norm_adv_by_std_in_grpo:
            adv = adv / (stats.std + epsilon)
        advantages = _broadcast(adv, response_mask)
    return advantages, advantages.clone()


@register_adv_est("rloo", needs_group=True)
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence,
    epsilon: float = 1e-6,
    **kwargs,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """RLOO advantage: the score minus the mean score of the *other* responses to the prompt.

    Sources: "Buy 4 REINFORCE Samples, Get a Baseline for Free!", Kool et al., ICLR 2019 DeepRL
    workshop; "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human
    Feedback in LLMs", Ahmadian et al., arXiv 2402.14740.

    ``A_i = r_i - mean_{j != i} r_j = n / (n - 1) * (r_i - mean_g)`` for a group of ``n``
    responses. Group of one: no leave-one-out baseline exists, so ``A_i = r_i`` (as in verl).

    Args:
        token_level_rewards, response_mask: ``(bs, response_length)``.
        index: ``(bs,)`` prompt uids.
        epsilon: unused (kept for verl's signature).

    Returns:
        ``(advantages, returns)``, both ``(bs, response_length)``; ``returns == advantages``.

    Raises:
        AlgorithmInputError: ``index`` is missing or has the wrong length, shapes differ, or
            the rewards hold NaN/inf.
    """
    scores = outcome_scores(token_level_rewards, response_mask)
    with torch.no_grad():
        stats = compute_group_stats(scores, index)
        n = stats.count
        scale = torch.where(n > 1, n / (n - 1).clamp_min(1), torch.ones_like(n))
        adv = scale * (scores - _baseline_or_zero(stats, stats.mean))
        advantages = _broadcast(adv, response_mask)
    return advantages, advantages.clone()


@register_adv_est("reinforce_plus_plus_baseline", needs_group=True)
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence,
    epsilon: float = 1e-6,
    **kwargs,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline advantage: group-mean-centred score, whitened over the batch.

    Source: "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models",
    Hu, arXiv 2501.03262 (the variant with a group baseline).

    ``a_i = score_i - mean_g`` is broadcast over the valid tokens of response ``i``; then the
    token values are whitened (zero mean, unit unbiased variance) over all valid tokens of the
    batch, so longer responses weigh more in the batch statistics (as in verl). Group of one:
    baseline 0, so ``a_i = score_i`` before the whitening.

    Args:
        token_level_rewards, response_mask: ``(bs, response_length)``.
        index: ``(bs,)`` prompt uids.
        epsilon: unused (kept for verl's signature).

    Returns:
        ``(advantages, returns)``, both ``(bs, response_length)``; ``returns == advantages``.

    Raises:
        AlgorithmInputError: ``index`` is missing or has the wrong length, shapes differ, the
            rewards hold NaN/inf, or the mask has no valid token.
    """
    scores = outcome_scores(token_level_rewards, response_mask)
    with torch.no_grad():
        stats = compute_group_stats(scores, index)
        mask = response_mask.to(scores.dtype)
        centred = _broadcast(scores - _baseline_or_zero(stats, stats.mean), mask)
        advantages = masked_whiten(centred, mask) * mask
    return advantages, advantages.clone()


@register_adv_est("opo", needs_group=True)
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence,
    epsilon: float = 1e-6,
    **kwargs,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """OPO advantage: the score minus a length-weighted group baseline.

    Source: "On-Policy RL with Optimal Reward Baseline", Hao et al., arXiv 2505.23585.

    With ``L_j`` the number of valid tokens of response ``j`` (``response_mask`` sum),
    ``b_g = sum_j L_j r_j / sum_j L_j`` over the group and ``A_i = r_i - b_g``: the baseline
    that minimises the gradient variance when the gradient norm grows with the length.
    Group of one: baseline 0, so ``A_i = r_i`` (as in verl). A group whose responses are all
    empty (``sum L = 0``) also gets baseline 0; its advantages are masked out anyway.

    Args:
        token_level_rewards, response_mask: ``(bs, response_length)``.
        index: ``(bs,)`` prompt uids.
        epsilon: unused (kept for verl's signature).

    Returns:
        ``(advantages, returns)``, both ``(bs, response_length)``; ``returns == advantages``.

    Raises:
        AlgorithmInputError: ``index`` is missing or has the wrong length, shapes differ, or
            the rewards hold NaN/inf.
    """
    scores = outcome_scores(token_level_rewards, response_mask)
    with torch.no_grad():
        stats = compute_group_stats(scores, index)
        lengths = response_mask.to(scores.dtype).sum(dim=-1)
        weighted = _group_reduce(lengths * scores, stats.group, stats.num_groups)[stats.group]
        total = _group_reduce(lengths, stats.group, stats.num_groups)[stats.group]
        baseline = torch.where(total > 0, weighted / total.clamp_min(1), torch.zeros_like(total))
        advantages = _broadcast(scores - _baseline_or_zero(stats, baseline), response_mask)
    return advantages, advantages.clone()


@register_adv_est("gpg", needs_group=True)
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
    **kwargs,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """GPG advantage: group-mean-centred score, rescaled by the share of rewarded responses.

    Source: "GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning",
    Chu et al., arXiv 2504.02546.

    ``A_i = alpha * (score_i - mean_g) / f_norm`` with, as in verl,
    ``alpha = bs / max(1, #{i : score_i != 0})`` (batch size over the number of responses with
    a non-zero score: the paper's correction for the gradient diluted by uninformative samples)
    and ``f_norm = 1``. The group std is *not* used and ``norm_adv_by_std_in_grpo`` is ignored,
    as in verl. Group of one: baseline 0, so ``A_i = alpha * score_i / f_norm``.

    Args:
        token_level_rewards, response_mask: ``(bs, response_length)``.
        index: ``(bs,)`` prompt uids.
        epsilon: unused (kept for verl's signature).
        f_norm: positive normaliser of the centred score (1.0 in GPG and verl).

    Returns:
        ``(advantages, returns)``, both ``(bs, response_length)``; ``returns == advantages``.

    Raises:
        AlgorithmConfigError: ``f_norm`` is not positive.
        AlgorithmInputError: ``index`` is missing or has the wrong length, shapes differ, or
            the rewards hold NaN/inf.
    """
    if not f_norm > 0:
        raise AlgorithmConfigError(f"gpg: f_norm={f_norm!r} must be a positive number (1.0 is GPG's value)")
    scores = outcome_scores(token_level_rewards, response_mask)
    with torch.no_grad():
        stats = compute_group_stats(scores, index)
        alpha = scores.shape[0] / torch.count_nonzero(scores).clamp_min(1).to(scores.dtype)
        adv = alpha * (scores - _baseline_or_zero(stats, stats.mean)) / f_norm
        advantages = _broadcast(adv, response_mask)
    return advantages, advantages.clone()


# verl keeps a loop and a vectorised version of GRPO and RLOO; hybridrl's are vectorised
# already, so verl's ``*_vectorized`` names select the same functions.
register_adv_est("grpo_vectorized", needs_group=True)(compute_grpo_outcome_advantage)
register_adv_est("rloo_vectorized", needs_group=True)(compute_rloo_outcome_advantage)
compute_grpo_vectorized_outcome_advantage = compute_grpo_outcome_advantage
compute_rloo_vectorized_outcome_advantage = compute_rloo_outcome_advantage
