"""Varlen attention of packed rows (issue 31, item 2): the sequence boundaries of packing, the
per-sequence SDPA path against the block-mask SDPA result (GQA, forward and backward), torch's
varlen_attn signature adaptation, override_config.attn_implementation, attention_kernel."""

import pytest
import torch

from hybridrl.errors import is_user_error
from hybridrl.models import attention, loader, varlen
from hybridrl.models.attention import (
    ATTENTION_NAME,
    attention_kernel,
    attention_pinned,
    packed_attention,
    use_hybridrl_attention,
    use_varlen_attention,
    varlen_masks,
)
from hybridrl.models.padding import pack_sequences


def _padded(lengths, width=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.arange(width) >= width - torch.tensor(lengths)[:, None]).long()  # left padded
    ids = torch.randint(3, 90, mask.shape, generator=gen).masked_fill(mask == 0, 2)
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def test_cu_seqlens_follow_the_packing_and_the_filler_is_its_own_sequence():
    ids, mask, pos = _padded([5, 2, 4, 1, 0])
    packed = pack_sequences(ids, mask, pos, max_row_tokens=7)
    rows, row_len = packed.input_ids.shape
    cu = packed.cu_seqlens
    assert cu.dtype == torch.int32 and cu[0] == 0 and cu[-1] == rows * row_len
    lengths = cu.diff()
    assert (lengths > 0).all() and packed.max_seqlen == int(lengths.max())
    bounds = set(cu.tolist())
    assert all(r * row_len in bounds for r in range(rows))  # no sequence crosses a row
    real = 0
    for b, n in enumerate(mask.sum(-1).tolist()):
        if n:  # each sequence is one [start, start + n) span
            first = int(packed.token_index[b][mask[b].bool()][0])
            assert first in bounds and first + n in bounds
            assert not any(first < x < first + n for x in bounds)
            real += 1
    assert real <= len(lengths) <= real + rows  # plus at most one filler tail per row
    inputs = packed.model_inputs(varlen=True)
    assert inputs["cu_seq_lens_q"] is cu and inputs["max_length_k"] == packed.max_seqlen
    assert "cu_seq_lens_q" not in packed.model_inputs()


def _block_mask_sdpa(query, key, value, cu_seqlens):
    """Reference: SDPA with the block-diagonal causal mask over the flattened rows."""
    bs, heads, q_len, dim = query.shape
    seq = torch.zeros(bs * q_len, dtype=torch.long)
    seq[cu_seqlens[1:-1].long()] = 1
    seq = seq.cumsum(0).view(bs, q_len)
    causal = torch.ones(q_len, q_len, dtype=torch.bool).tril()
    mask = (seq[:, :, None] == seq[:, None, :]) & causal
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask[:, None], enable_gqa=True, scale=0.3
    )
    return out.transpose(1, 2)


@pytest.mark.parametrize("kernel", [varlen.SDPA_PER_SEQUENCE, "fake_torch_varlen"])
def test_packed_attention_matches_block_mask_sdpa_with_gqa(kernel, monkeypatch):
    torch.manual_seed(0)
    ids, mask, pos = _padded([5, 2, 4, 3, 1, 6], width=6)
    packed = pack_sequences(ids, mask, pos, max_row_tokens=8)
    rows, row_len = packed.input_ids.shape
    q = torch.randn(rows, 4, row_len, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(rows, 2, row_len, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(rows, 2, row_len, 8, dtype=torch.float64, requires_grad=True)
    if kernel == "fake_torch_varlen":  # an old signature: is_causal, no scale, no enable_gqa

        def old_varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, is_causal=False):
            assert is_causal and key.shape[1] == query.shape[1]
            return varlen.sdpa_per_sequence(query, key, value, cu_seq_q)

        monkeypatch.setattr(varlen, "torch_varlen", lambda: old_varlen_attn)
        kernel = varlen.TORCH_VARLEN
    got = packed_attention(q, k, v, packed.cu_seqlens, packed.max_seqlen, scaling=0.3, kernel=kernel)
    want = _block_mask_sdpa(q, k, v, packed.cu_seqlens)
    torch.testing.assert_close(got, want)
    grads = torch.autograd.grad(got.square().sum(), (q, k, v))
    want_grads = torch.autograd.grad(want.square().sum(), (q, k, v))
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w)


