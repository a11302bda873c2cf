"""The ``model_step`` phase of benchmarks/gpu_check.py: the plain HF model's forward and backward on
a micro batch of the train phase's size, without hybridrl around it, and a micro batch's fixed cost.

It splits the update's MFU gap (docs/gpu.md: 11.7% of the H100's peak against a 35% target):
what the model's own kernels reach (``model_step_mfu``: fp32 weights under bf16 autocast, as the
actor trains; ``model_step_bf16_mfu``: bf16 weights, no autocast) and the fixed cost of one micro
batch, which does not shrink with its tokens (``framework_floor_ms``: the same layers on 2 tokens a
row: Python, kernel launches, the weights' bf16 casts and the gradients' writes). If the plain
model is far above the update, the loss is in hybridrl's path; if it is near it, in the model's
eager kernels or the launches.
"""

from __future__ import annotations

import statistics
import time

import torch

from hybridrl.models.flops import forward_flops


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _step_seconds(model, rows: int, length: int, response: int, autocast: bool, device: str, reps: int) -> float:
    """Median seconds of a forward and backward: the LM head on the last ``response`` positions
    of each row (as the actor projects only them), a logsumexp loss in fp32."""
    ids = torch.randint(0, model.config.vocab_size, (rows, length), device=device)

    def step() -> None:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
            logits = model.lm_head(hidden[:, -response:])
            loss = torch.logsumexp(logits.float(), dim=-1).mean()
        loss.backward()
        model.zero_grad(set_to_none=True)

    step()  # warm-up: kernels chosen, allocator filled
    times = []
    for _ in range(reps):
        _synchronize(device)
        start = time.perf_counter()
        step()
        _synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def phase_model_step(device: str, quick: bool, folder: str, peak_flops: float | None) -> dict:
    """Tokens/s and MFU of the plain model's step on ``rows`` x ``length`` tokens, and the floor.

    Args:
        folder: the random-init HF folder (gpu_check's ``build_model``).
        peak_flops: the measured bf16 matmul peak (FLOP/s), for the MFU; None: no MFU.
    """
    from transformers import AutoModelForCausalLM

    rows, length, response = (2, 48, 16) if quick else (8, 576, 512)  # the train phase's micro batch
    reps = 2 if quick else 5
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa").to(device)
    model.train()
    mask = torch.ones(rows, length)
    flops = 3 * forward_flops(model.config, mask, torch.ones(rows, response))
    out: dict = {"rows": rows, "row_tokens": length, "response_tokens": response}
    for label, autocast in (("model_step", True), ("model_step_bf16", False)):
        if not autocast:
            model.to(torch.bfloat16)
        seconds = _step_seconds(model, rows, length, response, autocast, device, reps)
        out[f"{label}_s"] = round(seconds, 4)
        out[f"{label}_tokens_per_s"] = round(rows * length / seconds, 1)
        out[f"{label}_mfu"] = round(flops / seconds / peak_flops, 4) if peak_flops else None
    model.to(torch.float32)
    floor = _step_seconds(model, rows, 2, 1, True, device, reps)  # the same layers, almost no arithmetic
    out["framework_floor_ms"] = round(floor * 1e3, 1)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return out
