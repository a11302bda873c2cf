"""The packed path (use_remove_padding), token-budget micro batches (use_dynamic_bsz) and the
chunked vocabulary projection give the padded path's log-probs, entropies, values, losses and
gradients, on the tiny model in fp32.

Tolerance: 1e-5 on log-probs/values (the packed forward does the same arithmetic on fewer
tokens; observed ~1e-7) and relative 1e-4 / absolute 1e-6 on gradients summed in another
order (as tests/workers/test_actor.py).
"""

import copy
import dataclasses
from unittest import mock

import pytest
import torch

from hybridrl.config.batch_sizes import worker_batch_sizes
from hybridrl.protocol import DataProto
from hybridrl.workers.actor import PPOActor
from hybridrl.workers.critic import PPOCritic
from hybridrl.workers.pass_specs import LogProbSpec, critic_specs
from tests.tiny_models import ppo_section
from tests.workers.specs_helpers import update_spec_of

PROMPT_LENS = [6, 3, 1, 4, 2, 5]
RESPONSE_LENS = [5, 2, 4, 1, 3, 5]
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-6


@pytest.fixture(scope="module")
def base_model(tiny_model_dir):
    from hybridrl.models import load_causal_lm

    return load_causal_lm(tiny_model_dir)


def _actor_config(
    micro=2,
    dynamic=False,
    budget=None,
    chunking=False,
    loss_agg_mode="token-mean",
    kl_loss_type="low_var_kl",
    param_dtype="fp32",
):
    return ppo_section(
        "actor_rollout_ref.actor",
        {
            "ppo_mini_batch_size": 6,
            "ppo_micro_batch_size_per_gpu": micro,
            "ppo_epochs": 1,
            "clip_ratio": 0.2,
            "clip_ratio_c": 3.0,
            "loss_agg_mode": loss_agg_mode,
            "entropy_coeff": 0.01,
            "use_kl_loss": True,
            "kl_loss_coef": 0.1,
            "kl_loss_type": kl_loss_type,
            "grad_clip": 1.0e6,
            "policy_loss": {"loss_mode": "vanilla"},
            "use_dynamic_bsz": dynamic,
            **_budget("ppo_max_token_len_per_gpu", budget),
            "entropy_from_logits_with_chunking": chunking,
            "fsdp_config": {"mixed_precision": {"param_dtype": param_dtype}},
        },
    )


def _budget(key, budget):
    """``{key: budget}``, or nothing for no budget (the packaged one, unused without use_dynamic_bsz)."""
    return {} if budget is None else {key: budget}


def _ppo_batch(make_batch, seed=0):
    b = make_batch(PROMPT_LENS, RESPONSE_LENS, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    shape = b["responses"].shape
    b["old_log_probs"] = -torch.rand(shape, generator=gen) * 8  # ~ the random model's log-probs
    b["ref_log_prob"] = -torch.rand(shape, generator=gen) * 8
    b["advantages"] = torch.randn(shape, generator=gen) * b["response_mask"]
    return b


def _log_probs(model, batch, rmpad, temperature=0.7, **config):
    spec = LogProbSpec(
        micro_batch_size=4,
        use_dynamic_bsz=config.get("dynamic", False),
        max_token_len=config.get("budget"),
        use_remove_padding=rmpad,
        temperature=temperature,
        calculate_entropy=True,
    )
    actor = PPOActor(_actor_config(**config), model)
    log_probs, entropys, _ = actor.compute_log_prob(DataProto.from_dict(tensors=batch), spec)
    return log_probs, entropys


def _update(model, batch, rmpad, **config):
    """(parameter gradients of one mini batch, metrics) without stepping the optimizer."""
    module = copy.deepcopy(model)
    cfg = _actor_config(**config)
    actor = PPOActor(cfg, module, torch.optim.SGD(module.parameters(), lr=0.0), ref_module=model)
    grads = {}

    def capture():
        grads.update({n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None})
        return 0.0

    with mock.patch("hybridrl.workers.actor.optimizer_step", lambda *args: capture()):
        metrics, _ = actor.update_policy(
            DataProto.from_dict(tensors=batch), update_spec_of(cfg, temperature=0.7, use_remove_padding=rmpad)
        )
    return grads, metrics


def _assert_same_grads(a, b):
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=GRAD_RTOL, atol=GRAD_ATOL, msg=name)


