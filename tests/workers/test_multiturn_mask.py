"""Multi-turn masks: observation tokens (tool / retrieval output, response_mask 0 inside the
response) get no gradient from the actor loss, its entropy bonus or its KL term, and no
GRPO advantage. Search-R1's "retrieved token masking" (arXiv:2503.09516)."""

import copy
from unittest import mock

import pytest
import torch

from hybridrl.algorithms.advantages import get_adv_estimator_fn
from hybridrl.protocol import DataProto
from hybridrl.workers.actor import PPOActor
from tests.tiny_models import ppo_section
from tests.workers.specs_helpers import update_spec_of

R = 10
# Row 0: model(3) obs(4) model(2) pad(1); row 1: model(2) obs(2) model(4) obs(1) model(1)
MASKS = [[1, 1, 1, 0, 0, 0, 0, 1, 1, 0], [1, 1, 0, 0, 1, 1, 1, 1, 0, 1]]
LENGTHS = [9, 10]


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from hybridrl.models import load_causal_lm

    return load_causal_lm(tiny_model_dir)


def _config():
    return ppo_section(
        "actor_rollout_ref.actor",
        {
            "ppo_mini_batch_size": 2,
            "ppo_micro_batch_size_per_gpu": 2,
            "ppo_epochs": 1,
            "clip_ratio": 0.2,
            "clip_ratio_c": 3.0,
            "loss_agg_mode": "token-mean",
            "entropy_coeff": 0.01,
            "use_kl_loss": True,
            "kl_loss_coef": 0.1,
            "kl_loss_type": "low_var_kl",
            "grad_clip": 1.0e6,
            "policy_loss": {"loss_mode": "vanilla"},
        },
    )


def _batch(seed=0):
    """Two multi-turn rows laid out as AgentLoopManager does (attention 1 on observations)."""
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, 2000, (2, 4), generator=gen)
    responses = torch.randint(3, 2000, (2, R), generator=gen)
    response_attention = (torch.arange(R) < torch.tensor(LENGTHS)[:, None]).long()
    responses = responses.masked_fill(response_attention == 0, 2)
    attention_mask = torch.cat([torch.ones(2, 4, dtype=torch.long), response_attention], dim=1)
    return {
        "prompts": prompts,
        "responses": responses,
        "response_mask": torch.tensor(MASKS),
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "old_log_probs": -torch.rand(2, R, generator=gen) * 5,
        "ref_log_prob": -torch.rand(2, R, generator=gen) * 5,
        "advantages": torch.randn(2, R, generator=gen),  # nonzero on observation tokens too, on purpose
    }


def _update_grads(model, batch):
    """(gradient of the loss w.r.t. the response logits (2, R, vocab), parameter gradients)."""
    module = copy.deepcopy(model)
    cfg = _config()
    actor = PPOActor(cfg, module, torch.optim.SGD(module.parameters(), lr=0.0))
    logit_grads = []

    def keep_grad(_module, _inputs, output):
        output.register_hook(logit_grads.append)

    handle = module.lm_head.register_forward_hook(keep_grad)
    param_grads = {}

    def capture_and_skip():  # the optimizer step, replaced: record the accumulated gradients
        param_grads.update({n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None})
        return 0.0

    with mock.patch("hybridrl.workers.actor.optimizer_step", lambda *args: capture_and_skip()):
        actor.update_policy(DataProto.from_dict(tensors=batch), update_spec_of(cfg))
    handle.remove()
    (grad,) = logit_grads
    return grad[:, :-1], param_grads  # logits_to_keep=R+1: position t predicts response token t


def test_observation_tokens_get_no_gradient(model):
    logit_grad, _ = _update_grads(model, _batch())
    per_token = logit_grad.abs().sum(-1)  # (2, R)
    mask = torch.tensor(MASKS).bool()
    assert torch.all(per_token[~mask] == 0)  # exactly zero on observations and padding
    assert torch.all(per_token[mask] > 0)  # every model token is trained on


def test_values_on_observation_tokens_change_nothing(model):
    batch = _batch()
    other = {k: v.clone() for k, v in batch.items()}
    obs = torch.tensor(MASKS) == 0
    for key, noise in (("advantages", 100.0), ("old_log_probs", -7.0), ("ref_log_prob", -9.0)):
        other[key] = torch.where(obs, torch.full_like(other[key], noise), other[key])
    _, grads = _update_grads(model, batch)
    _, other_grads = _update_grads(model, other)
    assert grads.keys() == other_grads.keys() and grads
    for name in grads:
        assert torch.equal(grads[name], other_grads[name]), name


def test_grpo_advantages_are_zero_on_observation_tokens():
    mask = torch.tensor(MASKS + MASKS)
    scores = torch.zeros(4, R)
    scores[:, 8] = torch.tensor([1.0, 0.0, 0.5, 0.2])
    advantages, _ = get_adv_estimator_fn("grpo")(
        token_level_rewards=scores, response_mask=mask, index=["a", "a", "b", "b"], norm_adv_by_std_in_grpo=True
    )
    assert torch.all(advantages[mask == 0] == 0) and torch.all(advantages[mask == 1] != 0)
