"""Step metrics for the PPO/GRPO driver, with verl's metric names.

Pure torch/numpy: the driver calls these on a `DataProto` (`batch.batch[key]` tensors,
`batch.meta_info` dict) after the update stages. Nothing here touches a device or a logger.
verl's validation metrics (`bootstrap_metric`, `calc_maj_val`, `process_validation_metrics`)
are re-exported from :mod:`hybridrl.trainer.ppo.validation_metrics`, so this module answers for
verl's `verl.trainer.ppo.metric_utils`; the stage timer and the reductions of per-worker values
(verl's `verl.utils.metric`) are in :mod:`hybridrl.trainer.run.metrics`.
"""

from __future__ import annotations

import numbers
from typing import Mapping

import numpy as np
import torch

from hybridrl.trainer.ppo.validation_metrics import (  # noqa: F401  (verl's metric_utils names)
    ValidationMetricsError,
    bootstrap_metric,
    calc_maj_val,
    process_validation_metrics,
)

# Stages whose per-token time is measured against all tokens (prompt + response);
# generation is measured against response tokens only.
_ALL_TOKEN_STAGES = ("ref", "teacher", "values", "adv", "update_critic", "update_actor", "old_log_prob")


class MetricsInputError(ValueError):
    """A batch handed to a metrics function lacks a key or has inconsistent shapes."""


def _get(batch, key: str, fn: str) -> torch.Tensor:
    tensors = batch.batch
    keys = list(tensors.keys()) if tensors is not None else []
    if key not in keys:
        raise MetricsInputError(
            f"{fn}: batch has no tensor {key!r} (has {sorted(keys)}); "
            f"run the stage that produces {key!r} before computing metrics"
        )
    return tensors[key]


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    """mean/max/min of a 1-D tensor; NaN when empty (e.g. every response masked out)."""
    values = values.detach().float()
    if values.numel() == 0:
        nan = float("nan")
        return {f"{prefix}/mean": nan, f"{prefix}/max": nan, f"{prefix}/min": nan}
    return {
        f"{prefix}/mean": values.mean().item(),
        f"{prefix}/max": values.max().item(),
        f"{prefix}/min": values.min().item(),
    }


