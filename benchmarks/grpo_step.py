"""Tokens per second of each stage of a hybridrl GRPO step, and the MFU of the update.

Runs ``--warmup`` + ``--steps`` GRPO steps of SmolLM2-135M-Instruct on GSM8K (hybridrl's
trainer, local backend, bf16 compute on fp32 master weights, bf16 rollout copy) and prints,
per stage (gen, old_log_prob, ref, update_actor), tokens per wall second and per CPU second
(gen counts generated tokens; the others every valid prompt + response token), and the model
FLOP utilisation of update_actor against this machine's bf16 matmul peak, measured first with
a 2048^3 matmul loop. Useful FLOPs only: forward + backward = 3 x the forward of
``common.forward_flops`` (padding and recomputation not counted).

    python benchmarks/grpo_step.py                                  # 8 prompts x 4, 128 tokens
    python benchmarks/grpo_step.py --prompts 16 --response_length 256 --steps 3
    python benchmarks/grpo_step.py actor_rollout_ref.model.use_remove_padding=true   # extra overrides
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see generation.py; before torch loads OpenMP

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (
    GRPOSettings,
    build_hybridrl_grpo,
    cpu_seconds,
    forward_flops,
    gsm8k_parquet,
    matmul_peak_flops,
)

STAGES = {
    "gen": "generate_sequences",
    "old_log_prob": "compute_log_prob",
    "ref": "compute_ref_log_prob",
    "update_actor": "update_actor",
}


class StageClock:
    """Wall and CPU seconds, tokens and useful FLOPs of each worker-group call, per step."""

    def __init__(self, model_config) -> None:
        self.model_config = model_config
        self.step: dict = defaultdict(float)

    def wrap(self, group, stage: str, method: str) -> None:
        call = getattr(group, method)

        def timed(data, **kwargs):  # the trainer passes keyword options (compute_ref_log_prob's full_kl)
            wall0, cpu0 = time.perf_counter(), cpu_seconds()
            out = call(data, **kwargs)
            self.step[f"{stage}/wall"] += time.perf_counter() - wall0
            self.step[f"{stage}/cpu"] += cpu_seconds() - cpu0
            source = out if stage == "gen" else data
            if stage == "gen":
                self.step[f"{stage}/tokens"] += float(source.batch["response_mask"].sum())
            else:
                self.step[f"{stage}/tokens"] += float(source.batch["attention_mask"].sum())
            if stage == "update_actor":
                flops = 3 * forward_flops(self.model_config, data.batch["attention_mask"], data.batch["response_mask"])
                self.step[f"{stage}/flops"] += flops
            return out

        setattr(group, method, timed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--response_length", type=int, default=128)
    parser.add_argument("--micro_batch", type=int, default=8)
    parser.add_argument("--kl_coef", type=float, default=0.04, help="0: no reference model")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--steps", type=int, default=2, help="timed steps")
    parser.add_argument("overrides", nargs="*", help="extra hybridrl config overrides (key=value)")
    args = parser.parse_args(argv)

    peak = matmul_peak_flops(2048, torch.bfloat16)
    print(
        f"bf16 matmul peak (2048^3, {torch.get_num_threads()} threads): {peak['flops_per_s'] / 1e9:.0f} GFLOP/s, "
        f"{peak['flops_per_cpu_s'] / 1e9:.0f} GFLOP per CPU-second; load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    settings = GRPOSettings(
        prompts=args.prompts,
        group=args.group,
        response_length=args.response_length,
        micro_batch=args.micro_batch,
        kl_coef=args.kl_coef,
    )
    total = args.warmup + args.steps
    with tempfile.TemporaryDirectory() as tmp:
        parquet = gsm8k_parquet(tmp, train_size=args.prompts * total)
        trainer, batches, groups = build_hybridrl_grpo(settings, parquet, total, args.overrides)
        try:
            worker = groups.actor_rollout.workers[0]
            clock = StageClock(worker.actor.actor_module.config)
            for stage, method in STAGES.items():
                clock.wrap(groups.actor_rollout, stage, method)
            steps = []
            for index in range(total):
                clock.step = defaultdict(float)
                trainer.step(next(batches))
                trainer.global_steps += 1
                if index >= args.warmup:
                    steps.append(dict(clock.step))
                    print(
                        f"step {index + 1}: "
                        + ", ".join(f"{s} {clock.step[f'{s}/wall']:.1f}s" for s in STAGES if f"{s}/wall" in clock.step),
                        flush=True,
                    )
        finally:
            groups.shutdown()
    report(steps, peak)
    return 0


def report(steps: list[dict], peak: dict) -> None:
    """Median over the timed steps, with the range."""
    print(f"\n{'stage':<14}{'tok/s':>10}{'tok/cpu-s':>11}   (min-max tok/s over {len(steps)} steps)")
    for stage in STAGES:
        if f"{stage}/wall" not in steps[0]:
            continue
        rates = [s[f"{stage}/tokens"] / s[f"{stage}/wall"] for s in steps]
        cpu_rates = [s[f"{stage}/tokens"] / s[f"{stage}/cpu"] for s in steps]
        print(
            f"{stage:<14}{statistics.median(rates):>10.0f}{statistics.median(cpu_rates):>11.0f}   "
            f"({min(rates):.0f}-{max(rates):.0f})"
        )
    mfu = [s["update_actor/flops"] / s["update_actor/wall"] / peak["flops_per_s"] for s in steps]
    mfu_cpu = [s["update_actor/flops"] / s["update_actor/cpu"] / peak["flops_per_cpu_s"] for s in steps]
    achieved = statistics.median(s["update_actor/flops"] / s["update_actor/wall"] for s in steps)
    print(
        f"\nupdate_actor MFU: {100 * statistics.median(mfu):.1f}% of the measured bf16 peak per wall second "
        f"({achieved / 1e9:.0f} GFLOP/s), {100 * statistics.median(mfu_cpu):.1f}% per CPU second "
        f"(min-max {100 * min(mfu_cpu):.1f}-{100 * max(mfu_cpu):.1f}%)"
    )


if __name__ == "__main__":
    sys.exit(main())
