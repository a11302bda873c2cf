"""hybridrl's attention function for transformers models: SDPA, plus the one-token query that
SDPA's CPU kernel handles slowly, plus Ulysses sequence parallelism.

Registered under :data:`ATTENTION_NAME` with ``transformers.AttentionInterface`` (masks built
as for SDPA) and selected with ``model.set_attn_implementation(register_attention())``. A
one-token query (decoding with a KV cache) is computed with two grouped matmuls and an fp32
softmax: ~2.5x faster than SDPA at 32 rows, 19% of a rollout's decoding time before. Everything
else (prefill, training forwards) goes to transformers' ``sdpa_attention_forward`` unchanged. A
sequence-parallel forward (keyword argument ``ulysses``, :mod:`hybridrl.models.ulysses`) goes to
:func:`~hybridrl.models.ulysses.ulysses_attention`.

Packed rows on CUDA (:func:`use_varlen_attention`) run through a varlen kernel
(:mod:`hybridrl.models.varlen`): the forward passes transformers' varlen keywords
(``cu_seq_lens_q``, ``max_length_q``, ...) and runs inside :func:`varlen_masks`, where the mask
function builds no ``O(row_len**2)`` block-diagonal mask. On CPU packed rows keep SDPA with that
mask: one SDPA call per sequence made the attention ~15% faster there, but the copies around it
made an update 8-13% slower on SmolLM2.

A model loaded with ``model.override_config.attn_implementation`` is pinned to it
(:func:`attention_pinned`): hybridrl never switches it to its own function.
"""

from __future__ import annotations

import contextlib
import threading

import torch

from hybridrl.models.ulysses import ULYSSES_KWARG, SequenceParallelError, heads_problem, hf_model_of, ulysses_attention
from hybridrl.models.varlen import varlen_attention, varlen_kernel

ATTENTION_NAME = "hybridrl"
PINNED_ATTR = "_hybridrl_attention_pinned"  # set on the HF model by the loader (not saved with its config)
_MASKS = threading.local()


def hybridrl_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention in transformers' attention-function signature.

    Args:
        query: ``(bs, heads, q_len, head_dim)``.
        key, value: ``(bs, kv_heads, kv_len, head_dim)``; query head ``h`` reads kv head
            ``h // (heads // kv_heads)`` (as transformers' ``repeat_kv``).
        attention_mask: None, or ``(bs, 1, q_len, >= kv_len)`` bool (True: attend) or additive float.
        kwargs: transformers' (``softcap``, ``sliding_window``, ...); ``ulysses``: a
            :class:`~hybridrl.models.ulysses.UlyssesAttention` for a sequence-parallel forward;
            ``cu_seq_lens_q`` ``(n_seq + 1,)`` int32 boundaries in the flattened ``bs * q_len``
            tokens and ``max_length_q``: with ``attention_mask`` None, causal attention within
            each sequence through a varlen kernel (:func:`~hybridrl.models.varlen.varlen_attention`).

    Returns:
        ``(bs, q_len, heads, head_dim)`` and None (no attention weights), like SDPA's.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if kwargs.get(ULYSSES_KWARG) is not None:
        return ulysses_attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    cu_seqlens = kwargs.get("cu_seq_lens_q")
    if cu_seqlens is not None and attention_mask is None and key.shape[2] == query.shape[2]:
        return packed_attention(query, key, value, cu_seqlens, kwargs.get("max_length_q"), dropout, scaling), None
    if query.shape[2] == 1 and not dropout and kwargs.get("softcap") is None and not kwargs.get("sliding_window"):
        return _one_token_attention(query, key, value, attention_mask, scaling), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


