"""One forward pass of the actor, reference or critic over a micro batch of responses.

The padded path runs the model on the ``(bs, prompt + response)`` batch as the rollout made
it; the packed path (``model.use_remove_padding``) first removes the padding
(:mod:`hybridrl.models.padding`). Both read the model's output only where a response token is
predicted (position ``t - 1`` for the token at ``t``). The padded path reads every response
slot, padding included (as verl does); the packed path only the response tokens that exist
(``attention_mask == 1``) and leaves 0 in the other slots. Losses mask those slots
(``response_mask``), so the loss code downstream is the same for both paths. On CUDA the packed
rows' sequence boundaries go to a varlen attention kernel instead of a block-diagonal mask
(:func:`hybridrl.models.attention.use_varlen_attention`); on CPU the mask stays.

With sequence parallelism (``ForwardOptions.sequence_parallel``, packed path only) each rank of
the SP group runs the model on its slice of every packed row (:mod:`hybridrl.models.ulysses`),
computes the outputs of the response positions it holds, and the outputs are all-gathered, so
every rank of the group returns the whole micro batch's results.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

from hybridrl.algorithms.errors import AlgorithmInputError
from hybridrl.algorithms.functional import entropy_from_logits, entropy_rows, logprobs_from_logits, rowwise
from hybridrl.models.attention import use_varlen_attention
from hybridrl.models.loader import to_torch_dtype
from hybridrl.models.output_head import (
    chunk_tokens_for,
    chunked_logprobs_entropy,
    output_head_on,
    unchanged_head_output,
)
from hybridrl.models.padding import pack_sequences
from hybridrl.models.ulysses import (
    ULYSSES_KWARG,
    UlyssesAttention,
    UlyssesGroup,
    gather_outputs,
    packed_causal_mask,
    split_packed,
)
from hybridrl.protocol import DataProto


@dataclass(frozen=True)
class ForwardOptions:
    """How a micro batch runs through the model.

    Attributes:
        use_remove_padding: pack the valid tokens (``model.use_remove_padding``).
        logits_chunking: project a chunk of tokens on the vocabulary at a time, recomputing in
            backward (``entropy_from_logits_with_chunking``); memory only, same results.
        entropy_checkpointing: without chunking, recompute the entropy's softmax in backward
            instead of keeping it (``entropy_checkpointing``).
        max_row_tokens: capacity of a packed row; None: the micro batch's longest sequence.
        sequence_parallel: this rank's Ulysses SP group (``ulysses_sequence_parallel_size`` > 1,
            packed path only); None: whole rows on every rank.
        use_torch_compile: on CUDA, the log-prob and entropy of the logits run as
            ``torch.compile(dynamic=True)`` functions (verl's ``use_torch_compile``; the model
            itself stays eager); eager on the CPU (:func:`logit_stat_fns`).

    Raises:
        ValueError: ``sequence_parallel`` without ``use_remove_padding``.
    """

    use_remove_padding: bool = False
    logits_chunking: bool = False
    entropy_checkpointing: bool = False
    max_row_tokens: int | None = None
    sequence_parallel: UlyssesGroup | None = None
    use_torch_compile: bool = False

    def __post_init__(self):
        if self.sequence_parallel is not None and not self.use_remove_padding:
            raise ValueError("sequence parallelism splits packed rows: it needs use_remove_padding")


@dataclass
class ResponseOutput:
    """Per-response-token results of a forward, ``(bs, response_length)`` fp32, 0 where ``slots`` is False.

    ``logits`` (only when asked for) are fp32 / temperature, ``(..., vocab)`` over the ``slots``
    in row-major order: ``(bs, response_length, vocab)`` padded, ``(n_slots, vocab)`` packed.
    """

    log_probs: torch.Tensor
    entropy: torch.Tensor | None
    logits: torch.Tensor | None
    slots: torch.Tensor


def response_layout(batch, options: ForwardOptions, varlen: bool = False) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Model inputs and where to read the predictions of the response tokens.

    Args:
        batch: TensorDict with ``input_ids``, ``attention_mask``, ``position_ids`` ``(bs, seqlen)``
            and ``responses`` ``(bs, response_length)`` (the last columns of ``input_ids``).
        varlen: packed inputs also carry the sequence boundaries (``cu_seq_lens_q``, ...).

    Returns:
        ``(model_inputs, positions, slots)``: keyword arguments of the model's forward;
        ``positions`` ``(n,)`` flat positions in the forward's ``(rows * row_len)`` tokens whose
        outputs predict the ``n`` response tokens marked in ``slots`` ``(bs, response_length)``
        bool (row-major order).
    """
    attention_mask = batch["attention_mask"]
    bs, seqlen = attention_mask.shape
    response_length = batch["responses"].shape[-1]
    if options.use_remove_padding:
        rank = attention_mask.long().cumsum(dim=-1)[:, -response_length:] - 1
        # Response tokens with a predecessor in their own sequence (all, unless the prompt is empty).
        slots = attention_mask[:, -response_length:].bool() & (rank >= 1)
        sp = options.sequence_parallel
        packed = pack_sequences(
            batch["input_ids"],
            attention_mask,
            batch["position_ids"],
            options.max_row_tokens,
            row_multiple=sp.size if sp is not None else 1,
        )
        positions = packed.token_index[:, -response_length:][slots] - 1  # the previous token of the sequence
        return packed.model_inputs(varlen=varlen), positions, slots
    columns = torch.arange(seqlen - response_length - 1, seqlen - 1, device=attention_mask.device)
    positions = (torch.arange(bs, device=attention_mask.device)[:, None] * seqlen + columns).flatten()
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask", "position_ids")}
    return inputs, positions, torch.ones(bs, response_length, dtype=torch.bool, device=attention_mask.device)


