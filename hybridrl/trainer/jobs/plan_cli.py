"""``hybridrl plan <key=value ...> [--device-memory GB] [--json]``: the memory plan of a run before
launching it, per role and per device, from the model's config.json only (docs/scale.md).

The config is loaded as ``hybridrl train`` loads it (the same overrides, ``auto`` dtypes resolved
for ``trainer.device``); when it does not fit, the keys that would make it fit are tried one by
one (:func:`suggest`), each with the plan's new total. ``hybridrl train`` prints
:func:`startup_line` at start-up.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys

from hybridrl.config import load_config
from hybridrl.config.key_tables import ACTOR, REF, ROLLOUT
from hybridrl.config.precision import auto_dtype_keys, resolve_precision
from hybridrl.errors import ConfigError, UserError
from hybridrl.trainer.jobs.memory_plan import MemoryPlan, one_line
from hybridrl.trainer.jobs.plan_config import build_plan
from hybridrl.trainer.ppo.config import typed_ppo_config

__all__ = ["format_table", "load_plan_config", "main", "plan_json", "startup_line", "suggest"]

_MAX_COMBINED = 8  # keys one combined suggestion may set


def load_plan_config(overrides: list[str]):
    """The typed PPO config of ``hybridrl train <overrides>``, ``auto`` dtypes resolved for
    ``trainer.device``; a CUDA plan made where no GPU is visible takes bf16. Returns
    ``(config, note or None)``."""
    import torch
    from omegaconf import OmegaConf, open_dict

    config = load_config(overrides, config_name="ppo_trainer", resolve_auto_dtypes=False)
    note = None
    if str(config.trainer.device) == "cuda" and not torch.cuda.is_available():
        keys = auto_dtype_keys(config)
        with open_dict(config):
            for key in keys:
                OmegaConf.update(config, key, "bf16", merge=False)
        note = f"precision auto -> bf16 assumed for cuda (no GPU visible here): {', '.join(keys)}" if keys else None
    else:  # device given: resolved here even for Ray workers (a plan needs a dtype)
        note = resolve_precision(config, str(config.trainer.device))
    return typed_ppo_config(config), note


def _candidates(config, plan: MemoryPlan) -> list[dict]:
    """Single changes that may lower the peak: offload (CUDA), smaller micro batches or token
    budgets, gradient checkpointing, chunked logits, more workers, LoRA, SP, a smaller rollout."""
    arr, roles, cands = config.actor_rollout_ref, plan.roles, []
    if plan.device == "cuda":
        for key in (f"{ACTOR}.fsdp_config.param_offload", f"{ACTOR}.fsdp_config.optimizer_offload"):
            cands.append({key: True})
        if roles.get("reference", {}).get("weights"):
            cands.append({f"{REF}.fsdp_config.param_offload": True})
        if "critic" in roles:
            cands += [
                {"critic.model.fsdp_config.param_offload": True},
                {"critic.model.fsdp_config.optimizer_offload": True},
            ]
    cands += _halved_batches(config, "critic" in roles, "reference" in roles)
    if not arr.model.enable_gradient_checkpointing:
        cands.append({"actor_rollout_ref.model.enable_gradient_checkpointing": True})
    if "critic" in roles and not config.critic.model.enable_gradient_checkpointing:
        cands.append({"critic.model.enable_gradient_checkpointing": True})
    chunking = {
        f"{sec}.entropy_from_logits_with_chunking": True
        for sec, cfg in ((ACTOR, arr.actor), (REF, arr.ref))
        if not cfg.entropy_from_logits_with_chunking
    }
    if chunking:
        cands.append(chunking)
    cands.append({"trainer.nnodes": int(config.trainer.nnodes) * 2})
    if int(arr.model.lora_rank) == 0:
        cands.append({"actor_rollout_ref.model.lora_rank": 16})
    sp = 2 * int(arr.actor.ulysses_sequence_parallel_size)
    if plan.workers % sp == 0 and plan.model["num_attention_heads"] % sp == 0:
        cands.append({f"{ACTOR}.ulysses_sequence_parallel_size": sp, f"{REF}.ulysses_sequence_parallel_size": sp})
    rollout = arr.rollout
    if rollout.name == "vllm" and plan.device == "cuda" and rollout.gpu_memory_utilization > 0.15:
        cands.append({f"{ROLLOUT}.gpu_memory_utilization": round(float(rollout.gpu_memory_utilization) - 0.1, 2)})
    elif rollout.name != "vllm" and (rollout.micro_batch_size or 0) > 1:
        cands.append({f"{ROLLOUT}.micro_batch_size": int(rollout.micro_batch_size) // 2})
    return cands


def _halved_batches(config, critic: bool, reference: bool) -> list[dict]:
    """Halve each micro batch (rows) or token budget (``use_dynamic_bsz``) that is larger than one row."""
    from hybridrl.config import worker_batch_sizes

    arr = config.actor_rollout_ref
    n, workers = int(arr.rollout.n), int(config.trainer.nnodes) * int(config.trainer.n_gpus_per_node)
    row = int(config.data.max_prompt_length) + int(config.data.max_response_length)
    out = []
    sections = [
        (ACTOR, arr.actor, "ppo_micro_batch_size", "use_dynamic_bsz", "ppo_max_token_len_per_gpu"),
        (
            ROLLOUT,
            arr.rollout,
            "log_prob_micro_batch_size",
            "log_prob_use_dynamic_bsz",
            "log_prob_max_token_len_per_gpu",
        ),
    ]
    if reference:
        sections.append(
            (REF, arr.ref, "log_prob_micro_batch_size", "log_prob_use_dynamic_bsz", "log_prob_max_token_len_per_gpu")
        )
    if critic:
        sections.append(
            ("critic", config.critic, "ppo_micro_batch_size", "use_dynamic_bsz", "ppo_max_token_len_per_gpu")
        )
    train_micro = worker_batch_sizes(arr.actor, n, workers).ppo_micro_batch_size_per_gpu
    for prefix, section, micro_key, dynamic_key, budget_key in sections:
        if section[dynamic_key]:
            budget = int(section[budget_key])
            if budget > row:
                out.append({f"{prefix}.{budget_key}": max(row, budget // 2)})
            continue
        global_rows = int(section[micro_key]) // workers if section[micro_key] else train_micro
        rows = section[f"{micro_key}_per_gpu"] or global_rows
        if rows > 1:
            change = {f"{prefix}.{micro_key}_per_gpu": int(rows) // 2}
            if section[micro_key] is not None:
                change[f"{prefix}.{micro_key}"] = None  # the deprecated global key would conflict
            out.append(change)
    return out


def _with(config, change: dict):
    from omegaconf import OmegaConf

    changed = copy.deepcopy(config)
    for key, value in change.items():
        OmegaConf.update(changed, key, value, merge=False)
    return changed


def _try(config, change: dict, device_memory_gb: float):
    try:
        return build_plan(_with(config, change), device_memory_gb)
    except (UserError, ValueError):  # the change breaks a rule (a batch size that does not split, ...)
        return None


def suggest(config, plan: MemoryPlan) -> list[dict]:
    """Changes that lower the peak: ``[{"set": {key: value}, "per_device_gb": GiB, "fits": bool}]``,
    those that fit first, then by the new total. When no single change fits, the changes are
    combined greedily (the best first) until the plan fits, as one more entry."""
    found = []
    for change in _candidates(config, plan):
        new = _try(config, change, plan.device_memory_gb)
        if new is not None and new.per_device_gb < plan.per_device_gb - 1e-6:
            found.append({"set": change, "per_device_gb": new.per_device_gb, "fits": new.fits})
    found.sort(key=lambda s: (not s["fits"], s["per_device_gb"]))
    if found and not found[0]["fits"]:
        combined = _combine(config, plan)
        if combined:
            found.insert(0, combined)
    return found


def _combine(config, plan: MemoryPlan) -> dict | None:
    total, current = {}, plan
    for _ in range(_MAX_COMBINED):
        best = None
        for change in _candidates(_with(config, total), current):
            new = _try(config, {**total, **change}, plan.device_memory_gb)
            if (
                new is not None
                and new.per_device_gb < current.per_device_gb - 1e-6
                and (best is None or new.per_device_gb < best[1].per_device_gb)
            ):
                best = (change, new)
        if best is None:
            break
        total, current = {**total, **best[0]}, best[1]
        if current.fits:
            break
    return {"set": total, "per_device_gb": current.per_device_gb, "fits": current.fits} if len(total) > 1 else None


def startup_line(config) -> tuple[str, bool]:
    """``(line, fits)`` for ``hybridrl train``: the plan's one-line total on the visible device."""
    plan = build_plan(config)
    return one_line(plan), plan.fits


