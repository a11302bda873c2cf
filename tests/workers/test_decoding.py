"""rollout/decoding.py and models/attention.py: the one-token attention against transformers'
SDPA path, and the inverse-CDF sampler's distribution, top-k/top-p and one-hot output."""

import copy
from types import SimpleNamespace

import pytest
import torch

from hybridrl.models.attention import hybridrl_attention as decode_attention
from hybridrl.workers.rollout.decoding import InverseCDFSampler


def _sdpa(module, q, k, v, mask):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, q, k, v, mask, scaling=q.shape[-1] ** -0.5)[0]


@pytest.mark.parametrize("mask_kind", ["none", "bool", "float"])
def test_one_token_attention_equals_sdpa_with_grouped_kv_heads(mask_kind):
    gen = torch.Generator().manual_seed(0)
    bs, heads, kv_heads, length, dim = 3, 6, 2, 7, 16
    q = torch.randn(bs, heads, 1, dim, generator=gen)
    k, v = torch.randn(2, bs, kv_heads, length, dim, generator=gen)
    left_pad = torch.tensor([0, 2, 5])
    keep = (torch.arange(length)[None] >= left_pad[:, None])[:, None, None, :]  # (bs, 1, 1, length)
    mask = {
        "none": None,
        "bool": keep,
        "float": torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min),
    }[mask_kind]
    module = SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True, training=False)
    ours, _ = decode_attention(module, q, k, v, mask, scaling=dim**-0.5)
    assert ours.shape == (bs, 1, heads, dim)
    torch.testing.assert_close(ours, _sdpa(module, q, k, v, mask), rtol=1e-5, atol=1e-6)
    if mask is not None:  # the mask matters: a padded key changes the result when unmasked
        assert not torch.allclose(ours, _sdpa(module, q, k, v, None), atol=1e-3)


def test_longer_queries_go_to_sdpa_unchanged():
    gen = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(3, 2, 4, 5, 8, generator=gen)
    module = SimpleNamespace(num_key_value_groups=1, is_causal=True, training=False)
    assert torch.equal(decode_attention(module, q, k, v, None, scaling=8**-0.5)[0], _sdpa(module, q, k, v, None))


def test_sampler_draws_from_the_softmax_distribution():
    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -30.0]]).repeat(20000, 1)
    scores = InverseCDFSampler(temperature=1.0)(None, logits)
    assert ((scores == 0).sum(-1) == 1).all() and torch.isinf(scores[scores != 0]).all()  # one-hot in log space
    frequencies = torch.bincount(scores.argmax(-1), minlength=5).float() / len(scores)
    torch.testing.assert_close(frequencies, torch.softmax(logits[0], -1), atol=0.012, rtol=0)
    assert frequencies[4] == 0  # p ~ 1e-14


def test_sampler_temperature_top_k_and_top_p():
    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0]]).repeat(20000, 1)

    def frequencies(**kwargs):
        tokens = InverseCDFSampler(**kwargs)(None, logits).argmax(-1)
        return torch.bincount(tokens, minlength=4).float() / len(tokens)

    torch.testing.assert_close(frequencies(temperature=2.0), torch.softmax(logits[0] / 2, -1), atol=0.012, rtol=0)
    top2 = frequencies(top_k=2)
    assert top2[2:].sum() == 0
    torch.testing.assert_close(top2[:2], torch.softmax(logits[0, :2], -1), atol=0.012, rtol=0)
    # p = [.61, .22, .14, .08]: top_p 0.7 keeps the two most likely tokens
    assert frequencies(top_p=0.7)[2:].sum() == 0
    with pytest.raises(ValueError, match="temperature=0"):
        InverseCDFSampler(temperature=0)


def test_rollout_samples_with_fast_decoding_and_without(tiny_model_dir, tokenizer):
    """Both decoding paths give valid sampled responses; greedy is pinned by test_rollout.py."""
    from hybridrl.models import load_causal_lm
    from hybridrl.protocol import DataProto
    from hybridrl.workers.rollout.hf import HFRollout
    from tests.tiny_models import ppo_section

    base = load_causal_lm(tiny_model_dir)
    ids = torch.tensor([tokenizer("What is 2 + 3?")["input_ids"]] * 4)
    prompts = DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "position_ids": torch.arange(ids.shape[1]).expand_as(ids),
        }
    )
    for fast in (True, False):
        cfg = ppo_section(
            "actor_rollout_ref.rollout",
            {
                "dtype": "float32",
                "response_length": 6,
                "do_sample": True,
                "temperature": 1.0,
                "top_p": 1.0,
                "top_k": -1,
                "fast_decoding": fast,
            },
        )
        rollout = HFRollout(copy.deepcopy(base), cfg, tokenizer)
        assert (rollout.module.config._attn_implementation == "hybridrl") == fast
        torch.manual_seed(0)
        responses = rollout.generate_sequences(prompts).batch["responses"]
        assert responses.shape == (4, 6)
        assert len({tuple(r) for r in responses.tolist()}) > 1  # sampled: the 4 copies differ
