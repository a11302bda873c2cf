"""Model FLOPs of a batch and the device's promised peak: the ``perf/mfu/<role>`` metric.

MFU (model FLOPs utilisation, verl's ``perf/mfu/actor`` and ``perf/mfu/critic``) is the useful
FLOPs of an update (:func:`forward_flops` x 3 for forward + backward, valid tokens only: padding
and recomputation not counted) over its wall seconds and the device's promised dense bf16 peak
(:data:`DEVICE_PEAK_TFLOPS`, the numbers of verl's ``FlopsCounter``). Each worker reports its own
shard's MFU; the driver's mean over the workers is verl's ``total / (seconds x peak x world size)``.

There is no promised peak for a CPU, so there is no MFU metric there, nor on a GPU the table does
not know (one note per process); the env var ``HYBRIDRL_DEVICE_PEAK_TFLOPS`` (dense TFLOP/s)
sets the peak for any device, a CPU included.
"""

from __future__ import annotations

import logging
import os

import torch

logger = logging.getLogger(__name__)

PEAK_ENV = "HYBRIDRL_DEVICE_PEAK_TFLOPS"

# Dense bf16 TFLOP/s by a substring of torch.cuda.get_device_name() (verl's table); the longest
# matching name wins ("H200" before "H20", "L40S" before "L40").
DEVICE_PEAK_TFLOPS = {
    "GB200": 2500.0,
    "B200": 2250.0,
    "MI300X": 1336.0,
    "H100": 989.0,
    "H800": 989.0,
    "H200": 989.0,
    "A100": 312.0,
    "A800": 312.0,
    "L40S": 362.05,
    "L40": 181.05,
    "A40": 149.7,
    "L20": 119.5,
    "H20": 148.0,
    "RTX 3070 Ti": 21.75,
}

_NOTED_UNKNOWN: set[str] = set()


def forward_flops(config, attention_mask: torch.Tensor, response_mask: torch.Tensor, lm_head: bool = True) -> float:
    """Useful forward FLOPs of the actor's log-prob forward on a batch (padding not counted).

    Every valid token passes the decoder's matmuls (``2 x`` their parameters); causal attention
    costs ``2 x 2 d`` per (query, key) pair per layer; the LM head (``2 d V``) runs on response
    tokens only, as the actor projects only the positions that predict them.

    Args:
        config: the HF config of a Llama-style model (SmolLM2): ``hidden_size``,
            ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``,
            ``intermediate_size``, ``vocab_size``.
        attention_mask: ``(bs, prompt + response)`` 1 on valid tokens.
        response_mask: ``(bs, response)`` 1 on generated tokens.
        lm_head: count the LM head; False for a value model (its scalar head is negligible).
    """
    d, layers = config.hidden_size, config.num_hidden_layers
    kv = config.num_key_value_heads * (d // config.num_attention_heads)
    per_layer = 2 * d * d + 2 * d * kv + 3 * d * config.intermediate_size
    lengths = attention_mask.sum(-1).double()
    body = 2.0 * layers * per_layer * lengths.sum()
    attention = 2.0 * 2 * d * layers * (lengths * (lengths + 1) / 2).sum()
    head = 2.0 * d * config.vocab_size * response_mask.sum().double() if lm_head else 0.0
    return float(body + attention + head)


def device_peak_flops(device: torch.device | str) -> float | None:
    """The promised dense FLOP/s of ``device``: ``HYBRIDRL_DEVICE_PEAK_TFLOPS`` x 1e12 when set,
    else the table's value for a CUDA device's name; None for a CPU, or a GPU the table does not
    know (noted once per name).

    Raises:
        ValueError: the env var is not a positive number.
    """
    override = os.environ.get(PEAK_ENV, "").strip()
    if override:
        try:
            tflops = float(override)
        except ValueError:
            tflops = -1.0
        if not tflops > 0 or tflops == float("inf"):
            raise ValueError(f"{PEAK_ENV}={override!r} must be a positive number of dense TFLOP/s, e.g. 989")
        return tflops * 1e12
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return peak_flops_of(torch.cuda.get_device_name(device))


def peak_flops_of(device_name: str) -> float | None:
    """The table's FLOP/s for a device name (the longest key it contains), else None and one note."""
    matches = [key for key in DEVICE_PEAK_TFLOPS if key in device_name]
    if matches:
        return DEVICE_PEAK_TFLOPS[max(matches, key=len)] * 1e12
    if device_name not in _NOTED_UNKNOWN:
        _NOTED_UNKNOWN.add(device_name)
        logger.warning(
            "no promised peak FLOP/s known for %r: perf/mfu/* is not reported; set %s (dense TFLOP/s) to report it",
            device_name,
            PEAK_ENV,
        )
    return None


def update_mfu(config, batch, seconds: float, peak_flops: float | None, epochs: int = 1, lm_head: bool = True):
    """MFU of an update over ``batch`` (its ``attention_mask`` and ``response_mask``) run ``epochs``
    times in ``seconds`` on a device of ``peak_flops``: ``3 x forward_flops x epochs / seconds /
    peak``; None without a peak, a config :func:`forward_flops` can read, or a positive time."""
    if peak_flops is None or not seconds > 0:
        return None
    try:
        flops = 3.0 * epochs * forward_flops(config, batch["attention_mask"], batch["response_mask"], lm_head)
    except (AttributeError, TypeError):  # not a Llama-style config
        return None
    return flops / seconds / peak_flops