def plan_json(plan: MemoryPlan) -> dict:
    """The ``--json`` object: ``per_device_gb``, ``roles``, ``device_memory_gb``, ``fits``,
    ``suggestions`` and the rest of the plan (GiB, rounded to 4 decimals)."""

    def r(x):
        return round(float(x), 4)

    return {
        "per_device_gb": r(plan.per_device_gb),
        "device_memory_gb": r(plan.device_memory_gb),
        "fits": plan.fits,
        "peak_phase": plan.peak_phase,
        "device": plan.device,
        "workers": plan.workers,
        "model": plan.model,
        "roles": {role: {c: r(v) for c, v in parts.items()} for role, parts in plan.roles.items()},
        "phases": {p: r(v) for p, v in plan.phases.items()},
        "peak_by_role": {role: r(v) for role, v in plan.peak_by_role.items()},
        "host_gb": {role: {c: r(v) for c, v in parts.items()} for role, parts in plan.host_gb.items()},
        "notes": plan.notes,
        "suggestions": [{**s, "per_device_gb": r(s["per_device_gb"])} for s in plan.suggestions],
    }


def format_table(plan: MemoryPlan) -> str:
    """The plan as a plain-text table: role x component (GB on the device, and when), phases, verdict."""
    model = plan.model
    title = (
        f"memory plan: {model['model_type']} with {model['params'] / 1e9:.2f}B parameters, {plan.device} x "
        f"{plan.workers} workers, {plan.device_memory_gb:.1f} GB per device"
    )
    width = max([13, *(len(role) + 1 for role in plan.roles)])  # a teacher's role names the teacher
    lines = [title, "", f"{'role':<{width}}{'component':<32}{'GB':>9}  on the device during"]
    for role, parts in plan.roles.items():
        for component, gb in parts.items():
            if gb > 0:
                lines.append(f"{role:<{width}}{component:<32}{gb:>9.2f}  {plan.when[role][component]}")
    lines += ["", "phases (GB per device): " + ", ".join(f"{p} {gb:.1f}" for p, gb in plan.phases.items())]
    for role, parts in plan.host_gb.items():
        held = ", ".join(f"{c} {gb:.2f}" for c, gb in parts.items())
        lines.append(f"offloaded to the host per worker: {role} {held}")
    lines += [f"note: {note}" for note in plan.notes]
    lines += ["", one_line(plan)]
    if not plan.fits and not plan.suggestions:
        lines.append("no key this plan knows lowers the peak (see the notes)")
    elif not plan.fits:
        lines.append("to make it fit:" if any(s["fits"] for s in plan.suggestions) else "closer to fitting:")
        for s in plan.suggestions[:10]:
            keys = " ".join(f"{k}={_value(v)}" for k, v in s["set"].items())
            lines.append(f"  {keys}  -> {s['per_device_gb']:.1f} GB{' (fits)' if s['fits'] else ''}")
    return "\n".join(lines)


def _value(v) -> str:
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybridrl plan", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--device-memory",
        type=float,
        metavar="GB",
        dest="device_memory",
        help="memory of one device in GB (GiB); default: the visible GPU's, or on CPU this "
        "machine's RAM / trainer.n_gpus_per_node",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="the same overrides as hybridrl train")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``hybridrl plan``: prints the plan; a bad input raises a UserError (one line from the command line)."""
    args = _parser().parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    if args.device_memory is not None and not args.device_memory > 0:
        raise ConfigError(f"--device-memory={args.device_memory:g} must be > 0 (GB of one device)")
    config, note = load_plan_config(args.overrides)
    plan = build_plan(config, args.device_memory)
    if note:
        plan.notes.insert(0, note)
    if not plan.fits:
        plan.suggestions = suggest(config, plan)
    print(json.dumps(plan_json(plan)) if args.json else format_table(plan))
    return 0