def test_packed_log_probs_and_entropy_equal_padded(base_model, make_batch):
    b = make_batch(PROMPT_LENS, RESPONSE_LENS, seed=3)
    padded_lp, padded_ent = _log_probs(base_model, b, rmpad=False)
    packed_lp, packed_ent = _log_probs(base_model, b, rmpad=True)
    valid = b["response_mask"].bool()
    torch.testing.assert_close(packed_lp[valid], padded_lp[valid], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed_ent[valid], padded_ent[valid], rtol=1e-5, atol=1e-5)
    assert torch.all(packed_lp[~valid] == 0) and torch.all(packed_ent[~valid] == 0)


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-sum"])
def test_packed_update_equals_padded(base_model, make_batch, loss_agg_mode):
    b = _ppo_batch(make_batch)
    padded_grads, padded_metrics = _update(base_model, b, rmpad=False, loss_agg_mode=loss_agg_mode)
    packed_grads, packed_metrics = _update(base_model, b, rmpad=True, loss_agg_mode=loss_agg_mode)
    _assert_same_grads(padded_grads, packed_grads)
    for key in ("actor/pg_loss", "actor/entropy_loss", "actor/kl_loss"):
        assert packed_metrics[key] == pytest.approx(padded_metrics[key], rel=1e-5), key


@pytest.mark.parametrize("rmpad", [False, True])
def test_dynamic_micro_batches_equal_fixed(base_model, make_batch, rmpad):
    b = _ppo_batch(make_batch, seed=5)
    # 14-token budget: rows of 6..11 tokens, so several micro batches of mixed row counts
    fixed = _log_probs(base_model, b, rmpad=rmpad)
    dynamic = _log_probs(base_model, b, rmpad=rmpad, dynamic=True, budget=14)
    for x, y in zip(fixed, dynamic):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
    fixed_grads, fixed_metrics = _update(base_model, b, rmpad=rmpad, micro=6)
    dyn_grads, dyn_metrics = _update(base_model, b, rmpad=rmpad, dynamic=True, budget=14)
    assert len(dyn_metrics["actor/pg_clipfrac"]) > 1 == len(fixed_metrics["actor/pg_clipfrac"])
    _assert_same_grads(fixed_grads, dyn_grads)
    assert dyn_metrics["actor/pg_loss"] == pytest.approx(fixed_metrics["actor/pg_loss"], rel=1e-5)


@pytest.mark.parametrize("rmpad", [False, True])
def test_chunked_logits_equal_unchunked(base_model, make_batch, monkeypatch, rmpad):
    import hybridrl.models.output_head as output_head

    b = _ppo_batch(make_batch, seed=7)
    whole_lp, whole_ent = _log_probs(base_model, b, rmpad=rmpad)
    whole_grads, _ = _update(base_model, b, rmpad=rmpad)
    vocab = base_model.get_output_embeddings().weight.shape[0]
    monkeypatch.setattr(output_head, "LOGITS_CHUNK_ELEMENTS", 3 * vocab)  # 3 tokens per chunk
    chunk_lp, chunk_ent = _log_probs(base_model, b, rmpad=rmpad, chunking=True)
    chunk_grads, _ = _update(base_model, b, rmpad=rmpad, chunking=True)
    valid = b["response_mask"].bool()
    torch.testing.assert_close(chunk_lp[valid], whole_lp[valid], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(chunk_ent[valid], whole_ent[valid], rtol=1e-5, atol=1e-5)
    _assert_same_grads(whole_grads, chunk_grads)


def test_full_kl_packed_equals_padded(base_model, make_batch):
    b = _ppo_batch(make_batch, seed=9)
    ref = copy.deepcopy(base_model)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.01 * torch.randn_like(p))
    kls = []
    for rmpad in (False, True):
        spec = LogProbSpec(micro_batch_size=4, use_remove_padding=rmpad)
        kls.append(PPOActor(_actor_config(), base_model).compute_full_kl(DataProto.from_dict(tensors=b), ref, spec))
    valid = b["response_mask"].bool()
    torch.testing.assert_close(kls[1][valid], kls[0][valid], rtol=1e-5, atol=1e-6)
    assert torch.all(kls[1][valid] > 0)
    padded_grads, _ = _update(base_model, b, rmpad=False, kl_loss_type="full")
    packed_grads, _ = _update(base_model, b, rmpad=True, kl_loss_type="full")
    _assert_same_grads(padded_grads, packed_grads)


def test_gradient_checkpointing_with_packing(base_model, tiny_model_dir, make_batch):
    from hybridrl.models import load_causal_lm

    checkpointed = load_causal_lm(tiny_model_dir, enable_gradient_checkpointing=True)
    assert any(getattr(m, "gradient_checkpointing", False) for m in checkpointed.modules())
    b = _ppo_batch(make_batch, seed=11)
    padded_grads, _ = _update(base_model, b, rmpad=False)
    packed_grads, _ = _update(checkpointed, b, rmpad=True, chunking=True)
    _assert_same_grads(padded_grads, packed_grads)


