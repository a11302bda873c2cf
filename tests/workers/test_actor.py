"""PPOActor: response log-probs against a plain full forward, and the PPO update against a
hand-written one-pass loss (micro-batch accumulation, masking)."""

import copy

import pytest
import torch

from hybridrl.protocol import DataProto
from hybridrl.workers.actor import PPOActor
from hybridrl.workers.pass_specs import LogProbSpec
from tests.tiny_models import ppo_section
from tests.workers.specs_helpers import update_spec_of

# fp32 tolerance for gradients summed in a different order (micro batches vs one pass):
# relative 1e-4, absolute 1e-6 on the weight deltas (weights are ~0.02, deltas up to ~1).
RTOL, ATOL = 1e-4, 1e-6

PROMPT_LENS = [6, 3, 1, 4]  # left padding of 0, 3, 5, 2 tokens (prompt_length 6)
RESPONSE_LENS = [5, 2, 4, 1]  # valid response tokens, the rest of the 5 is masked


@pytest.fixture(scope="module")
def base_model(tiny_model_dir):
    from hybridrl.models import load_causal_lm

    return load_causal_lm(tiny_model_dir)


def _actor_config(micro, loss_agg_mode="token-mean", entropy_coeff=0.0, use_kl_loss=False, **extra):
    return ppo_section(
        "actor_rollout_ref.actor",
        {
            "ppo_mini_batch_size": 4,
            "ppo_micro_batch_size_per_gpu": micro,
            "ppo_epochs": 1,
            "clip_ratio": 0.2,
            "clip_ratio_c": 3.0,
            "loss_agg_mode": loss_agg_mode,
            "entropy_coeff": entropy_coeff,
            "use_kl_loss": use_kl_loss,
            "kl_loss_coef": 0.1,
            "kl_loss_type": "low_var_kl",
            "grad_clip": 1.0e6,  # no clipping: the raw gradients are compared
            "policy_loss": {"loss_mode": "vanilla"},
            **extra,
        },
    )


def _full_response_logits(module, batch, temperature=1.0):
    """Plain forward over the whole sequence; position P-1+i predicts response token i."""
    P, R = batch["prompts"].shape[1], batch["responses"].shape[1]
    logits = module(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
    ).logits.float()
    return logits[:, P - 1 : P + R - 1] / temperature


def _gather_logp(logits, responses):
    return torch.log_softmax(logits, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)


def _ppo_batch(model, make_batch, seed=0):
    """A 4-row batch with old log-probs near the current ones (some ratios clipped)."""
    b = make_batch(PROMPT_LENS, RESPONSE_LENS, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        logp = _gather_logp(_full_response_logits(model, b), b["responses"])
    b["old_log_probs"] = logp + 0.3 * torch.randn(logp.shape, generator=gen)
    b["ref_log_prob"] = logp + 0.2 * torch.randn(logp.shape, generator=gen)
    b["advantages"] = torch.randn(logp.shape, generator=gen) * b["response_mask"]
    return b


def _run_update(base_model, batch, config):
    module = copy.deepcopy(base_model)
    actor = PPOActor(config, module, torch.optim.SGD(module.parameters(), lr=1.0))
    metrics, _ = actor.update_policy(DataProto.from_dict(tensors=batch), update_spec_of(config))
    return module, metrics


def _hand_pg_loss(module, b, loss_agg_mode):
    """Vanilla PPO (clip 0.2, dual clip 3) over the whole mini batch in one pass."""
    logp = _gather_logp(_full_response_logits(module, b), b["responses"])
    A, mask = b["advantages"], b["response_mask"].float()
    ratio = torch.exp(logp - b["old_log_probs"])
    per_token = torch.maximum(-A * ratio, -A * ratio.clamp(0.8, 1.2))
    per_token = torch.where(A < 0, torch.minimum(per_token, -3.0 * A), per_token)
    if loss_agg_mode == "token-mean":
        return (per_token * mask).sum() / mask.sum()
    assert loss_agg_mode == "seq-mean-token-mean"
    return ((per_token * mask).sum(-1) / mask.sum(-1)).mean()


def _assert_same_params(a, b, rtol=RTOL, atol=ATOL):
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=rtol, atol=atol, msg=lambda m, name=name: f"{name}: {m}")


# ----------------------------------------------------------------------------- compute_log_prob


