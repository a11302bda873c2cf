"""Causal attention over packed rows without a mask: the sequences of every row run through a
varlen kernel that reads their boundaries (``cu_seqlens``) instead of an ``O(row_len**2)``
block-diagonal mask, which would keep SDPA off its flash kernel.

Kernels, best first (:func:`varlen_kernel`): FlashAttention-2's ``flash_attn_varlen_func`` when
``flash_attn`` imports; torch's ``torch.nn.attention.varlen.varlen_attn`` (its signature changed
between torch releases: :func:`torch_varlen_call` adapts to the one installed); one causal SDPA
call per sequence. The first two are CUDA-only and half-precision-only; anything else (fp32,
dropout, no kernel) takes the per-sequence SDPA, which is exact everywhere.

Layout: ``(total, heads, head_dim)`` with ``total = rows * row_len`` (FlashAttention's).
"""

from __future__ import annotations

import functools
import inspect

import torch

FLASH_VARLEN = "flash_attn_varlen"
TORCH_VARLEN = "torch_varlen"
SDPA_PER_SEQUENCE = "sdpa_per_sequence"
_HALF = (torch.float16, torch.bfloat16)


@functools.cache
def flash_attn_varlen():
    """``flash_attn.flash_attn_varlen_func``, or None when ``flash_attn`` does not import."""
    try:
        from flash_attn import flash_attn_varlen_func
    except (ImportError, OSError, RuntimeError):  # not installed, or built for another torch/CUDA
        return None
    return flash_attn_varlen_func


@functools.cache
def torch_varlen():
    """torch's ``varlen_attn`` (torch >= 2.9), or None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def varlen_kernel(device: str | torch.device, dtype: torch.dtype = torch.bfloat16, dropout: float = 0.0) -> str:
    """The kernel :func:`varlen_attention` uses for tensors of ``dtype`` on ``device``: one of
    :data:`FLASH_VARLEN`, :data:`TORCH_VARLEN`, :data:`SDPA_PER_SEQUENCE`."""
    if torch.device(device).type != "cuda" or dtype not in _HALF:
        return SDPA_PER_SEQUENCE
    if flash_attn_varlen() is not None:
        return FLASH_VARLEN
    if torch_varlen() is not None and not dropout:
        return TORCH_VARLEN
    return SDPA_PER_SEQUENCE


def varlen_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    scaling: float | None = None,
    dropout: float = 0.0,
    kernel: str | None = None,
) -> torch.Tensor:
    """Causal attention of every packed sequence with itself only.

    Args:
        query: ``(total, heads, head_dim)``.
        key, value: ``(total, kv_heads, head_dim)``; query head ``h`` reads kv head
            ``h // (heads // kv_heads)`` (as transformers' ``repeat_kv``).
        cu_seqlens: ``(n_seq + 1,)`` int32 boundaries in ``[0, total]``, first 0, last ``total``;
            sequence ``i`` is ``[cu_seqlens[i], cu_seqlens[i + 1])``.
        max_seqlen: the longest sequence.
        scaling: softmax scale; None: ``head_dim ** -0.5``.
        kernel: force one (tests); None: :func:`varlen_kernel`.

    Returns:
        ``(total, heads, head_dim)`` in ``query``'s dtype.
    """
    kernel = kernel or varlen_kernel(query.device, query.dtype, dropout)
    if kernel == FLASH_VARLEN:
        return flash_attn_varlen()(
            query, key, value, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
            dropout_p=dropout, softmax_scale=scaling, causal=True,
        )  # fmt: skip
    if kernel == TORCH_VARLEN:
        out = torch_varlen_call(torch_varlen(), query, key, value, cu_seqlens, max_seqlen, scaling)
        if out is not None:
            return out
    return sdpa_per_sequence(query, key, value, cu_seqlens, scaling, dropout)


def torch_varlen_call(fn, query, key, value, cu_seqlens, max_seqlen: int, scaling: float | None):
    """Causal ``fn(query, key, value, cu_q, cu_k, max_q, max_k, ...)`` (torch's ``varlen_attn``)
    with the keywords its signature has: ``window_size=(-1, 0)`` (torch >= 2.10) or
    ``is_causal=True`` (older) for causality, ``scale`` or a pre-scaled query, ``enable_gqa`` or
    repeated kv heads. Shapes as :func:`varlen_attention`; None when ``fn`` cannot be made causal."""
    params = inspect.signature(fn).parameters
    kwargs: dict[str, object] = {}
    if "window_size" in params:
        kwargs["window_size"] = (-1, 0)
    elif "is_causal" in params:
        kwargs["is_causal"] = True
    else:
        return None
    if scaling is not None and "scale" in params:
        kwargs["scale"] = scaling
    elif scaling is not None:  # the kernel's default scale is head_dim ** -0.5
        query = query * (scaling * query.shape[-1] ** 0.5)
    groups = query.shape[1] // key.shape[1]
    if groups > 1 and "enable_gqa" in params:
        kwargs["enable_gqa"] = True
    elif groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    out = fn(query, key, value, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, **kwargs)
    return out[0] if isinstance(out, tuple) else out


def sdpa_per_sequence(query, key, value, cu_seqlens, scaling: float | None = None, dropout: float = 0.0):
    """One causal ``scaled_dot_product_attention`` call per packed sequence; shapes as
    :func:`varlen_attention`. Exact on every device and dtype."""
    groups = query.shape[1] // key.shape[1]
    outs = []
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end <= start:
            continue
        q, k, v = (t[start:end].transpose(0, 1).unsqueeze(0) for t in (query, key, value))
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=scaling)
        outs.append(o[0].transpose(0, 1))
    return torch.cat(outs) if len(outs) != 1 else outs[0]
