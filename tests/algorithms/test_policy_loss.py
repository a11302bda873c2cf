import math

import pytest
import torch

from hybridrl.algorithms import (
    LOSS_AGG_MODES,
    AlgorithmConfigError,
    PolicyLossParams,
    UnknownAlgorithmError,
    agg_loss,
    compute_policy_loss_vanilla,
    get_policy_loss_fn,
)


def _ratios_case(ratios, advantages, config=None, mode="token-mean"):
    old = torch.zeros(1, len(ratios))
    logp = torch.log(torch.tensor([ratios])).requires_grad_(True)
    adv = torch.tensor([advantages])
    loss, metrics = compute_policy_loss_vanilla(old, logp, adv, torch.ones(1, len(ratios)), mode, config)
    return loss, metrics, logp


def test_vanilla_hand_values_clip_and_dual_clip():
    # A=+1,r=1.5 -> -1.2 (clipped); A=+1,r=0.5 -> -0.5; A=-1,r=0.5 -> 0.8 (clipped);
    # A=-1,r=5 -> max(5, 1.2)=5 then dual clip min(5, 3) = 3
    loss, m, logp = _ratios_case([1.5, 0.5, 0.5, 5.0], [1.0, 1.0, -1.0, -1.0])
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 0.8 + 3.0) / 4)
    assert m["actor/pg_clipfrac"] == pytest.approx(0.5)
    assert m["actor/pg_clipfrac_lower"] == pytest.approx(0.25)
    kl = -(math.log(1.5) + 2 * math.log(0.5) + math.log(5.0)) / 4
    assert m["actor/ppo_kl"] == pytest.approx(kl, rel=1e-5)
    assert all(torch.is_tensor(v) and v.dim() == 0 and not v.requires_grad for v in m.values())
    loss.backward()
    # d/dlogp of -A*r = -A*r on the unclipped token only; clipped tokens get no gradient
    assert torch.allclose(logp.grad, torch.tensor([[0.0, -0.5 / 4, 0.0, 0.0]]), atol=1e-6)


def test_clip_higher_asymmetric_bounds():
    cfg = PolicyLossParams(clip_ratio_low=0.2, clip_ratio_high=0.28)
    # A=+1, r=1.25 is inside 1+0.28 -> -1.25 (symmetric 0.2 would give -1.2)
    loss, m, _ = _ratios_case([1.25], [1.0], cfg)
    assert loss.item() == pytest.approx(-1.25)
    assert m["actor/pg_clipfrac"] == 0.0
    loss, _, _ = _ratios_case([1.25], [1.0])
    assert loss.item() == pytest.approx(-1.2)
    # A=-1, r=0.7 is clipped at the low side 0.8 -> 0.8
    loss, m, _ = _ratios_case([0.7], [-1.0], cfg)
    assert loss.item() == pytest.approx(0.8)
    assert m["actor/pg_clipfrac"] == 1.0


def test_dual_clip_bounds_negative_advantage_losses():
    torch.manual_seed(0)
    adv = -torch.rand(1, 50) * 3
    logp = torch.randn(1, 50) * 3
    cfg = PolicyLossParams(clip_ratio_c=2.5)
    for i in range(50):
        loss, _ = compute_policy_loss_vanilla(
            torch.zeros(1, 1), logp[:, i : i + 1], adv[:, i : i + 1], torch.ones(1, 1), config=cfg
        )
        assert loss.item() <= -adv[0, i].item() * 2.5 + 1e-6


def test_log_ratio_is_clamped_before_exp():
    old = torch.zeros(1, 1)
    # log-ratio 100 -> clamped to 20; A=-1: the dual clip then bounds the loss at 3
    loss, _ = compute_policy_loss_vanilla(old, torch.full((1, 1), 100.0), -torch.ones(1, 1), torch.ones(1, 1))
    assert math.isfinite(loss.item()) and loss.item() == pytest.approx(3.0)


@pytest.mark.parametrize(
    "kwargs, key",
    [
        (dict(clip_ratio_c=1.0), "clip_ratio_c"),
        (dict(clip_ratio_low=-0.1), "clip_ratio_low"),
        (dict(clip_ratio=0), "clip_ratio"),  # the actor section's rule: a clip of 0 clips everything
    ],
)
def test_policy_loss_config_errors(kwargs, key):
    with pytest.raises(AlgorithmConfigError, match=f"actor_rollout_ref.actor.{key}="):
        PolicyLossParams(**kwargs)


def test_policy_loss_config_defaults():
    cfg = PolicyLossParams(clip_ratio=0.3, clip_ratio_low=None, clip_ratio_high=None)  # null follows clip_ratio
    assert (cfg.clip_ratio_low, cfg.clip_ratio_high, cfg.clip_ratio_c) == (0.3, 0.3, 3.0)
    cfg = PolicyLossParams(clip_ratio=0.3)  # as the YAML (and verl): low and high default to 0.2
    assert (cfg.clip_ratio_low, cfg.clip_ratio_high) == (0.2, 0.2)