def scatter_slots(values: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Values of the ``slots`` (``n`` of them, in row-major order, any shape) into a
    ``slots``-shaped tensor, 0 elsewhere. Differentiable."""
    return values.new_zeros(slots.shape).masked_scatter(slots, values.reshape(-1))


def compute_dtype_of(fsdp_config) -> torch.dtype:
    """The forward's compute dtype: ``mixed_precision.param_dtype`` of a role's ``fsdp_config``."""
    return to_torch_dtype(fsdp_config.mixed_precision.param_dtype)


def autocast(module: torch.nn.Module, compute_dtype: torch.dtype, device: torch.device | str | None = None):
    """Mixed precision for forward passes: fp32 master weights, matmuls in ``compute_dtype``.

    ``fsdp_config.mixed_precision.param_dtype=bf16`` turns it on; bf16 matmuls are several
    times faster on GPUs and on CPUs with AMX. With fp32 it is a no-op.

    ``device``: where the forward computes (the worker's device; callers pass their inputs'
    device). Parameters offloaded to the CPU (``param_offload``) live there between forwards,
    so the first parameter's device, used only when ``device`` is None, would switch CUDA
    autocast off.
    """
    device_type = torch.device(device).type if device is not None else next(module.parameters()).device.type
    return torch.autocast(device_type, dtype=compute_dtype, enabled=compute_dtype != torch.float32)


def forward_response(
    module,
    micro_batch: DataProto,
    temperature: float,
    compute_dtype: torch.dtype,
    options: ForwardOptions,
    calculate_entropy: bool = False,
    return_logits: bool = False,
    entropy_grad: bool = True,
) -> ResponseOutput:
    """Log-probs (and entropies, logits) of ``micro_batch.batch["responses"]`` under a causal LM.

    Args:
        module: an HF causal LM (plain or FSDP2-sharded).
        micro_batch: ``responses``, ``input_ids``, ``attention_mask``, ``position_ids``.
        temperature: > 0; logits are divided by it.
        compute_dtype: autocast dtype of the forward (fp32: none).
        options: padded or packed, chunked or not.
        calculate_entropy: also the entropies (nats).
        entropy_grad: False: the entropies are only a metric, computed without a graph (the
            chunked path recomputes them in backward anyway, so it ignores this).
        return_logits: also the ``(n, vocab)`` fp32 logits (e.g. for the exact KL); no chunking then.

    Returns:
        ResponseOutput with gradients attached when grad mode is on.
    """
    batch = micro_batch.batch
    varlen = _varlen(module, options)
    inputs, positions, slots = response_layout(batch, options, varlen)
    labels = batch["responses"][slots]
    part = _SequenceSlice(inputs, positions, options.sequence_parallel) if options.sequence_parallel else None
    if part is not None:  # this rank's slice of the rows, and the response positions in it
        inputs, positions, labels = part.inputs, part.positions, labels[part.mine]
    chunk = chunk_tokens_for(module) if options.logits_chunking and not return_logits else None

    def chunked_head(hidden: torch.Tensor, head) -> torch.Tensor:
        log_probs, entropy = chunked_logprobs_entropy(hidden[0], labels, head, temperature, calculate_entropy, chunk)
        entropy = entropy if entropy is not None else torch.zeros_like(log_probs)
        return torch.stack([log_probs[None], entropy[None]], dim=-1)  # (1, n, 2), a new tensor

    with autocast(module, compute_dtype, labels.device):
        if chunk is not None:
            with output_head_on(module, positions, chunked_head) as box:
                stats = unchanged_head_output(module, module(**inputs, use_cache=False).logits, box)
            log_probs, entropy, logits = stats[:, 0], (stats[:, 1] if calculate_entropy else None), None
        elif options.use_remove_padding:  # the head on the response positions only: (1, n, vocab)
            with output_head_on(module, positions, lambda hidden, head: head(hidden)):
                logits = module(**inputs, use_cache=False).logits[0]
            log_probs, entropy, logits = _stats_from_logits(
                logits, labels, temperature, calculate_entropy, options, entropy_grad
            )
        else:  # padded: the model's own head on the last response_length + 1 positions only
            response_length = batch["responses"].shape[-1]
            logits = module(**inputs, use_cache=False, logits_to_keep=response_length + 1).logits[:, :-1]
            log_probs, entropy, logits = _stats_from_logits(
                logits, batch["responses"], temperature, calculate_entropy, options, entropy_grad
            )
    if part is not None:
        log_probs, entropy, logits = part.gather(module, log_probs, entropy, logits if return_logits else None)
    return ResponseOutput(
        log_probs=scatter_slots(log_probs, slots),
        entropy=scatter_slots(entropy, slots) if entropy is not None else None,
        logits=logits if return_logits else None,
        slots=slots,
    )


def _varlen(module, options: ForwardOptions) -> bool:
    """Packed rows (no sequence parallelism) of a model on CUDA: varlen attention, no mask."""
    return options.use_remove_padding and options.sequence_parallel is None and use_varlen_attention(module)


def logit_stat_fns(use_torch_compile: bool, device: torch.device | str) -> tuple[Callable, Callable]:
    """``(logprobs_from_logits, entropy_from_logits)`` as the forward of logits on ``device`` runs
    them: compiled (``torch.compile(dynamic=True)``, as verl's actor does, built once per process)
    with ``use_torch_compile`` on a CUDA device, else the eager functions (the CPU: compiling
    there is slower to start than it saves)."""
    if use_torch_compile and torch.device(device).type == "cuda":
        return _compiled_logit_stat_fns()
    return logprobs_from_logits, entropy_from_logits


@functools.cache
def _compiled_logit_stat_fns() -> tuple[Callable, Callable]:
    """The functions of :mod:`hybridrl.algorithms.functional` with their per-chunk kernels compiled:
    the python walk over row chunks stays eager (compiled whole, its loop would specialise on
    every micro batch's token count and recompile), each ``(rows, vocab)`` chunk runs one
    compiled graph (``dynamic=True``: every chunk size, every vocabulary)."""
    compiled_logsumexp_rows = torch.compile(_logsumexp_rows, dynamic=True)
    compiled_entropy_rows = torch.compile(entropy_rows, dynamic=True)

    def compiled_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if logits.shape[:-1] != labels.shape:  # as logprobs_from_logits
            raise AlgorithmInputError(
                f"logprobs_from_logits: labels shape {tuple(labels.shape)} must equal logits shape "
                f"without the vocab dimension {tuple(logits.shape[:-1])}"
            )
        picked = logits.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1).float()
        return picked - rowwise(logits, compiled_logsumexp_rows)

    def compiled_entropy(logits: torch.Tensor) -> torch.Tensor:
        return rowwise(logits, compiled_entropy_rows)

    return compiled_logprobs, compiled_entropy


def _logsumexp_rows(z: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp(z, dim=-1)


def _stats_from_logits(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    calculate_entropy: bool,
    options: ForwardOptions,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """``(log_probs, entropy or None, fp32 logits / temperature)`` of ``(..., vocab)`` logits and
    ``(...)`` labels; a 3-D view is not copied into 2-D (the helpers walk it in row chunks)."""
    logprobs_fn, entropy_fn = logit_stat_fns(options.use_torch_compile, logits.device)
    logits = logits.float()
    logits = logits / temperature if temperature != 1.0 else logits
    entropy = None
    if calculate_entropy and not entropy_grad:
        with torch.no_grad():
            entropy = entropy_fn(logits.detach())
    elif calculate_entropy:
        recompute = options.entropy_checkpointing and torch.is_grad_enabled() and logits.requires_grad
        entropy = checkpoint(entropy_fn, logits, use_reentrant=False) if recompute else entropy_fn(logits)
    return logprobs_fn(logits, labels), entropy, logits


def forward_response_values(
    module, micro_batch: DataProto, compute_dtype: torch.dtype, options: ForwardOptions
) -> torch.Tensor:
    """Values of the states before each response token, ``(bs, response_length)`` fp32, 0 where
    there is no response token.

    The critic is a causal-LM backbone with a scalar head (``num_labels=1``): position ``t``
    scores the prefix up to ``t``, so the value for response token ``i`` is read at the position
    that precedes it, as verl does.
    """
    inputs, positions, slots = response_layout(micro_batch.batch, options)
    part = _SequenceSlice(inputs, positions, options.sequence_parallel) if options.sequence_parallel else None
    if part is not None:
        inputs, positions = part.inputs, part.positions
    with autocast(module, compute_dtype, positions.device):
        logits = module(**inputs, use_cache=False).logits
    values = logits.reshape(-1, logits.shape[-1]).index_select(0, positions)[:, 0].float()
    if part is not None:
        (values,) = part.gather(module, values)
    return scatter_slots(values, slots)


class _SequenceSlice:
    """This rank's share of a sequence-parallel forward of packed rows.

    ``inputs``: the model's keyword arguments for the ``(rows, row_len / S)`` slice, with the SP
    group and the whole rows' mask for the attention (:data:`ULYSSES_KWARG`); ``positions``: the
    flat positions into the slice of the response predictions it holds; ``mine``: ``(n,)`` which
    of the micro batch's ``n`` predictions those are.
    """

    def __init__(self, inputs: dict, positions: torch.Tensor, sp: UlyssesGroup) -> None:
        input_ids, position_ids, self.positions, self.owner = split_packed(
            inputs["input_ids"], inputs["position_ids"], positions, sp.rank, sp.size
        )
        self.mine = self.owner == sp.rank
        self.sp = sp
        self.attention = UlyssesAttention(sp, packed_causal_mask(inputs["position_ids"]))
        self.inputs = {
            "input_ids": input_ids,
            "position_ids": position_ids,
            "attention_mask": None,
            ULYSSES_KWARG: self.attention,
        }

    def gather(self, module, *values: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        """``(n_local, ...)`` outputs of this rank -> ``(n, ...)`` on every rank (None stays None).

        Raises:
            SequenceParallelError: the forward never went through the Ulysses attention.
        """
        self.attention.check_called(type(module).__name__)
        return tuple(None if v is None else gather_outputs(v, self.owner, self.sp) for v in values)