@pytest.mark.parametrize("temperature, remove_padding", [(1.0, False), (0.7, False), (0.7, True)])
def test_compute_log_prob_matches_full_forward(base_model, make_batch, temperature, remove_padding):
    b = make_batch(PROMPT_LENS, RESPONSE_LENS, seed=3)
    actor = PPOActor(_actor_config(2), base_model)  # no optimizer: the reference-policy form
    spec = LogProbSpec(
        micro_batch_size=3,
        temperature=temperature,
        use_remove_padding=remove_padding,
        calculate_entropy=True,
        calculate_sum_pi_squared=True,
    )
    log_probs, entropys, sum_pi_squared = actor.compute_log_prob(DataProto.from_dict(tensors=b), spec)

    with torch.no_grad():
        logits = _full_response_logits(base_model, b, temperature)
    expected_logp = _gather_logp(logits, b["responses"])
    p = torch.softmax(logits, dim=-1)
    expected_entropy = -(p * torch.log_softmax(logits, dim=-1)).sum(-1)

    assert log_probs.shape == entropys.shape == sum_pi_squared.shape == (4, 5)
    assert log_probs.dtype == entropys.dtype == torch.float32
    mask = b["response_mask"].bool()  # packed forwards leave padding at 0
    torch.testing.assert_close(log_probs[mask], expected_logp[mask], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropys[mask], expected_entropy[mask], rtol=1e-5, atol=1e-5)
    assert (log_probs[mask] < 0).all() and (entropys[mask] > 0).all()
    torch.testing.assert_close(sum_pi_squared[mask], p.square().sum(-1)[mask], rtol=1e-5, atol=1e-6)


