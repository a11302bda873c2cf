"""The actor's KL loss with ``kl_loss_type=full`` (exact KL from reference logits) and its
stop on a non-finite loss."""

import copy

import pytest
import torch

from hybridrl.algorithms.errors import NonFiniteError
from hybridrl.protocol import DataProto
from hybridrl.workers.actor import PPOActor
from tests.tiny_models import ppo_section
from tests.workers.specs_helpers import update_spec_of

PROMPT_LENS, RESPONSE_LENS = [6, 3, 1, 4], [5, 2, 4, 1]
KL_COEF = 0.5


@pytest.fixture(scope="module")
def models(tiny_model_dir):
    from hybridrl.models import load_causal_lm

    actor = load_causal_lm(tiny_model_dir)
    ref = copy.deepcopy(actor)
    with torch.no_grad():  # a reference that differs from the actor, so the KL is not zero
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return actor, ref.requires_grad_(False)


def _config(kl_loss_type, micro=2):
    return ppo_section(
        "actor_rollout_ref.actor",
        {
            "ppo_mini_batch_size": 4,
            "ppo_micro_batch_size_per_gpu": micro,
            "ppo_epochs": 1,
            "clip_ratio": 0.2,
            "clip_ratio_c": 3.0,
            "loss_agg_mode": "token-mean",
            "entropy_coeff": 0.0,
            "use_kl_loss": True,
            "kl_loss_coef": KL_COEF,
            "kl_loss_type": kl_loss_type,
            "grad_clip": 1.0e6,
            "policy_loss": {"loss_mode": "vanilla"},
        },
    )


def _response_logits(module, b):
    P, R = b["prompts"].shape[1], b["responses"].shape[1]
    out = module(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"])
    return out.logits.float()[:, P - 1 : P + R - 1]


def _batch(make_batch, actor):
    b = make_batch(PROMPT_LENS, RESPONSE_LENS, seed=3)
    with torch.no_grad():
        logp = torch.log_softmax(_response_logits(actor, b), -1).gather(-1, b["responses"][..., None])[..., 0]
    b["old_log_probs"] = logp
    b["advantages"] = torch.zeros_like(logp)  # no policy-gradient term: the update is the KL loss alone
    return b


def test_full_kl_loss_gradient_equals_exact_kl_by_hand(models, make_batch):
    actor_model, ref_model = models
    b = _batch(make_batch, actor_model)
    module = copy.deepcopy(actor_model)
    cfg = _config("full")
    actor = PPOActor(cfg, module, torch.optim.SGD(module.parameters(), lr=1.0), ref_module=ref_model)
    metrics, _ = actor.update_policy(DataProto.from_dict(tensors=dict(b)), update_spec_of(cfg))

    hand = copy.deepcopy(actor_model)
    p_logits, q_logits = _response_logits(hand, b), _response_logits(ref_model, b)
    kl = torch.distributions.kl_divergence(
        torch.distributions.Categorical(logits=p_logits), torch.distributions.Categorical(logits=q_logits)
    )
    mask = b["response_mask"].float()
    kl_loss = (kl * mask).sum() / mask.sum()
    (KL_COEF * kl_loss).backward()
    assert sum(metrics["actor/kl_loss"]) == pytest.approx(kl_loss.item(), rel=1e-4)
    assert kl_loss.item() > 0
    for (name, p_new), p_old, p_hand in zip(module.named_parameters(), actor_model.parameters(), hand.parameters()):
        expected = p_old - (p_hand.grad if p_hand.grad is not None else 0)
        torch.testing.assert_close(p_new, expected, rtol=1e-4, atol=1e-6, msg=name)


def test_full_kl_loss_without_reference_module_is_a_clear_error(models, make_batch):
    actor_model, _ = models
    module = copy.deepcopy(actor_model)
    cfg = _config("full")
    actor = PPOActor(cfg, module, torch.optim.SGD(module.parameters(), lr=1.0))
    with pytest.raises(ValueError, match="kl_loss_type=full"):
        actor.update_policy(DataProto.from_dict(tensors=_batch(make_batch, actor_model)), update_spec_of(cfg))


def test_non_finite_loss_stops_the_update_naming_the_step(models, make_batch):
    actor_model, _ = models
    b = _batch(make_batch, actor_model)
    b["advantages"][0, 0] = float("nan")
    b["ref_log_prob"] = b["old_log_probs"].clone()
    module = copy.deepcopy(actor_model)
    before = [p.detach().clone() for p in module.parameters()]
    cfg = _config("low_var_kl")
    actor = PPOActor(cfg, module, torch.optim.SGD(module.parameters(), lr=1.0))
    data = DataProto.from_dict(tensors=dict(b), meta_info={"global_steps": 7})
    with pytest.raises(NonFiniteError, match="step 7: actor loss"):
        actor.update_policy(data, update_spec_of(cfg))
    assert all(torch.equal(p, q) for p, q in zip(module.parameters(), before))  # weights untouched
