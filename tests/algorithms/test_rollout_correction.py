"""Rollout correction (importance weights, rejection, bypass mode) against the formulas on small
hand-made batches; padding ignored; the weights reach every loss and keep micro-batch
accumulation equal to one pass; bad options list the valid names."""

import math

import pytest
import torch
import torch.nn.functional as F

from hybridrl.algorithms import POLICY_LOSS_REGISTRY, PolicyLossParams, get_policy_loss_fn
from hybridrl.algorithms.errors import AlgorithmConfigError, UnknownAlgorithmError
from hybridrl.algorithms.rollout_corr import (
    ROLLOUT_RS_OPTIONS,
    RolloutCorrectionConfig,
    compute_rollout_correction_and_rejection_mask,
    compute_rollout_correction_weights,
    compute_rollout_rejection_mask,
    rejection_settings,
)

MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
# log(pi_train / pi_rollout) per token; the values under padding must never matter
LOG_RATIO = torch.tensor([[0.1, -0.2, 0.9, 7.0], [0.0, 0.05, -0.05, 0.0], [-1.5, 0.3, -9.0, 9.0]])


def test_token_weights_are_truncated_ratios_zero_under_padding():
    w, m = compute_rollout_correction_weights(LOG_RATIO, MASK, "token", rollout_is_threshold=2.0)
    expected = torch.exp(LOG_RATIO).clamp(max=2.0) * MASK
    assert torch.allclose(w, expected)
    assert not w.requires_grad
    valid = torch.exp(LOG_RATIO[MASK.bool()])
    assert m["rollout_is_max"] == pytest.approx(math.exp(0.9))  # untruncated, padding left out
    assert m["rollout_is_min"] == pytest.approx(math.exp(-1.5))
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(float((valid > 2).double().mean()))
    assert m["rollout_is_ratio_fraction_low"] == pytest.approx(float((valid < 0.5).double().mean()))
    truncated = valid.clamp(max=2.0)
    assert m["rollout_is_mean"] == pytest.approx(float(truncated.mean()))
    ess = 1.0 / float(((truncated / truncated.mean()) ** 2).mean())
    assert m["rollout_is_eff_sample_size"] == pytest.approx(ess)


def test_sequence_weights_are_the_truncated_product_of_the_row():
    w, m = compute_rollout_correction_weights(LOG_RATIO, MASK, "sequence", rollout_is_threshold=1.5)
    row_log = (LOG_RATIO * MASK).sum(-1)  # 0.8, 0.0, -1.2
    expected = torch.exp(row_log).clamp(max=1.5).unsqueeze(-1) * MASK
    assert torch.allclose(w, expected)
    assert m["rollout_is_max"] == pytest.approx(math.exp(0.8)) and m["rollout_is_min"] == pytest.approx(math.exp(-1.2))
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(1 / 3)  # e^0.8 > 1.5
    assert m["rollout_is_ratio_fraction_low"] == pytest.approx(1 / 3)  # e^-1.2 < 1 / 1.5


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_batch_normalized_weights_average_one(level):
    w, m = compute_rollout_correction_weights(LOG_RATIO, MASK, level, 2.0, rollout_is_batch_normalize=True)
    if level == "token":
        assert float(w[MASK.bool()].mean()) == pytest.approx(1.0)
    else:
        assert float(w.amax(-1).mean()) == pytest.approx(1.0)
    assert m["rollout_is_batch_norm_factor"] > 0


def test_token_k1_keeps_ratios_inside_the_bounds():
    # k1 = -log_ratio must lie in [log lo, log hi]: with "0.5_1.2", log_ratio in [-log 1.2, log 2]
    mask, m = compute_rollout_rejection_mask(LOG_RATIO, MASK, "token_k1", "0.5_1.2")
    keep = (LOG_RATIO >= -math.log(1.2)) & (LOG_RATIO <= math.log(2.0))
    assert torch.equal(mask, MASK * keep)
    assert m["rollout_rs_token_k1_masked_fraction"] == pytest.approx(float((~keep[MASK.bool()]).double().mean()))
    assert m["rollout_rs_seq_masked_fraction"] == pytest.approx(2 / 3)  # rows 0 and 2 lose a token


def test_one_k1_threshold_means_its_inverse_below():
    a, _ = compute_rollout_rejection_mask(LOG_RATIO, MASK, "token_k1", 2.0)
    b, _ = compute_rollout_rejection_mask(LOG_RATIO, MASK, "token_k1", "0.5_2.0")
    assert torch.equal(a, b)