def test_temperature_divides_logits(base_model, make_batch):
    b = make_batch(PROMPT_LENS, RESPONSE_LENS, seed=4)
    actor = PPOActor(_actor_config(2), base_model)
    hot = actor.compute_log_prob(DataProto.from_dict(tensors=b), LogProbSpec(micro_batch_size=4, temperature=2.0))[0]
    with torch.no_grad():
        logits = _full_response_logits(base_model, b)  # T = 1
    torch.testing.assert_close(hot, _gather_logp(logits / 2.0, b["responses"]), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(hot, _gather_logp(logits, b["responses"]), atol=1e-3)


# verl's workers write these settings into meta_info; here they would change every result
LYING_META = {
    "temperature": 5.0,
    "micro_batch_size": 1,
    "use_dynamic_bsz": True,
    "max_token_len": 1,
    "use_remove_padding": True,
}


def test_log_prob_settings_come_from_the_spec_not_meta_info(base_model, make_batch):
    b = make_batch(PROMPT_LENS, RESPONSE_LENS, seed=4)
    actor = PPOActor(_actor_config(2), base_model)
    spec = LogProbSpec(micro_batch_size=4, temperature=0.7, calculate_entropy=True)
    clean = actor.compute_log_prob(DataProto.from_dict(tensors=b), spec)
    lying = actor.compute_log_prob(DataProto.from_dict(tensors=b, meta_info=dict(LYING_META)), spec)
    for got, expected in zip(lying[:2], clean[:2]):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_update_settings_come_from_the_spec_not_meta_info(base_model, make_batch):
    b = _ppo_batch(base_model, make_batch, seed=8)
    cfg = _actor_config(2, entropy_coeff=0.01)
    spec = update_spec_of(cfg, temperature=0.7)
    modules = []
    for meta in ({}, dict(LYING_META)):
        module = copy.deepcopy(base_model)
        PPOActor(cfg, module, torch.optim.SGD(module.parameters(), lr=1.0)).update_policy(
            DataProto.from_dict(tensors=dict(b), meta_info=meta), spec
        )
        modules.append(module)
    _assert_same_params(modules[1], modules[0], rtol=0, atol=0)


def test_compute_log_prob_bf16_autocast_is_close_and_fp32(base_model, make_batch):
    b = make_batch(PROMPT_LENS, RESPONSE_LENS, seed=5)
    cfg = _actor_config(2, fsdp_config={"mixed_precision": {"param_dtype": "bf16"}})
    actor = PPOActor(cfg, base_model)
    log_probs, _, _ = actor.compute_log_prob(DataProto.from_dict(tensors=b), LogProbSpec(micro_batch_size=4))
    with torch.no_grad():
        expected = _gather_logp(_full_response_logits(base_model, b), b["responses"])
    assert log_probs.dtype == torch.float32
    torch.testing.assert_close(log_probs, expected, rtol=0.02, atol=0.05)  # bf16 matmuls


# ----------------------------------------------------------------------------- update_policy


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_update_equals_hand_written_one_pass_loss(base_model, make_batch, loss_agg_mode):
    """Micro batches of 2 (2+6 vs 5+1 valid tokens) must reproduce the whole-batch gradient."""
    b = _ppo_batch(base_model, make_batch)
    updated, metrics = _run_update(base_model, b, _actor_config(2, loss_agg_mode))

    reference = copy.deepcopy(base_model)
    loss = _hand_pg_loss(reference, b, loss_agg_mode)
    loss.backward()
    grad_norm = torch.norm(torch.stack([p.grad.norm() for p in reference.parameters()]))
    with torch.no_grad():
        for p in reference.parameters():
            p -= p.grad  # SGD, lr = 1

    assert sum(metrics["actor/pg_loss"]) == pytest.approx(loss.item(), rel=1e-5, abs=1e-6)
    assert metrics["actor/grad_norm"] == [pytest.approx(grad_norm.item(), rel=1e-4)]
    _assert_same_params(updated, reference)
    delta = max((p - q).abs().max().item() for p, q in zip(updated.parameters(), base_model.parameters()))
    assert delta > 1e-3, "the update barely moved the weights: the comparison above proves nothing"


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_micro_batch_2_equals_micro_batch_4(base_model, make_batch, loss_agg_mode):
    """Same update whether the 4-row mini batch runs as 2 micro batches or 1 (entropy + KL on)."""
    b = _ppo_batch(base_model, make_batch, seed=7)
    kwargs = dict(loss_agg_mode=loss_agg_mode, entropy_coeff=0.01, use_kl_loss=True)
    two, m2 = _run_update(base_model, b, _actor_config(2, **kwargs))
    one, m4 = _run_update(base_model, b, _actor_config(4, **kwargs))
    _assert_same_params(two, one)
    for key in ("actor/pg_loss", "actor/entropy_loss", "actor/kl_loss"):
        assert len(m2[key]) == len(m4[key]) == 1  # one value per mini batch: the sum over micro batches
        assert m2[key][0] == pytest.approx(m4[key][0], rel=1e-5, abs=1e-6)
    assert m2["actor/grad_norm"][0] == pytest.approx(m4["actor/grad_norm"][0], rel=1e-4)
    assert {"actor/pg_clipfrac", "actor/ppo_kl", "actor/kl_coef"} <= set(m2)


def test_masked_positions_get_no_gradient(base_model, make_batch):
    b = _ppo_batch(base_model, make_batch, seed=11)
    masked = b["response_mask"] == 0
    assert masked.any()
    poisoned = dict(b)
    signs = torch.where(torch.arange(5) % 2 == 0, 1.0, -1.0).expand_as(b["advantages"])
    poisoned["advantages"] = torch.where(masked, 1e30 * signs, b["advantages"])
    poisoned["old_log_probs"] = torch.where(masked, -50.0 * signs, b["old_log_probs"])

    clean, m_clean = _run_update(base_model, b, _actor_config(2))
    dirty, m_dirty = _run_update(base_model, poisoned, _actor_config(2))
    _assert_same_params(dirty, clean, rtol=0, atol=0)
    assert m_dirty["actor/pg_loss"] == m_clean["actor/pg_loss"]
    assert all(torch.isfinite(p).all() for p in dirty.parameters())


# ----------------------------------------------------------------------------- on-policy update


@pytest.mark.parametrize("remove_padding", [False, True])
def test_on_policy_update_without_old_log_probs_equals_recomputed(base_model, make_batch, remove_padding):
    """No old_log_probs (the driver skipped the pass): the same update as with old_log_probs
    recomputed by compute_log_prob, and actor/entropy equals that pass's token-mean entropy."""
    b = _ppo_batch(base_model, make_batch, seed=13)
    cfg = _actor_config(2, use_kl_loss=True)
    spec = LogProbSpec(micro_batch_size=4, use_remove_padding=remove_padding, calculate_entropy=True)
    old, entropy, _ = PPOActor(cfg, base_model).compute_log_prob(DataProto.from_dict(tensors=b), spec)
    update = update_spec_of(cfg, use_remove_padding=remove_padding)
    with_old = dict(b, old_log_probs=old)
    without_old = {k: v for k, v in b.items() if k != "old_log_probs"}
    module_a, module_b = copy.deepcopy(base_model), copy.deepcopy(base_model)
    m_a, none = PPOActor(cfg, module_a, torch.optim.SGD(module_a.parameters(), lr=1.0)).update_policy(
        DataProto.from_dict(tensors=with_old), update
    )
    m_b, own = PPOActor(cfg, module_b, torch.optim.SGD(module_b.parameters(), lr=1.0)).update_policy(
        DataProto.from_dict(tensors=without_old), update, on_policy=True
    )

    _assert_same_params(module_b, module_a)
    assert none is None  # the batch had old_log_probs: nothing to hand back
    torch.testing.assert_close(own, old, rtol=1e-5, atol=1e-5)  # the update's log-probs are the old ones, rows in order
    assert sum(m_b["actor/pg_loss"]) == pytest.approx(sum(m_a["actor/pg_loss"]), rel=1e-5, abs=1e-6)
    assert max(m_b["actor/ppo_kl"]) == 0.0 and max(m_b["actor/pg_clipfrac"]) == 0.0  # ratio exactly 1
    mask = b["response_mask"].float()
    assert m_b["actor/entropy"] == [pytest.approx(((entropy * mask).sum() / mask.sum()).item(), rel=1e-5)]
    assert "actor/entropy" not in m_a
    delta = max((p - q).abs().max().item() for p, q in zip(module_b.parameters(), base_model.parameters()))
    assert delta > 1e-3


def test_on_policy_update_refuses_several_optimizer_steps(base_model, make_batch):
    from hybridrl.algorithms.errors import AlgorithmConfigError

    b = {k: v for k, v in _ppo_batch(base_model, make_batch).items() if k != "old_log_probs"}
    cfg = _actor_config(2, ppo_mini_batch_size=2)  # 4 rows: two optimizer steps
    module = copy.deepcopy(base_model)
    actor = PPOActor(cfg, module, torch.optim.SGD(module.parameters(), lr=1.0))
    with pytest.raises(AlgorithmConfigError, match="on_policy=True but the batch makes 2 optimizer steps"):
        actor.update_policy(DataProto.from_dict(tensors=b), update_spec_of(cfg), on_policy=True)


def test_an_off_policy_update_without_old_log_probs_is_one_line(base_model, make_batch):
    from hybridrl.algorithms.errors import AlgorithmInputError

    b = {k: v for k, v in _ppo_batch(base_model, make_batch).items() if k != "old_log_probs"}
    cfg = _actor_config(2)
    actor = PPOActor(cfg, copy.deepcopy(base_model))
    with pytest.raises(AlgorithmInputError, match="the batch has no old_log_probs; compute them first"):
        actor.update_policy(DataProto.from_dict(tensors=b), update_spec_of(cfg))


def test_policy_loss_metrics_read_once_equal_their_item_values(base_model, make_batch):
    """The policy loss's per-micro-batch metrics, now read once per mini batch, are bit for bit
    the ``float(v.item())`` of each micro batch's values (what the update reported before)."""
    b = _ppo_batch(base_model, make_batch, seed=3)
    cfg = _actor_config(2, entropy_coeff=0.01, use_kl_loss=True)
    module = copy.deepcopy(base_model)
    actor = PPOActor(cfg, module, torch.optim.SGD(module.parameters(), lr=1.0))
    seen = []
    loss_fn = actor.policy_loss_fn

    def recording(*args, **kwargs):
        loss, metrics = loss_fn(*args, **kwargs)
        seen.append({k: float(v.item()) for k, v in metrics.items()})
        return loss, metrics

    actor.policy_loss_fn = recording
    metrics, _ = actor.update_policy(DataProto.from_dict(tensors=b), update_spec_of(cfg))
    assert len(seen) == 2
    for key in seen[0]:
        assert metrics[key] == [m[key] for m in seen]
        assert all(type(v) is float for v in metrics[key])
    assert "_loss" not in metrics


def test_read_at_once_is_float_of_item():
    from hybridrl.workers.metric_reads import read_at_once

    values = [
        torch.tensor(0.1, dtype=torch.float32),
        0.25,
        torch.tensor(1.7, dtype=torch.bfloat16),
        torch.tensor([3]),
        torch.tensor(True),
        torch.tensor(1e-40, dtype=torch.float64),
    ]
    assert read_at_once(values) == [float(v.item()) if torch.is_tensor(v) else float(v) for v in values]
    assert read_at_once([]) == []