def test_bf16_autocast_keeps_fp32_master_weights_and_optimizer(base_model, make_batch):
    b = _ppo_batch(make_batch, seed=13)
    fp32_lp, _ = _log_probs(base_model, b, rmpad=True)
    bf16_lp, _ = _log_probs(base_model, b, rmpad=True, param_dtype="bf16")
    valid = b["response_mask"].bool()
    assert bf16_lp.dtype == torch.float32
    assert not torch.equal(bf16_lp[valid], fp32_lp[valid])  # the matmuls did run in bf16
    torch.testing.assert_close(bf16_lp[valid], fp32_lp[valid], rtol=0.02, atol=0.1)
    module = copy.deepcopy(base_model)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)
    cfg = _actor_config(param_dtype="bf16")
    actor = PPOActor(cfg, module, optimizer)
    actor.update_policy(DataProto.from_dict(tensors=b), update_spec_of(cfg, use_remove_padding=True))
    assert all(p.dtype == torch.float32 for p in module.parameters())
    states = [s for s in optimizer.state.values() if s]
    assert states and all(s["exp_avg"].dtype == torch.float32 for s in states)
    assert not all(torch.equal(p, q) for p, q in zip(module.parameters(), base_model.parameters()))


class _Rescaled(torch.nn.Module):
    """A model that rescales its logits after the head, as Cohere's ``logit_scale`` does."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def get_output_embeddings(self):
        return self.model.get_output_embeddings()

    def forward(self, **kwargs):
        out = self.model(**kwargs)
        out.logits = out.logits * 8.0
        return out


def test_logits_post_processing_is_kept_or_refused(base_model, make_batch):
    from hybridrl.models.output_head import HeadOutputError
    from hybridrl.workers.model_forward import ForwardOptions, forward_response

    capped = _Rescaled(base_model)
    micro = DataProto.from_dict(tensors=make_batch(PROMPT_LENS, RESPONSE_LENS, seed=19))
    with torch.no_grad():
        padded = forward_response(capped, micro, 1.0, torch.float32, ForwardOptions())
        packed = forward_response(capped, micro, 1.0, torch.float32, ForwardOptions(use_remove_padding=True))
        plain = forward_response(base_model, micro, 1.0, torch.float32, ForwardOptions(use_remove_padding=True))
        valid = packed.slots
        torch.testing.assert_close(packed.log_probs[valid], padded.log_probs[valid], rtol=1e-5, atol=1e-5)
        assert (packed.log_probs[valid] - plain.log_probs[valid]).abs().max() > 0.1  # the scale did apply
        with pytest.raises(HeadOutputError, match="entropy_from_logits_with_chunking=false"):
            forward_response(
                capped, micro, 1.0, torch.float32, ForwardOptions(use_remove_padding=True, logits_chunking=True)
            )


# ----------------------------------------------------------------------------- critic


@pytest.fixture(scope="module")
def value_model(tiny_model_dir):
    from hybridrl.models import load_value_model

    model = load_value_model(tiny_model_dir)
    with torch.no_grad():  # the head starts at zero: give it weights so that values differ
        gen = torch.Generator().manual_seed(0)
        model.score.weight.copy_(0.1 * torch.randn(model.score.weight.shape, generator=gen))
    return model


def _critic(model, rmpad, dynamic=False, budget=None):
    cfg = ppo_section(
        "critic",
        {
            "ppo_mini_batch_size": 6,
            "ppo_micro_batch_size_per_gpu": 2,
            "ppo_epochs": 1,
            "cliprange_value": 0.5,
            "loss_agg_mode": "token-mean",
            "grad_clip": 1.0e6,
            "use_dynamic_bsz": dynamic,
            **_budget("ppo_max_token_len_per_gpu", budget),
            **_budget("forward_max_token_len_per_gpu", budget),
            "model": {"use_remove_padding": rmpad},
        },
    )
    module = copy.deepcopy(model)
    critic = PPOCritic(cfg, module, torch.optim.SGD(module.parameters(), lr=0.0))
    grads = {}
    step = critic.critic_optimizer.step

    def capture_then_step():  # the accumulated gradients of the mini batch
        grads.update({n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None})
        return step()

    critic.critic_optimizer.step = capture_then_step
    return critic, grads


@pytest.mark.parametrize("rmpad,dynamic", [(True, False), (True, True), (False, True)])
def test_critic_values_and_update_equal_padded(value_model, make_batch, rmpad, dynamic):
    b = _ppo_batch(make_batch, seed=17)
    b["returns"] = torch.randn(b["responses"].shape, generator=torch.Generator().manual_seed(3))
    results = []
    for packed, dyn in ((False, False), (rmpad, dynamic)):
        critic, grads = _critic(value_model, packed, dyn, budget=14)
        data = DataProto.from_dict(tensors=b)
        specs = critic_specs(critic.config, worker_batch_sizes(critic.config, 1, 1))
        values = critic.compute_values(data, dataclasses.replace(specs.values, micro_batch_size=4))
        data.batch["values"] = values + 0.1
        metrics = critic.update_critic(data, specs.update)
        results.append((values, grads, metrics))
    (values, grads, metrics), (other_values, other_grads, other_metrics) = results
    assert values.abs().sum() > 0
    torch.testing.assert_close(other_values, values, rtol=1e-5, atol=1e-5)
    _assert_same_grads(grads, other_grads)
    assert other_metrics["critic/vf_loss"] == pytest.approx(metrics["critic/vf_loss"], rel=1e-5)


# ----------------------------------------------------------------------------- FSDP2, two ranks


def test_two_sharded_workers_packed_chunked_dynamic_equal_one_padded_worker(ray_cluster, tiny_model_dir, make_batch):
    """Packed rows, chunked logits (recomputed in backward) and token-budget micro batches under
    FSDP2: the head's weight is gathered for backward, and ranks that need different numbers
    of micro batches agree on the largest (otherwise the collectives would hang)."""
    pytest.importorskip("ray")
    from hybridrl.config import load_config
    from hybridrl.controller.local import LocalWorkerGroup
    from hybridrl.controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from hybridrl.workers.fsdp_workers import ActorRolloutRefWorker
    from tests.tiny_models import actor_batch_sizes

    a, m = "actor_rollout_ref.actor", "actor_rollout_ref.model"
    common = [
        f"{m}.path={tiny_model_dir}",
        "data.train_batch_size=4",
        "actor_rollout_ref.rollout.n=2",
        f"{a}.ppo_mini_batch_size=4",
        f"{a}.optim.lr=1e-2",
        f"{a}.entropy_coeff=0.01",
        "data.max_prompt_length=6",
        "data.max_response_length=5",
        f"{a}.fsdp_config.mixed_precision.param_dtype=fp32",
    ]  # exact comparisons on every CPU
    plain = load_config(
        common
        + [
            f"{m}.use_remove_padding=false",
            f"{a}.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        ]
    )
    fast = load_config(
        common
        + [
            f"{m}.use_remove_padding=true",
            f"{a}.use_dynamic_bsz=true",
            f"{a}.ppo_max_token_len_per_gpu=12",
            f"{a}.entropy_from_logits_with_chunking=true",
        ]
    )
    # rank 0 holds 4 long rows (3-4 micro batches of 12 tokens), rank 1 four short ones (1-2)
    b = make_batch([6, 5, 6, 4, 1, 2, 1, 1], [5, 5, 4, 5, 1, 2, 2, 1], seed=0)
    gen = torch.Generator().manual_seed(1)
    b["old_log_probs"] = -torch.rand(b["responses"].shape, generator=gen) * 8
    b["advantages"] = torch.randn(b["responses"].shape, generator=gen) * b["response_mask"]
    batch = DataProto.from_dict(tensors=b)

    local = LocalWorkerGroup(
        ActorRolloutRefWorker,
        plain.actor_rollout_ref,
        actor_batch_sizes(plain.actor_rollout_ref),
        role="actor_rollout",
        device="cpu",
    )
    local.init_model()
    expected = [local.compute_log_prob(batch).batch["old_log_probs"]]
    local_metrics = local.update_actor(batch).meta_info["metrics"]
    expected.append(local.compute_log_prob(batch).batch["old_log_probs"])
    sharded = RayWorkerGroup(
        RayResourcePool([1, 1]),
        RayClassWithInitArgs(
            ActorRolloutRefWorker,
            fast.actor_rollout_ref,
            actor_batch_sizes(fast.actor_rollout_ref, 2),
            role="actor_rollout",
            device="cpu",
        ),
    )
    try:
        sharded.init_model()
        got = [sharded.compute_log_prob(batch).batch["old_log_probs"]]
        sharded_metrics = sharded.update_actor(batch).meta_info["metrics"]
        got.append(sharded.compute_log_prob(batch).batch["old_log_probs"])
    finally:
        sharded.shutdown()
    valid = b["response_mask"].bool()
    for before_or_after in range(2):
        torch.testing.assert_close(got[before_or_after][valid], expected[before_or_after][valid], atol=1e-5, rtol=0)
    assert (expected[1] - expected[0])[valid].abs().max() > 1e-3  # the update moved the policy
    assert sharded_metrics["actor/grad_norm"][0] == pytest.approx(local_metrics["actor/grad_norm"][0], rel=1e-4)
