"""Tokenizer, causal LM and value model loading on the tiny random Llama (fast)."""

import json
import os

import pytest
import torch
from tiny_models import build_tiny_model

from hybridrl.models import ModelConfigError, load_causal_lm, load_tokenizer, load_value_model


def _batch(tokenizer):
    enc = tokenizer(["1 + 1 =", "What is the capital of France?"], return_tensors="pt", padding=True)
    position_ids = (enc.attention_mask.cumsum(-1) - 1).clamp(min=0)
    return enc.input_ids, enc.attention_mask, position_ids


def test_tiny_model_matches_the_tokenizer(tiny_model_dir, tokenizer):
    with open(os.path.join(tiny_model_dir, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["vocab_size"] == len(tokenizer)
    assert cfg["bos_token_id"] == tokenizer.bos_token_id
    assert cfg["eos_token_id"] == tokenizer.eos_token_id
    assert cfg["pad_token_id"] == tokenizer.pad_token_id is not None
    assert cfg["tie_word_embeddings"] is True
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_key_value_heads"]) == (64, 2, 2)
    assert os.path.isfile(os.path.join(tiny_model_dir, "tokenizer.json"))
    model = load_causal_lm(tiny_model_dir)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_tiny_model_depends_only_on_seed(tokenizer_dir, tmp_path):
    state = torch.random.get_rng_state()
    a = build_tiny_model(tokenizer_dir, str(tmp_path / "a"), num_layers=1, seed=3)
    b = build_tiny_model(tokenizer_dir, str(tmp_path / "b"), num_layers=1, seed=3)
    c = build_tiny_model(tokenizer_dir, str(tmp_path / "c"), num_layers=1, seed=4)
    assert torch.equal(torch.random.get_rng_state(), state)  # caller's RNG untouched
    wa, wb, wc = (load_causal_lm(p).model.layers[0].mlp.up_proj.weight for p in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_causal_lm_round_trip_and_options(tiny_model_dir, tokenizer):
    input_ids, attention_mask, position_ids = _batch(tokenizer)
    model = load_causal_lm(tiny_model_dir)
    assert model.config.use_cache is False and model.dtype == torch.float32
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    assert logits.shape == (*input_ids.shape, len(tokenizer))
    bf16 = load_causal_lm(
        tiny_model_dir, dtype="bf16", override_config={"rms_norm_eps": 1e-3},
        enable_gradient_checkpointing=True,
    )  # fmt: skip
    assert bf16.dtype == torch.bfloat16 and bf16.config.rms_norm_eps == 1e-3
    assert any(getattr(m, "gradient_checkpointing", False) for m in bf16.modules())


def test_bad_dtype_and_override_key(tiny_model_dir):
    with pytest.raises(ModelConfigError, match=r"dtype: got 'float8'; use one of"):
        load_causal_lm(tiny_model_dir, dtype="float8")
    with pytest.raises(ModelConfigError, match=r"override_config.hiden_size: LlamaConfig has no such"):
        load_causal_lm(tiny_model_dir, override_config={"hiden_size": 32})


def test_tokenizer_pads_left_and_falls_back_to_eos(tiny_model_dir, tmp_path):
    tok = load_tokenizer(tiny_model_dir)
    assert tok.padding_side == "left" and tok.pad_token_id is not None
    assert load_tokenizer(tiny_model_dir, padding_side="right").padding_side == "right"
    tok.pad_token = None
    tok.save_pretrained(tmp_path)  # a tokenizer-only folder, with no pad token
    reloaded = load_tokenizer(str(tmp_path))
    assert reloaded.pad_token == reloaded.eos_token is not None
    with pytest.raises(ModelConfigError, match="padding_side: got 'center'"):
        load_tokenizer(tiny_model_dir, padding_side="center")


def test_value_model_shape_zero_head_and_shared_backbone(tiny_model_dir, tokenizer):
    input_ids, attention_mask, position_ids = _batch(tokenizer)
    critic = load_value_model(tiny_model_dir)
    assert critic.config.use_cache is False and critic.dropout.p == 0.0
    values = critic(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits[..., 0]
    assert values.shape == input_ids.shape
    assert torch.equal(values, torch.zeros_like(values))  # zero-initialised head
    lm = load_causal_lm(tiny_model_dir)
    q_critic, q_lm = critic.model.layers[0].self_attn.q_proj, lm.model.layers[0].self_attn.q_proj
    assert torch.equal(q_critic.weight, q_lm.weight)
    # the zero head still learns: its gradient is the hidden state, not zero
    values.sum().backward()
    assert critic.score.weight.grad.abs().sum() > 0


def test_trained_value_head_is_kept_on_reload(tiny_model_dir, tokenizer, tmp_path):
    input_ids, attention_mask, position_ids = _batch(tokenizer)
    critic = load_value_model(tiny_model_dir)
    with torch.no_grad():
        critic.score.weight.fill_(0.5)
        critic.score.bias.fill_(-1.0)
    critic.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    again = load_value_model(str(tmp_path))
    assert torch.equal(again.score.weight, critic.score.weight)
    expected = critic(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits[..., 0]
    got = again(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits[..., 0]
    assert torch.allclose(got, expected) and not torch.equal(got, torch.zeros_like(got))
