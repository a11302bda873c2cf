"""Every registered policy loss: micro batches normalised by the mini-batch counts (as the actor
passes them) add up to the full-batch loss and gradients; config validation and the registry."""

import pytest
import torch
import torch.nn.functional as F

from hybridrl.algorithms import (
    POLICY_LOSS_KEYS,
    POLICY_LOSS_REGISTRY,
    AlgorithmConfigError,
    PolicyLossConfig,
    PolicyLossParams,
    UnknownAlgorithmError,
    get_policy_loss_fn,
)

# Losses whose value depends on each row alone (no statistics over the batch).
ROW_WISE = ("vanilla", "gspo", "gpg", "geo_mean", "cispo", "sapo", "dppo_tv", "dppo_kl", "dro")


def _inputs(rows, cols, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=gen)
    old_noise = 0.3 * torch.randn(rows, cols, generator=gen)
    adv = torch.randn(rows, 1, generator=gen).expand(rows, cols).contiguous()  # GRPO-like per row
    adv = adv + 0.2 * torch.randn(rows, cols, generator=gen)
    mask = (torch.rand(rows, cols, generator=gen) > 0.3).float()
    mask[:, 0] = 1
    return x, old_noise, adv, mask


def _accumulate(name, cfg, x, old_noise, adv, mask, micro_slices):
    """(full loss, full grad, summed micro losses, summed micro grads) w.r.t. a shared weight."""
    w = torch.linspace(0.5, 1.5, x.shape[1]).requires_grad_(True)
    fn = get_policy_loss_fn(name)

    def run(rows, **norm):
        log_prob = -F.softplus(x[rows] * w)  # negative, differentiable in w
        old = log_prob.detach() + old_noise[rows]
        loss, metrics = fn(old, log_prob, adv[rows], mask[rows], "token-mean", cfg, **norm)
        return loss, torch.autograd.grad(loss, w)[0], metrics

    full, g_full, metrics = run(slice(None))
    norm = {"batch_num_tokens": mask.sum(), "global_batch_size": x.shape[0]}
    micro = [run(rows, **norm) for rows in micro_slices]
    return full, g_full, sum(m[0].item() for m in micro), sum(m[1] for m in micro), metrics


@pytest.mark.parametrize("name", ROW_WISE)
def test_row_wise_losses_accumulate_over_uneven_micro_batches(name):
    cfg = PolicyLossParams(clip_ratio=0.2, clip_ratio_c=1.5, dro_beta=0.3)  # a low dual clip: vanilla hits it too
    x, old_noise, adv, mask = _inputs(7, 6, seed=1)
    full, g_full, total, g_acc, metrics = _accumulate(
        name, cfg, x, old_noise, adv, mask, (slice(0, 1), slice(1, 5), slice(5, 7))
    )
    assert total == pytest.approx(full.item(), rel=1e-5)
    assert torch.allclose(g_acc, g_full, rtol=1e-5, atol=1e-6)
    assert g_full.abs().sum() > 0
    assert set(metrics) >= {"actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"}
    assert all(torch.is_tensor(v) and v.dim() == 0 and not v.requires_grad for v in metrics.values())


@pytest.mark.parametrize("name", ("clip_cov", "kl_cov"))
def test_covariance_losses_accumulate_when_micro_batches_select_alike(name):
    # Selection statistics are per micro batch. Two identical halves have the full batch's
    # means, so the same tokens are picked: Clip-Cov takes all its candidates
    # (clip_cov_ratio=1), KL-Cov's top-k of the whole batch is twice that of a half.
    x, old_noise, adv, mask = _inputs(3, 6, seed=2)
    x, old_noise, adv, mask = (torch.cat([t, t]) for t in (x, old_noise, adv, mask))
    n_half = mask[:3].sum().item()
    cfg = PolicyLossParams(
        clip_cov_ratio=1.0, clip_cov_lb=0.0, clip_cov_ub=100.0, kl_cov_ratio=2.25 / n_half, ppo_kl_coef=0.7
    )
    full, g_full, total, g_acc, metrics = _accumulate(name, cfg, x, old_noise, adv, mask, (slice(0, 3), slice(3, 6)))
    assert metrics[f"actor/{name}_frac"] > 0  # the selection is not empty
    assert total == pytest.approx(full.item(), rel=1e-5)
    assert torch.allclose(g_acc, g_full, rtol=1e-5, atol=1e-6)


