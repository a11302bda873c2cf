"""PPOCritic: values read from a full forward of the value model, and one value-loss step."""

import copy

import pytest
import torch

from hybridrl.protocol import DataProto
from hybridrl.workers.critic import PPOCritic
from hybridrl.workers.pass_specs import ForwardSpec
from tests.tiny_models import ppo_section
from tests.workers.specs_helpers import update_spec_of

PROMPT_LENS = [6, 3, 1, 4]
RESPONSE_LENS = [5, 2, 4, 1]
# The gradient of the random-head critic has norm ~1e2 and is clipped to 1 (grad_clip); with
# SGD at this lr one step lowers the loss by ~40 %, a larger lr overshoots the curvature.
LR = 1e-3


@pytest.fixture(scope="module")
def value_model(tiny_model_dir):
    """The tiny value model with a random (not zero-initialised) scalar head."""
    from hybridrl.models import load_value_model

    model = load_value_model(tiny_model_dir)
    head = [p for n, p in model.named_parameters() if not n.startswith(model.base_model_prefix + ".")]
    assert head, "the value model has no head outside the backbone"
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in head:
            p.copy_(torch.randn(p.shape, generator=gen))
    return model


def _critic_config(micro=2, cliprange_value=100.0):
    return ppo_section(
        "critic",
        {
            "ppo_mini_batch_size": 4,
            "ppo_micro_batch_size_per_gpu": micro,
            "ppo_epochs": 1,
            "cliprange_value": cliprange_value,
            "loss_agg_mode": "token-mean",
            "grad_clip": 1.0,
            "model": {"use_remove_padding": False},  # padded forwards, as the full forward compared with
        },
    )


def _full_values(module, b):
    """Value head ``logits[..., 0]`` at positions P-1 .. P+R-2 (the state before each token)."""
    P, R = b["prompts"].shape[1], b["responses"].shape[1]
    out = module(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"])
    return out.logits[:, P - 1 : P + R - 1, 0].float()


def test_compute_values_matches_full_forward(value_model, make_batch):
    b = make_batch(PROMPT_LENS, RESPONSE_LENS, seed=1)
    critic = PPOCritic(_critic_config(), value_model, critic_optimizer=None)
    values = critic.compute_values(DataProto.from_dict(tensors=b), ForwardSpec(micro_batch_size=3))
    with torch.no_grad():
        expected = _full_values(value_model, b) * b["response_mask"]
    assert values.shape == (4, 5) and values.dtype == torch.float32
    torch.testing.assert_close(values, expected, rtol=1e-5, atol=1e-5)
    assert (values[b["response_mask"] == 0] == 0).all()
    assert (values[b["response_mask"] == 1].abs() > 0).all()  # the random head is really read


def test_values_settings_come_from_the_spec_not_meta_info(value_model, make_batch):
    """verl's worker writes micro_batch_size & co into meta_info; here the spec alone decides: a
    token budget of 1 or packed forwards would raise or change the values."""
    b = make_batch(PROMPT_LENS, RESPONSE_LENS, seed=1)
    critic = PPOCritic(_critic_config(), value_model, critic_optimizer=None)
    spec = ForwardSpec(micro_batch_size=2)
    clean = critic.compute_values(DataProto.from_dict(tensors=b), spec)
    meta = {"micro_batch_size": 1, "use_dynamic_bsz": True, "max_token_len": 1, "use_remove_padding": True}
    lying = critic.compute_values(DataProto.from_dict(tensors=b, meta_info=meta), spec)
    torch.testing.assert_close(lying, clean, rtol=0, atol=0)


def test_update_critic_reduces_value_loss(value_model, make_batch):
    module = copy.deepcopy(value_model)
    b = make_batch(PROMPT_LENS, RESPONSE_LENS, seed=2)
    mask = b["response_mask"].float()
    with torch.no_grad():
        vpreds = _full_values(module, b)
    b["values"] = vpreds * mask
    b["returns"] = (vpreds + torch.randn(vpreds.shape, generator=torch.Generator().manual_seed(3))) * mask

    def hand_loss(m):  # 0.5 * token-mean squared error; no clipping with cliprange 100
        with torch.no_grad():
            return (0.5 * ((_full_values(m, b) - b["returns"]) ** 2 * mask).sum() / mask.sum()).item()

    before = hand_loss(module)
    # the expected step: SGD on the hand-written loss, gradient clipped to norm 1 (grad_clip)
    reference = copy.deepcopy(module)
    (0.5 * ((_full_values(reference, b) - b["returns"]) ** 2 * mask).sum() / mask.sum()).backward()
    grad_norm = torch.norm(torch.stack([p.grad.norm() for p in reference.parameters()])).item()
    scale = LR * min(1.0, 1.0 / grad_norm)

    cfg = _critic_config(micro=2)
    critic = PPOCritic(cfg, module, torch.optim.SGD(module.parameters(), lr=LR))
    metrics = critic.update_critic(DataProto.from_dict(tensors=b), update_spec_of(cfg))
    after = hand_loss(module)

    assert {"critic/vf_loss", "critic/vf_clipfrac", "critic/grad_norm"} <= set(metrics)
    # micro losses are normalised by the mini batch's tokens: their sum is the whole-batch loss
    assert metrics["critic/vf_loss"] == [pytest.approx(before, rel=1e-5)]
    assert metrics["critic/vf_clipfrac"] == [0.0, 0.0]
    assert metrics["critic/grad_norm"] == [pytest.approx(grad_norm, rel=1e-4)]
    assert after < 0.8 * before, (before, after)
    for (name, new), old, ref in zip(module.named_parameters(), value_model.parameters(), reference.parameters()):
        # atol: a few fp32 ulps of the weights (the random head is ~1), deltas reach ~1e-3
        torch.testing.assert_close(
            new - old, -scale * ref.grad, rtol=1e-3, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}"
        )