def test_torch_varlen_call_adapts_to_the_signature():
    calls = []

    def new_varlen_attn(
        query, key, value, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1), enable_gqa=False
    ):
        calls.append((window_size, scale, enable_gqa, key.shape[1]))
        return query

    def no_causality(query, key, value, cu_q, cu_k, max_q, max_k):
        return query

    q, kv, cu = torch.randn(6, 4, 8), torch.randn(6, 2, 8), torch.tensor([0, 2, 6], dtype=torch.int32)
    varlen.torch_varlen_call(new_varlen_attn, q, kv, kv, cu, 4, 0.5)
    assert calls == [((-1, 0), 0.5, True, 2)]
    assert varlen.torch_varlen_call(no_causality, q, kv, kv, cu, 4, None) is None


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_varlen_forward_of_a_gqa_model_matches_the_block_mask_forward(arch, monkeypatch):
    """The whole model on CPU with the varlen path forced: same logits as today's packed forward."""
    import transformers

    fields = dict(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }[arch]
    torch.manual_seed(0)
    model = model_cls(config_cls(**fields, attn_implementation="sdpa")).eval()
    ids, mask, pos = _padded([5, 2, 4, 3, 1, 6], width=6, seed=2)
    packed = pack_sequences(ids, mask, pos, max_row_tokens=9)
    with torch.no_grad():
        want = model(**packed.model_inputs(), use_cache=False).logits
    calls = []
    monkeypatch.setattr(attention, "varlen_attention", lambda *a: calls.append(a[4]) or varlen.varlen_attention(*a))
    assert use_hybridrl_attention(model)
    with torch.no_grad(), varlen_masks():
        got = model(**packed.model_inputs(varlen=True), use_cache=False).logits
    assert len(calls) == 2  # one per layer, no mask built
    valid = packed.token_index[mask.bool()]
    torch.testing.assert_close(got.flatten(0, 1)[valid], want.flatten(0, 1)[valid], rtol=1e-5, atol=1e-5)


def test_cpu_models_keep_their_attention_and_the_block_mask(tiny_model_dir):
    model = loader.load_causal_lm(tiny_model_dir)
    assert not attention_pinned(model) and not use_varlen_attention(model)
    assert model.config._attn_implementation == "sdpa"  # no switch on CPU
    assert attention_kernel(model, "cpu", packed=True) == "sdpa"


@pytest.mark.parametrize("name", ["eager", "sdpa"])
def test_override_config_attn_implementation_is_loaded_and_kept(tiny_model_dir, name):
    model = loader.load_causal_lm(tiny_model_dir, override_config={"attn_implementation": name, "rms_norm_eps": 1e-3})
    assert model.config._attn_implementation == name and model.config.rms_norm_eps == 1e-3
    assert attention_pinned(model)
    assert not use_hybridrl_attention(model) and model.config._attn_implementation == name
    assert attention_kernel(model, "cuda", packed=True) == name
    assert attention_pinned(loader.empty_copy(model, "fp32", "cpu"))
    value = loader.load_value_model(tiny_model_dir, override_config={"attn_implementation": name})
    assert value.config._attn_implementation == name and attention_pinned(value)


def test_flash_attention_2_without_flash_attn_is_one_line(tiny_model_dir, monkeypatch):
    monkeypatch.setattr(loader, "flash_attn_varlen", lambda: None)
    with pytest.raises(loader.ModelConfigError) as info:
        loader.load_causal_lm(tiny_model_dir, override_config={"attn_implementation": "flash_attention_2"})
    message = str(info.value)
    assert is_user_error(info.value) and "\n" not in message
    assert message.startswith("override_config.attn_implementation=flash_attention_2: the flash_attn package")
    assert "remove the key" in message and "sdpa" in message


def test_attention_kernel_on_cuda_follows_what_imports(tiny_model_dir, monkeypatch):
    model = loader.load_causal_lm(tiny_model_dir)
    monkeypatch.setattr(varlen, "flash_attn_varlen", lambda: object())
    assert attention_kernel(model, "cuda", packed=True) == "flash_attn_varlen"
    assert attention_kernel(model, "cuda", packed=True, dtype=torch.float32) == "sdpa_per_sequence"
    assert attention_kernel(model, "cuda", packed=False) == "sdpa"
    monkeypatch.setattr(varlen, "flash_attn_varlen", lambda: None)
    monkeypatch.setattr(varlen, "torch_varlen", lambda: object())
    assert attention_kernel(model, "cuda:0", packed=True) == "torch_varlen"
    monkeypatch.setattr(varlen, "torch_varlen", lambda: None)
    assert attention_kernel(model, "cuda", packed=True) == "sdpa_per_sequence"
    assert model.config._attn_implementation == "sdpa"  # reporting switches nothing
    model.set_attn_implementation(attention.register_attention())
    assert attention_kernel(model, "cpu", packed=True) == "sdpa" and ATTENTION_NAME == "hybridrl"