def test_unknown_loss_mode_lists_every_registered_name():
    assert set(ROW_WISE + ("clip_cov", "kl_cov")) <= set(POLICY_LOSS_REGISTRY)
    with pytest.raises(UnknownAlgorithmError, match="actor_rollout_ref.actor.policy_loss.loss_mode") as e:
        get_policy_loss_fn("grpo")
    for name in POLICY_LOSS_REGISTRY:
        assert name in str(e.value)


@pytest.mark.parametrize(
    "kwargs, key",
    [
        (dict(clip_cov_ratio=0.0), "actor_rollout_ref.actor.policy_loss.clip_cov_ratio"),
        (dict(kl_cov_ratio=1.5), "actor_rollout_ref.actor.policy_loss.kl_cov_ratio"),
        (dict(clip_cov_lb=5.0, clip_cov_ub=1.0), "actor_rollout_ref.actor.policy_loss.clip_cov_lb"),
        (dict(ppo_kl_coef=-0.1), "actor_rollout_ref.actor.policy_loss.ppo_kl_coef"),
        (dict(clip_ratio_high="0.2"), "actor_rollout_ref.actor.clip_ratio_high='0.2' is not a number"),
    ],
)
def test_policy_loss_config_errors_name_the_full_key(kwargs, key):
    with pytest.raises(AlgorithmConfigError, match=key.replace(".", r"\.")):
        PolicyLossParams(**kwargs)


def test_unknown_loss_agg_mode_is_refused_by_fixed_aggregation_losses():
    ones = torch.ones(1, 2)
    for name in ("gspo", "geo_mean"):
        with pytest.raises(UnknownAlgorithmError, match="actor_rollout_ref.actor.loss_agg_mode"):
            get_policy_loss_fn(name)(ones, ones, ones, ones, "token-total")


def test_actor_builds_the_policy_loss_config_from_its_section():
    from hybridrl.workers.actor import PPOActor
    from tests.tiny_models import ppo_section

    module = torch.nn.Linear(2, 2)
    section = {
        "clip_ratio": 0.2,
        "clip_ratio_low": 0.1,
        "clip_ratio_high": None,
        "policy_loss": {"loss_mode": "kl_cov", "kl_cov_ratio": 0.01, "ppo_kl_coef": 1.0, "dro_beta": None},
    }
    actor = PPOActor(
        ppo_section("actor_rollout_ref.actor", section), module, torch.optim.SGD(module.parameters(), lr=0.1)
    )
    cfg = actor.policy_loss_config
    assert actor.policy_loss_fn is get_policy_loss_fn("kl_cov")
    assert (cfg.clip_ratio_low, cfg.clip_ratio_high, cfg.kl_cov_ratio, cfg.ppo_kl_coef) == (0.1, 0.2, 0.01, 1.0)
    assert cfg.clip_cov_lb == PolicyLossConfig().clip_cov_lb  # the packaged default is the section's
    assert cfg.dro_beta == PolicyLossConfig().dro_beta  # null keeps the default
    assert cfg.loss_mode == "kl_cov" and isinstance(cfg, PolicyLossConfig)
    assert set(POLICY_LOSS_KEYS) <= set(vars(cfg))
    section["policy_loss"]["clip_cov_ratio"] = 2.0
    with pytest.raises(AlgorithmConfigError, match="policy_loss.clip_cov_ratio=2.0"):
        PPOActor(ppo_section("actor_rollout_ref.actor", section), module, torch.optim.SGD(module.parameters(), lr=0.1))