def _one_token_attention(query, key, value, attention_mask, scaling: float | None) -> torch.Tensor:
    bs, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    scale = scaling if scaling is not None else dim**-0.5
    grouped = query.view(bs, kv_heads, heads // kv_heads, dim)
    scores = torch.matmul(grouped, key.transpose(-1, -2)).float() * scale  # (bs, kv_heads, groups, kv_len)
    if attention_mask is not None:
        mask = attention_mask[:, :, -1:, : key.shape[-2]]
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    out = torch.matmul(scores.softmax(dim=-1).to(value.dtype), value)  # (bs, kv_heads, groups, dim)
    return out.reshape(bs, heads, 1, dim).transpose(1, 2)


def packed_attention(query, key, value, cu_seqlens, max_seqlen, dropout=0.0, scaling=None, kernel=None):
    """Causal attention within each packed sequence of ``bs`` rows (no mask).

    Args:
        query: ``(bs, heads, q_len, head_dim)``; key, value: ``(bs, kv_heads, q_len, head_dim)``.
        cu_seqlens: ``(n_seq + 1,)`` int32 boundaries in the flattened ``bs * q_len`` tokens
            (:attr:`~hybridrl.models.padding.PackedBatch.cu_seqlens`).
        max_seqlen: the longest sequence (int or 0-d tensor); None: computed from ``cu_seqlens``.
        kernel: force one of :mod:`hybridrl.models.varlen`'s kernels (tests); None: the device's best.

    Returns:
        ``(bs, q_len, heads, head_dim)``, as SDPA's path returns.
    """
    bs, heads, q_len, dim = query.shape
    if max_seqlen is None:
        max_seqlen = cu_seqlens.diff().max()
    q, k, v = (t.transpose(1, 2).reshape(bs * q_len, t.shape[1], dim) for t in (query, key, value))
    out = varlen_attention(q, k, v, cu_seqlens.to(torch.int32), int(max_seqlen), scaling, dropout, kernel)
    return out.view(bs, q_len, heads, dim)


@contextlib.contextmanager
def varlen_masks(active: bool = True):
    """While active (on this thread), the mask function of :func:`hybridrl_attention` returns
    None where the forward has no 2-D attention mask and no sliding window, instead of the
    block-diagonal mask of packed rows: the forward passes ``cu_seq_lens_q`` instead."""
    previous = getattr(_MASKS, "active", False)
    _MASKS.active = active
    try:
        yield
    finally:
        _MASKS.active = previous


def hybridrl_mask(*args, **kwargs):
    """transformers' ``sdpa_mask``, or None inside :func:`varlen_masks` (see there)."""
    from transformers.masking_utils import sdpa_mask

    if getattr(_MASKS, "active", False) and kwargs.get("attention_mask") is None and kwargs.get("local_size") is None:
        return None
    return sdpa_mask(*args, **kwargs)


def register_attention() -> str:
    """Registers :func:`hybridrl_attention` (masks built as for SDPA, :func:`hybridrl_mask`) and
    returns its name, for ``model.set_attn_implementation(name)``. Idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION_NAME, hybridrl_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, hybridrl_mask)
    return ATTENTION_NAME


def attention_pinned(module: torch.nn.Module) -> bool:
    """Whether the model in ``module`` was loaded with ``override_config.attn_implementation``
    (the loader marks it), so hybridrl keeps that implementation."""
    model = hf_model_of(module)
    return bool(getattr(model if model is not None else module, PINNED_ATTR, False))


def use_hybridrl_attention(module: torch.nn.Module) -> bool:
    """Switches an SDPA model (or a peft/FSDP wrapper of one) to :func:`hybridrl_attention`;
    returns whether the module now uses it. Models on another implementation (eager,
    FlashAttention) or pinned by ``override_config.attn_implementation`` keep theirs. The choice
    is not saved with the model's config."""
    config = getattr(module, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if current == "sdpa" and not attention_pinned(module):
        module.set_attn_implementation(register_attention())
        return True
    return current == ATTENTION_NAME


def use_varlen_attention(module: torch.nn.Module) -> bool:
    """Whether packed forwards of ``module`` should pass their sequence boundaries to a varlen
    kernel (and run inside :func:`varlen_masks`): its parameters are on CUDA and it uses (or, as an
    SDPA model not pinned, is switched to) :func:`hybridrl_attention`. On CPU: False, no switch."""
    param = next(module.parameters(), None)
    if param is None or param.device.type != "cuda":
        return False
    return use_hybridrl_attention(module)


def attention_kernel(module: torch.nn.Module, device: str, packed: bool, dtype: torch.dtype = torch.bfloat16) -> str:
    """The attention kernel forwards of ``module`` use, for benchmarks' reports.

    Args:
        module: a transformers model, or a peft/FSDP wrapper of one.
        device: where the forward runs ("cpu", "cuda", "cuda:1", ...).
        packed: packed rows (``use_remove_padding``) or the padded batch.
        dtype: the forward's compute dtype (varlen kernels need fp16/bf16).

    Returns:
        ``"flash_attn_varlen"``, ``"torch_varlen"`` or ``"sdpa_per_sequence"`` (packed rows on
        CUDA with hybridrl's attention), ``"sdpa"`` (hybridrl's attention otherwise), or the
        model's own implementation (``"eager"``, ``"sdpa"``, ``"flash_attention_2"``, ...).
    """
    model = hf_model_of(module)
    model = model if model is not None else module
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None) or "eager"
    cuda = torch.device(device).type == "cuda"
    if impl == "sdpa" and cuda and packed and not attention_pinned(model):
        impl = ATTENTION_NAME  # model_forward switches it (use_varlen_attention)
    if impl != ATTENTION_NAME:
        return impl
    return varlen_kernel(device, dtype) if cuda and packed else "sdpa"


def use_ulysses_attention(module: torch.nn.Module, size: int, key: str) -> None:
    """Makes the model inside ``module`` split its attention in sequence-parallel forwards: it
    switches to :func:`hybridrl_attention`, which runs
    :func:`~hybridrl.models.ulysses.ulysses_attention` when a forward passes its keyword argument. Idempotent.

    Args:
        module: a transformers model, or a peft/FSDP wrapper of one.
        size: the SP group's size (> 1).
        key: the config key of ``size``, for messages.

    Raises:
        SequenceParallelError: the model does not route its attention through transformers'
            attention interface (``_supports_attention_backend``), or ``size`` cannot split its heads.
    """
    model = hf_model_of(module)
    name = type(model if model is not None else module).__name__
    if model is None or not getattr(type(model), "_supports_attention_backend", False):
        raise SequenceParallelError(
            f"{key}={size}: {name} does not use transformers' attention interface, so its "
            f"attention cannot be split over a sequence-parallel group; set {key}=1"
        )
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    problem = heads_problem(
        getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None), size
    )
    if problem:
        raise SequenceParallelError(f"{key}={size}: {problem} ({name}); pick a size that does")
    if model.config._attn_implementation != ATTENTION_NAME:
        model.set_attn_implementation(register_attention())
