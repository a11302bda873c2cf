"""The language-model head on selected positions only, optionally a chunk of tokens at a time.

RL needs the vocabulary distribution only where a response token is predicted. Projecting
every position on the vocabulary (``tokens x vocab`` logits; 49,152 x 4 bytes per token for
SmolLM2) costs more memory than the whole transformer's activations. Here the model's output
embedding (``lm_head``) is intercepted for one forward: it receives the final hidden states,
keeps the positions asked for and hands them to a function (log-probs, entropy, logits). Doing
it inside the model's forward keeps FSDP2 correct: the head's weight is unsharded there.

``chunked_logprobs_entropy`` projects a chunk of tokens at a time and, when gradients are
needed, wraps each chunk in ``torch.utils.checkpoint`` so that backward recomputes a chunk's
logits instead of keeping all of them: the ``(tokens x vocab)`` logits never exist at once.
The result is exact (the same per-token arithmetic as the unchunked path).
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

# Logit elements of one chunk: 2**25 fp32 = 128 MiB (about 680 tokens of a 49k vocabulary).
LOGITS_CHUNK_ELEMENTS = 1 << 25


def _chunk_stats(
    hidden: torch.Tensor, labels: torch.Tensor, head: Callable, temperature: float, calculate_entropy: bool
) -> torch.Tensor:
    """``(n, 2)`` [log-prob of ``labels``, entropy] (entropy 0 when not asked) of one chunk."""
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    log_z = torch.logsumexp(logits, dim=-1)
    log_prob = logits.gather(-1, labels[:, None]).squeeze(-1) - log_z
    if not calculate_entropy:
        return torch.stack([log_prob, torch.zeros_like(log_prob)], dim=-1)
    entropy = log_z - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)
    return torch.stack([log_prob, entropy], dim=-1)


def chunked_logprobs_entropy(
    hidden: torch.Tensor,
    labels: torch.Tensor,
    head: Callable,
    temperature: float,
    calculate_entropy: bool,
    chunk_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of ``labels`` and entropies under ``softmax(head(hidden) / temperature)``.

    Args:
        hidden: ``(n, hidden_size)`` final hidden states of the positions that predict ``labels``.
        labels: ``(n,)`` int64 token ids.
        head: the output projection (``lm_head``), ``(m, hidden_size) -> (m, vocab)``.
        temperature: > 0; the sampling temperature the log-probs are taken at.
        calculate_entropy: also return the entropies.
        chunk_tokens: tokens projected at once (>= 1). With gradients enabled each chunk runs
            under ``torch.utils.checkpoint``: backward recomputes its logits.

    Returns:
        ``(log_probs, entropy)``, each ``(n,)`` fp32 (``entropy`` None unless asked for), in nats.
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens={chunk_tokens} must be >= 1")
    recompute = torch.is_grad_enabled() and hidden.requires_grad
    parts = []
    for start in range(0, hidden.shape[0], chunk_tokens):
        args = (
            hidden[start : start + chunk_tokens],
            labels[start : start + chunk_tokens],
            head,
            temperature,
            calculate_entropy,
        )
        parts.append(checkpoint(_chunk_stats, *args, use_reentrant=False) if recompute else _chunk_stats(*args))
    stats = torch.cat(parts) if parts else hidden.new_zeros(0, 2, dtype=torch.float32)
    return stats[:, 0], (stats[:, 1] if calculate_entropy else None)


def chunk_tokens_for(module: torch.nn.Module) -> int:
    """Tokens per chunk so that one chunk's fp32 logits hold about :data:`LOGITS_CHUNK_ELEMENTS`."""
    vocab = module.get_output_embeddings().weight.shape[0]
    return max(1, LOGITS_CHUNK_ELEMENTS // vocab)


class HeadOutputError(RuntimeError):
    """The model changed the output of its intercepted head, which the caller cannot undo."""


@contextlib.contextmanager
def output_head_on(module: torch.nn.Module, positions: torch.Tensor, fn: Callable):
    """Within the block, one forward of ``module`` (an HF causal LM) applies its head through
    ``fn`` to the final hidden states at ``positions`` only.

    ``fn``'s result is what the model's forward returns as ``logits``: it must flow out of the
    model so that FSDP2's pre-backward hook (registered on the outputs of the root module)
    all-gathers the head's weight again before backward reaches it.

    Args:
        module: a model with ``get_output_embeddings()`` (the ``lm_head``), possibly FSDP2-sharded.
        positions: ``(n,)`` int64 flat positions into the forward's ``(rows * seqlen)`` tokens.
        fn: ``fn(hidden (1, n, hidden_size), head) -> (1, n, k)`` tensor, a new one (not a view);
            ``head`` is the original projection.

    Yields:
        a dict; after the forward its ``"output"`` is the tensor ``fn`` returned, for
        :func:`unchanged_head_output`.
    """
    head = module.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(module).__name__} has no output embedding (lm_head) to compute log-probs with")
    original = head.forward
    had_own_forward = "forward" in head.__dict__  # e.g. an accelerate hook already replaced it
    box: dict = {}

    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        flat = hidden_states.reshape(-1, hidden_states.shape[-1])
        box["output"] = fn(flat.index_select(0, positions)[None], original)
        return box["output"]

    head.forward = forward
    try:
        yield box
    finally:
        if had_own_forward:
            head.forward = original
        else:
            del head.forward


def unchanged_head_output(module: torch.nn.Module, logits: torch.Tensor, box: dict) -> torch.Tensor:
    """``(n, k)``: the model's returned ``logits`` when they are exactly what the intercepted head
    produced (a model that rescales or soft-caps its logits after the head returns another tensor).

    Raises:
        HeadOutputError: the model post-processed the head's output.
    """
    if logits is not box.get("output"):
        raise HeadOutputError(
            f"{type(module).__name__} transforms its logits after the lm_head (e.g. final_logit_softcapping), "
            "so log-probs cannot be computed a chunk at a time; set entropy_from_logits_with_chunking=false"
        )
    return logits[0]