def test_verl_07_spelling_is_the_k1_options_with_a_lower_bound():
    """verl 0.7: rollout_rs token | sequence | geometric with rollout_rs_threshold (upper) and
    rollout_rs_threshold_lower; the masks are those of token_k1 / seq_sum_k1 / seq_mean_k1."""
    for old, new in (("token", "token_k1"), ("sequence", "seq_sum_k1"), ("geometric", "seq_mean_k1")):
        corr = RolloutCorrectionConfig(rollout_rs=old, rollout_rs_threshold=1.2, rollout_rs_threshold_lower=0.5)
        assert rejection_settings(corr) == (new, "0.5_1.2")
        a, _ = compute_rollout_rejection_mask(LOG_RATIO, MASK, *rejection_settings(corr))
        b, _ = compute_rollout_rejection_mask(LOG_RATIO, MASK, new, "0.5_1.2")
        assert torch.equal(a, b)
    # without a lower bound the upper one's inverse, as in verl 0.7
    assert rejection_settings(RolloutCorrectionConfig(rollout_rs="token", rollout_rs_threshold=2.0)) == (
        "token_k1",
        2.0,
    )
    with pytest.raises(AlgorithmConfigError, match="the lower bound exceeds the upper one"):
        RolloutCorrectionConfig(rollout_rs="token", rollout_rs_threshold=1.2, rollout_rs_threshold_lower=1.5)


def test_sequence_options_reject_whole_rows():
    k2_max = [0.5 * 0.9**2, 0.5 * 0.05**2, 0.5 * 1.5**2]  # worst token per row
    mask, m = compute_rollout_rejection_mask(LOG_RATIO, MASK, "seq_max_k2", 1.0)
    assert torch.equal(mask, MASK * torch.tensor([[1], [1], [0]]))
    assert m["rollout_rs_seq_max_k2_max"] == pytest.approx(max(k2_max))
    mean_k1 = -(LOG_RATIO * MASK).sum(-1) / MASK.sum(-1)  # geometric-mean bound: -0.267, 0, 0.6
    mask, _ = compute_rollout_rejection_mask(LOG_RATIO, MASK, "seq_mean_k1", "0.8_1.5")
    keep = (mean_k1 >= math.log(0.8)) & (mean_k1 <= math.log(1.5))
    assert torch.equal(mask, MASK * keep.unsqueeze(-1))
    k3 = torch.exp(LOG_RATIO) - 1 - LOG_RATIO
    mask, _ = compute_rollout_rejection_mask(LOG_RATIO, MASK, "seq_sum_k3", 0.5)
    assert torch.equal(mask, MASK * (((k3 * MASK).sum(-1) <= 0.5).unsqueeze(-1)))


def test_several_options_must_all_pass():
    both, m = compute_rollout_rejection_mask(LOG_RATIO, MASK, "token_k1,seq_max_k2", "0.5_2.0,1.0")
    a, _ = compute_rollout_rejection_mask(LOG_RATIO, MASK, "token_k1", "0.5_2.0")
    b, _ = compute_rollout_rejection_mask(LOG_RATIO, MASK, "seq_max_k2", 1.0)
    assert torch.equal(both, a * b)
    assert {"rollout_rs_token_k1_mean", "rollout_rs_seq_max_k2_mean", "rollout_rs_masked_fraction"} <= set(m)


@pytest.mark.parametrize("option", ROLLOUT_RS_OPTIONS)
def test_padding_values_never_matter(option):
    garbage = torch.where(MASK.bool(), LOG_RATIO, torch.full_like(LOG_RATIO, -30.0))
    threshold = "0.5_2.0" if option.endswith("k1") else 0.7
    got, got_m = compute_rollout_rejection_mask(garbage, MASK, option, threshold)
    want, want_m = compute_rollout_rejection_mask(LOG_RATIO, MASK, option, threshold)
    assert torch.equal(got, want) and got_m == pytest.approx(want_m)


def test_the_combined_call_prefixes_metrics_and_keeps_the_mask_for_diagnostics():
    old = -torch.rand(3, 4)
    weights, mask, m = compute_rollout_correction_and_rejection_mask(
        old, old - LOG_RATIO, MASK, rollout_is="token", rollout_rs="token_k1", rollout_rs_threshold=2.0
    )
    assert torch.allclose(weights, torch.exp(LOG_RATIO).clamp(max=2.0) * MASK, atol=1e-6)
    assert torch.equal(mask, compute_rollout_rejection_mask(LOG_RATIO, MASK, "token_k1", 2.0)[0])
    assert all(key.startswith("rollout_corr/") for key in m)
    assert {"rollout_corr/rollout_is_mean", "rollout_corr/rollout_rs_masked_fraction", "rollout_corr/kl"} <= set(m)
    none, same, _ = compute_rollout_correction_and_rejection_mask(old, old - LOG_RATIO, MASK)
    assert none is None and torch.equal(same, MASK)