def _lengths(batch, fn: str) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Per-sample prompt and response lengths (float, (bs,)) and their padded maxima.

    Lengths count attention-mask tokens, so tool/observation tokens of multi-turn rollouts
    count towards the response length (as in verl): that is what hits the length limit.
    """
    responses = _get(batch, "responses", fn)
    attention_mask = _get(batch, "attention_mask", fn)
    max_response_length = responses.shape[-1]
    if attention_mask.shape[-1] < max_response_length:
        raise MetricsInputError(
            f"{fn}: 'attention_mask' has {attention_mask.shape[-1]} columns but 'responses' has "
            f"{max_response_length}; attention_mask must cover prompt + response (bs, P+R)"
        )
    max_prompt_length = attention_mask.shape[-1] - max_response_length
    prompt_length = attention_mask[:, :max_prompt_length].detach().float().sum(-1)
    response_length = attention_mask[:, max_prompt_length:].detach().float().sum(-1)
    return prompt_length, response_length, max_prompt_length, max_response_length


def compute_data_metrics(batch, use_critic: bool = True) -> dict[str, float]:
    """Reward, advantage, value and length statistics of one training batch (verl's names).

    Batch tensors (bs = batch size, P = prompt length, R = response length, padded):
        responses (bs, R), attention_mask (bs, P+R), response_mask (bs, R) (1 = token trained on),
        token_level_scores (bs, R), token_level_rewards (bs, R), advantages (bs, R),
        returns (bs, R), and values (bs, R) when `use_critic`.

    Returns (all Python floats):
        critic/score/{mean,max,min}: per-sequence sum of token_level_scores.
        critic/rewards/{mean,max,min}: per-sequence sum of token_level_rewards (score - KL).
        critic/advantages/{mean,max,min}, critic/returns/{mean,max,min}: over response_mask tokens.
        critic/values/{mean,max,min}, critic/vf_explained_var (use_critic only):
            1 - Var(returns - values) / (Var(returns) + 1e-5) over response_mask tokens,
            unbiased variance (as verl). NaN with fewer than two valid tokens.
        response_length/{mean,max,min,clip_ratio}, prompt_length/{mean,max,min,clip_ratio}:
            token counts from attention_mask; clip_ratio = fraction of samples whose length
            equals the padded maximum (R resp. P, or ``meta_info["max_prompt_length"]`` when
            set), i.e. that were cut off.

    Raises:
        MetricsInputError: a required tensor is missing (incl. 'values' with use_critic=True)
            or attention_mask is narrower than responses.
    """
    fn = "compute_data_metrics"
    if use_critic and (batch.batch is None or "values" not in batch.batch.keys()):
        raise MetricsInputError(
            f"{fn}: batch has no tensor 'values' but use_critic=True; pass use_critic=False when the run has no critic"
        )
    response_mask = _get(batch, "response_mask", fn).bool()
    prompt_length, response_length, max_prompt, max_response = _lengths(batch, fn)

    metrics: dict[str, float] = {}
    metrics.update(_stats("critic/score", _get(batch, "token_level_scores", fn).sum(-1)))
    metrics.update(_stats("critic/rewards", _get(batch, "token_level_rewards", fn).sum(-1)))
    valid_adv = torch.masked_select(_get(batch, "advantages", fn), response_mask)
    valid_returns = torch.masked_select(_get(batch, "returns", fn), response_mask).float()
    metrics.update(_stats("critic/advantages", valid_adv))
    metrics.update(_stats("critic/returns", valid_returns))

    if use_critic:
        valid_values = torch.masked_select(_get(batch, "values", fn), response_mask).float()
        metrics.update(_stats("critic/values", valid_values))
        if valid_returns.numel() < 2:
            metrics["critic/vf_explained_var"] = float("nan")
        else:
            diff_var = torch.var(valid_returns - valid_values)
            metrics["critic/vf_explained_var"] = (1.0 - diff_var / (torch.var(valid_returns) + 1e-5)).item()

    metrics.update(_stats("response_length", response_length))
    metrics["response_length/clip_ratio"] = _clip_ratio(response_length, max_response)
    metrics.update(_stats("prompt_length", prompt_length))
    # The driver trims all-padding prompt columns, so the width may be below the configured limit.
    max_prompt = _meta_info(batch).get("max_prompt_length", max_prompt)
    metrics["prompt_length/clip_ratio"] = _clip_ratio(prompt_length, max_prompt)
    metrics.update(compute_agent_metrics(batch))
    return metrics


def compute_agent_metrics(batch) -> dict[str, float]:
    """Turn, tool and search statistics of multi-turn agent rollouts (``hybridrl.agents``).

    Reads the non-tensors the AgentLoopManager writes: ``__num_turns__`` (verl's count:
    prompt + assistant + observation turns), ``__agent_name__`` and ``__agent_metrics__``
    (per-row dicts of counters), and ``token_level_scores`` (bs, R) when present.

    Returns (empty without agent rollouts):
        num_turns/{mean,max,min}; tool_calls/{mean,max} (tool calls or searches per trajectory);
        tool_errors/sum; for ``search_agent`` rows search/valid_rate (turns with a well-formed
        ``<search>``/``<answer>`` per model turn, Search-R1's valid-action rate),
        search/searches/mean; search/errors (failed or timed-out retrievals in the batch, of the
        search agent and of the ``search`` tool);
        agent/<name>/reward/mean and agent/<name>/count per agent loop.
    """
    nt = batch.non_tensor_batch
    if "__num_turns__" not in nt:
        return {}
    turns = np.asarray(nt["__num_turns__"], dtype=np.float64)
    per_row = list(nt.get("__agent_metrics__", [{}] * len(turns)))
    names = [str(n) for n in nt.get("__agent_name__", ["agent"] * len(turns))]
    tool_calls = np.array([m.get("tool_calls", 0) for m in per_row], dtype=np.float64)
    metrics = {
        "num_turns/mean": float(turns.mean()),
        "num_turns/max": float(turns.max()),
        "num_turns/min": float(turns.min()),
        "tool_calls/mean": float(tool_calls.mean()),
        "tool_calls/max": float(tool_calls.max()),
        "tool_errors/sum": float(sum(m.get("tool_errors", 0) for m in per_row)),
    }
    search = [m for m, name in zip(per_row, names) if name == "search_agent"]
    if search:
        model_turns = sum(m.get("assistant_turns", 0) for m in search)
        metrics["search/valid_rate"] = sum(m.get("valid_actions", 0) for m in search) / max(model_turns, 1)
        metrics["search/searches/mean"] = float(np.mean([m.get("searches", 0) for m in search]))
    if any("search_errors" in m for m in per_row):  # search_agent rows and the search tool
        metrics["search/errors"] = float(sum(m.get("search_errors", 0) for m in per_row))
    tensors = batch.batch
    if tensors is not None and "token_level_scores" in tensors.keys():
        scores = tensors["token_level_scores"].detach().float().sum(-1).cpu().numpy()
        for name in sorted(set(names)):
            rows = np.array([n == name for n in names])
            metrics[f"agent/{name}/reward/mean"] = float(scores[rows].mean())
            metrics[f"agent/{name}/count"] = float(rows.sum())
    return metrics


def _meta_info(batch) -> Mapping:
    """``batch.meta_info`` when it is a mapping, else {} (no meta_info, or a test double's)."""
    meta = getattr(batch, "meta_info", None)
    return meta if isinstance(meta, Mapping) else {}


def _clip_ratio(lengths: torch.Tensor, max_length: int) -> float:
    if lengths.numel() == 0:
        return float("nan")
    return torch.eq(lengths, max_length).float().mean().item()


def _token_counts(batch, fn: str) -> tuple[float, float]:
    """(response tokens, all tokens) of the batch, from attention_mask."""
    prompt_length, response_length, _, _ = _lengths(batch, fn)
    num_response = response_length.sum().item()
    return num_response, prompt_length.sum().item() + num_response


def compute_timing_metrics(batch, timing_raw: dict[str, float]) -> dict[str, float]:
    """Stage timings of one step: seconds and milliseconds per token.

    Args:
        batch: DataProto with `responses` (bs, R) and `attention_mask` (bs, P+R).
        timing_raw: stage name -> seconds, as filled by `marked_timer`.

    Returns:
        `timing_s/<name>` (seconds) for every entry of timing_raw, and
        `timing_per_token_ms/<name>` (ms per token) for `gen` (per response token) and for
        ref, values, adv, update_critic, update_actor, old_log_prob (per prompt+response token),
        when those stages were timed. A batch with zero tokens gives no per-token entries.

    Raises:
        MetricsInputError: `responses` or `attention_mask` is missing.
    """
    metrics = {f"timing_s/{name}": float(seconds) for name, seconds in timing_raw.items()}
    num_response, num_all = _token_counts(batch, "compute_timing_metrics")
    tokens_of_stage = {"gen": num_response, **{s: num_all for s in _ALL_TOKEN_STAGES}}
    for name, num_tokens in tokens_of_stage.items():
        if name in timing_raw and num_tokens > 0:
            metrics[f"timing_per_token_ms/{name}"] = timing_raw[name] * 1000.0 / num_tokens
    return metrics


def compute_throughput_metrics(batch, timing_raw: dict[str, float], n_devices: int) -> dict[str, float]:
    """Tokens processed per second per device over the whole step.

    Args:
        batch: DataProto; the token count is `sum(batch.meta_info["global_token_num"])` when the
            rollout recorded it (verl's convention), else the sum of `attention_mask` (bs, P+R).
        timing_raw: must hold "step", the seconds of the whole step.
        n_devices: number of accelerators (or CPU processes) that worked on the step, >= 1.

    Returns:
        perf/total_num_tokens (tokens), perf/time_per_step (s),
        perf/throughput (tokens / s / device).

    Raises:
        MetricsInputError: timing_raw has no "step", or n_devices < 1.
    """
    return _throughput(batch, timing_raw, n_devices, "compute_throughput_metrics", "n_devices")


def _throughput(batch, timing_raw: dict[str, float], n_devices: int, fn: str, arg: str) -> dict[str, float]:
    """:func:`compute_throughput_metrics`; errors name the function ``fn`` called and its argument ``arg``."""
    if "step" not in timing_raw:
        raise MetricsInputError(
            f"{fn}: timing_raw has no 'step' entry (has {sorted(timing_raw)}); "
            "wrap the whole step in marked_timer('step', timing_raw)"
        )
    if isinstance(n_devices, bool) or not isinstance(n_devices, numbers.Real) or n_devices < 1:
        raise MetricsInputError(f"{fn}: {arg}={n_devices!r}; give the number of devices that worked on the step, >= 1")
    token_nums = _meta_info(batch).get("global_token_num")
    if token_nums is not None:
        total_tokens = float(np.sum(token_nums))
    else:
        total_tokens = _token_counts(batch, fn)[1]
    time_per_step = float(timing_raw["step"])
    throughput = total_tokens / (time_per_step * n_devices) if time_per_step > 0 else float("nan")
    return {
        "perf/total_num_tokens": total_tokens,
        "perf/time_per_step": time_per_step,
        "perf/throughput": throughput,
    }


def compute_throughout_metrics(batch, timing_raw: dict[str, float], n_gpus: int) -> dict[str, float]:
    """verl's name (sic) and signature ``(batch, timing_raw, n_gpus)`` for
    :func:`compute_throughput_metrics`, which see; ``n_gpus`` is its ``n_devices``.

    Raises:
        MetricsInputError: timing_raw has no "step", or ``n_gpus`` is not a number >= 1
            (the message names this function and ``n_gpus``).
    """
    return _throughput(batch, timing_raw, n_gpus, "compute_throughout_metrics", "n_gpus")


def compute_rollout_probs_diff_metrics(
    old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """How far the rollout engine's token probabilities are from the trainer's (verl's
    training/rollout mismatch metrics).

    Engines and trainers compute the same policy with different kernels, precisions and
    batching; the gap is what rollout correction ("When Speed Kills Stability: Demystifying RL
    Collapse from the Training-Inference Mismatch", Liu, Li et al. 2025) corrects for.

    Args:
        old_log_probs: ``(bs, R)`` log-probs of the responses under the trained policy.
        rollout_log_probs: ``(bs, R)`` log-probs the engine sampled them with.
        response_mask: ``(bs, R)``, 1 on generated tokens.

    Returns:
        ``training/rollout_probs_diff_{max,mean,std}`` of ``|exp(rollout) - exp(old)|`` over
        response tokens and ``training/rollout_actor_probs_pearson_corr`` of the two
        probabilities (NaN when either is constant); empty when there is no response token.

    Raises:
        MetricsInputError: the three tensors differ in shape.
    """
    if not (old_log_probs.shape == rollout_log_probs.shape == response_mask.shape):
        raise MetricsInputError(
            f"rollout probs diff: shapes differ: old_log_probs {tuple(old_log_probs.shape)}, "
            f"rollout_log_probs {tuple(rollout_log_probs.shape)}, "
            f"response_mask {tuple(response_mask.shape)}"
        )
    mask = response_mask.bool()
    if not mask.any():
        return {}
    actor = old_log_probs[mask].double().exp()
    rollout = rollout_log_probs[mask].double().exp()
    diff = (rollout - actor).abs()
    corr = torch.corrcoef(torch.stack([rollout, actor]))[0, 1] if actor.numel() > 1 else torch.tensor(float("nan"))
    return {
        "training/rollout_probs_diff_max": diff.max().item(),
        "training/rollout_probs_diff_mean": diff.mean().item(),
        "training/rollout_probs_diff_std": diff.std(unbiased=False).item(),
        "training/rollout_actor_probs_pearson_corr": corr.item(),
    }