def test_one_policy_loss_section_class_and_one_definition_per_field():
    import dataclasses

    from hybridrl.algorithms import ActorLossKnobs, PolicyLossConfig
    from hybridrl.workers.config import ActorConfig
    from hybridrl.workers.config import PolicyLossConfig as SectionClass

    assert SectionClass is PolicyLossConfig  # verl's actor.policy_loss section, from either package
    assert issubclass(PolicyLossParams, PolicyLossConfig) and issubclass(PolicyLossParams, ActorLossKnobs)
    assert issubclass(ActorConfig, ActorLossKnobs)
    section = {f.name for f in dataclasses.fields(PolicyLossConfig)}
    actor_keys = {f.name for f in dataclasses.fields(ActorLossKnobs)}
    assert {f.name for f in dataclasses.fields(PolicyLossParams)} == section | actor_keys
    assert not section & actor_keys
    for cls in (PolicyLossParams, ActorConfig):  # the fields are inherited, not declared again
        assert not set(cls.__dict__.get("__annotations__", {})) & (section | actor_keys)


def test_a_loss_refuses_the_section_alone_with_a_message():
    from hybridrl.algorithms import PolicyLossConfig

    ones = torch.ones(1, 2)
    with pytest.raises(AlgorithmConfigError, match=r"got PolicyLossConfig \(the actor_rollout_ref.actor.policy_loss"):
        compute_policy_loss_vanilla(ones, ones, ones, ones, "token-mean", PolicyLossConfig())


def test_policy_loss_registry():
    assert get_policy_loss_fn("vanilla") is compute_policy_loss_vanilla
    with pytest.raises(UnknownAlgorithmError, match="actor_rollout_ref.actor.policy_loss.loss_mode") as e:
        get_policy_loss_fn("ppo2")
    assert "vanilla" in str(e.value)


LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 7.0 / 3.0),  # (1 + 2 + 4) / 3 tokens
        ("seq-mean-token-sum", (3.0 + 4.0) / 2),  # empty third row is not counted
        ("seq-mean-token-mean", (1.5 + 4.0) / 2),
        ("seq-mean-token-sum-norm", (3.0 / 3 + 4.0 / 3) / 2),
        ("token-sum", 1.0 + 2.0 + 4.0),
    ],
)
def test_agg_loss_hand_values(mode, expected):
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected)


def test_agg_loss_global_normalisers_and_errors():
    assert agg_loss(LOSS, MASK, "token-mean", batch_num_tokens=7).item() == pytest.approx(1.0)
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum", global_batch_size=7).item() == pytest.approx(1.0)
    with pytest.raises(UnknownAlgorithmError, match="actor_rollout_ref.actor.loss_agg_mode"):
        agg_loss(LOSS, MASK, "mean")
    with pytest.raises(AlgorithmConfigError, match="batch_num_tokens"):
        agg_loss(LOSS, MASK, "token-mean", batch_num_tokens=0)
    with pytest.raises(AlgorithmConfigError, match=r"dp_size=2 needs the global global_batch_size"):
        agg_loss(LOSS, MASK, "seq-mean-token-mean", dp_size=2)
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=7).item() == pytest.approx(7 / 2 / 7)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_data_parallel_ranks_average_to_the_one_worker_loss(mode):
    """Each rank aggregates its rows with the global counts and dp_size; FSDP's gradient mean
    over ranks then gives the loss of one worker on all rows."""
    torch.manual_seed(1)
    x, mask = torch.randn(8, 4), (torch.rand(8, 4) > 0.3).float()
    mask[:, 0] = 1
    counts = {"batch_num_tokens": mask.sum(), "global_batch_size": 8}
    ranks = [
        agg_loss(x[r], mask[r], mode, dp_size=4, **counts) for r in (slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8))
    ]
    assert torch.stack(ranks).mean().item() == pytest.approx(agg_loss(x, mask, mode).item(), rel=1e-5)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batch_accumulation_equals_full_batch(mode):
    torch.manual_seed(0)
    x = torch.randn(6, 5)
    mask = (torch.rand(6, 5) > 0.4).float()
    mask[:, 0] = 1
    w = torch.randn(5, requires_grad=True)

    def loss_of(rows, **kw):
        return agg_loss((x[rows] * w) ** 2, mask[rows], mode, **kw)

    full = loss_of(slice(0, 6))
    (g_full,) = torch.autograd.grad(full, w)
    total = torch.zeros(())
    g_acc = torch.zeros(5)
    n_tokens, n_seqs = mask.sum(), 6
    for rows in (slice(0, 1), slice(1, 4), slice(4, 6)):  # uneven micro batches
        micro = loss_of(rows, batch_num_tokens=n_tokens, global_batch_size=n_seqs)
        g_acc += torch.autograd.grad(micro, w)[0]
        total = total + micro.detach()
    assert total.item() == pytest.approx(full.item(), rel=1e-5)
    assert torch.allclose(g_acc, g_full, rtol=1e-5, atol=1e-6)