@pytest.mark.parametrize(
    "section, message",
    [
        ({"rollout_is": "tokens"}, r"unknown algorithm.rollout_correction.rollout_is='tokens'; valid: token, sequence"),
        (
            {"rollout_rs": "seq_k9", "rollout_rs_threshold": 2},
            r"unknown .*rollout_rs option 'seq_k9'; valid: token_k1",
        ),
        ({"rollout_rs": "token_k2"}, r"rollout_rs_threshold=None: rollout_rs=token_k2 needs a threshold"),
        ({"rollout_rs": "token_k2", "rollout_rs_threshold": "0.5_2"}, r"only k1 options take 'lower_upper'"),
        ({"rollout_rs": "token_k1,seq_max_k2", "rollout_rs_threshold": "1,2,3"}, r"one per option \(2: token_k1"),
        ({"rollout_rs": "token_k1", "rollout_rs_threshold": "abc"}, r"'abc' for token_k1 is not a number"),
        ({"rollout_rs": "token_k1", "rollout_rs_threshold": "2_0.5"}, r"the lower bound exceeds the upper one"),
        ({"rollout_is_threshold": 0}, r"rollout_is_threshold=0 must be a number > 0"),
        ({"rollout_token_veto_threshold": 1e-4}, r"rollout_token_veto_threshold=0.0001: verl 0.7's per-token veto"),
        (
            {"loss_type": "reinforce++"},
            r"unknown algorithm.rollout_correction.loss_type='reinforce\+\+'; valid: ppo_clip",
        ),
    ],
)
def test_bad_settings_are_one_line_naming_the_key(section, message):
    with pytest.raises((UnknownAlgorithmError, AlgorithmConfigError), match=message) as err:
        RolloutCorrectionConfig.from_section(section)
    assert "\n" not in str(err.value)


# ---- the weights in the losses


def _inputs(rows=6, cols=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=gen)
    noise = 0.3 * torch.randn(rows, cols, generator=gen)
    adv = torch.randn(rows, 1, generator=gen).expand(rows, cols).contiguous()
    mask = (torch.rand(rows, cols, generator=gen) > 0.3).float()
    mask[:, 0] = 1
    return x, noise, adv, mask


TAKES_WEIGHTS = sorted(set(POLICY_LOSS_REGISTRY) - {"bypass_mode"})  # bypass recomputes its own


@pytest.mark.parametrize("name", TAKES_WEIGHTS)
def test_every_loss_is_scaled_by_the_weights(name):
    x, noise, adv, mask = _inputs()
    log_prob = -F.softplus(x)
    fn, cfg = get_policy_loss_fn(name), PolicyLossParams(clip_cov_ratio=0.5, kl_cov_ratio=0.5, dro_beta=0.3)
    plain, _ = fn(log_prob + noise, log_prob, adv, mask, "token-mean", cfg)
    ones, _ = fn(log_prob + noise, log_prob, adv, mask, "token-mean", cfg, rollout_is_weights=torch.ones_like(x))
    twice, _ = fn(log_prob + noise, log_prob, adv, mask, "token-mean", cfg, rollout_is_weights=2 * torch.ones_like(x))
    assert ones.item() == pytest.approx(plain.item(), rel=1e-6)
    assert twice.item() == pytest.approx(2 * plain.item(), rel=1e-5) and plain.item() != 0


def _grad_of(name, cfg, x, noise, adv, mask, rows, weights=None, **norm):
    w = torch.linspace(0.5, 1.5, x.shape[1]).requires_grad_(True)
    log_prob = -F.softplus(x[rows] * w)
    rollout = log_prob.detach() + noise[rows]
    weights = None if weights is None else weights[rows]
    loss, metrics = get_policy_loss_fn(name)(
        rollout, log_prob, adv[rows], mask[rows], "token-mean", cfg, rollout_is_weights=weights, **norm
    )
    return loss.item(), torch.autograd.grad(loss, w)[0], metrics


@pytest.mark.parametrize(
    "name, corr",
    [
        ("vanilla", None),  # decoupled: weights from the driver, one tensor for the whole batch
        (
            "bypass_mode",
            RolloutCorrectionConfig(
                bypass_mode=True,
                rollout_is="token",
                rollout_rs="token_k1",
                rollout_rs_threshold="0.7_1.3",
                loss_type="reinforce",
            ),
        ),
        (
            "bypass_mode",
            RolloutCorrectionConfig(
                bypass_mode=True, rollout_is="sequence", rollout_rs="seq_max_k2", rollout_rs_threshold=0.05
            ),
        ),
    ],
)
def test_micro_batches_add_up_to_one_pass_with_correction(name, corr):
    x, noise, adv, mask = _inputs(7, 6, seed=3)
    cfg = PolicyLossParams(rollout_correction=corr)
    weights = None
    if corr is None:
        weights, _ = compute_rollout_correction_weights(noise, mask, "token", 1.2)
    norm = {"batch_num_tokens": mask.sum(), "global_batch_size": x.shape[0]}  # as the actor passes them
    full, g_full, metrics = _grad_of(name, cfg, x, noise, adv, mask, slice(None), weights, **norm)
    micro = [
        _grad_of(name, cfg, x, noise, adv, mask, rows, weights, **norm)
        for rows in (slice(0, 2), slice(2, 3), slice(3, 7))
    ]
    assert sum(m[0] for m in micro) == pytest.approx(full, rel=1e-5)
    assert torch.allclose(sum(m[1] for m in micro), g_full, rtol=1e-5, atol=1e-6)
    if corr is not None:
        assert metrics["rollout_corr/rollout_rs_masked_fraction"] > 0  # the rejection did something
        assert "rollout_corr/rollout_is_mean" in metrics and "rollout_corr/kl" in metrics


def test_bypass_reinforce_is_the_weighted_policy_gradient():
    x, noise, adv, mask = _inputs(seed=4)
    log_prob = (-F.softplus(x)).requires_grad_(True)
    rollout = log_prob.detach() + noise
    corr = RolloutCorrectionConfig(
        bypass_mode=True, rollout_is="token", rollout_is_threshold=1.1, loss_type="reinforce"
    )
    loss, metrics = get_policy_loss_fn("bypass_mode")(
        rollout, log_prob, adv, mask, "token-mean", PolicyLossParams(rollout_correction=corr)
    )
    (grad,) = torch.autograd.grad(loss, log_prob)
    w = torch.exp(log_prob.detach() - rollout).clamp(max=1.1)
    assert torch.allclose(grad, -w * adv * mask / mask.sum(), atol=1e-7)
    assert metrics["actor/pg_clipfrac"] == 0.0


def test_bypass_with_batch_normalize_rescales_each_micro_batchs_weights_to_mean_one():
    """verl's behaviour: in bypass mode the weights exist one micro batch at a time, so the batch
    normalisation is over the micro batch."""
    x, noise, adv, mask = _inputs(seed=4)
    log_prob = (-F.softplus(x)).requires_grad_(True)
    rollout = log_prob.detach() + noise
    corr = RolloutCorrectionConfig(
        bypass_mode=True,
        rollout_is="token",
        rollout_is_threshold=5.0,
        rollout_is_batch_normalize=True,
        loss_type="reinforce",
    )
    loss, _ = get_policy_loss_fn("bypass_mode")(
        rollout, log_prob, adv, mask, "token-mean", PolicyLossParams(rollout_correction=corr)
    )
    (grad,) = torch.autograd.grad(loss, log_prob)
    w = torch.exp(log_prob.detach() - rollout).clamp(max=5.0)
    w = w / ((w * mask).sum() / mask.sum())  # mean 1 over this micro batch's tokens
    assert torch.allclose(grad, -w * adv * mask / mask.sum(), atol=1e-6)


def test_bypass_ppo_clip_is_vanilla_against_the_rollout_policy():
    x, noise, adv, mask = _inputs(seed=5)
    log_prob = -F.softplus(x)
    rollout = log_prob + noise
    corr = RolloutCorrectionConfig(bypass_mode=True, rollout_is="token")  # weights logged, not applied
    bypass, metrics = get_policy_loss_fn("bypass_mode")(
        rollout, log_prob, adv, mask, "token-mean", PolicyLossParams(rollout_correction=corr)
    )
    vanilla, _ = get_policy_loss_fn("vanilla")(rollout, log_prob, adv, mask, "token-mean", PolicyLossParams())
    assert bypass.item() == pytest.approx(vanilla.item())
    assert "rollout_corr/rollout_is_mean" in metrics


def test_bypass_without_its_config_says_which_key():
    x, noise, adv, mask = _inputs()
    with pytest.raises(AlgorithmConfigError, match=r"set algorithm.rollout_correction.bypass_mode=true"):
        get_policy_loss_fn("bypass_mode")(x + noise, x, adv, mask, "token-mean", PolicyLossParams())
