"""The longest response that trains on 2 CPU workers, with and without Ulysses sequence parallelism.

    python benchmarks/sp_length.py --sp 2 --lengths 2048 4096 8192 16384 [--model sp-small]
                                   [--limit-gb 11] [--no-gradient-checkpointing]
                                   [--out benchmarks/results/sp_length.jsonl]

Two Ray workers hold the actor (FSDP2, fp32 weights, bf16 compute where ``auto`` picks it, gradient
checkpointing unless ``--no-gradient-checkpointing``, packed rows, chunked logits) and run one
``compute_log_prob`` and one ``update_actor`` on 2 synthetic responses of each length in turn (a
16-token prompt each: every token of the row is a response token, as in a long reasoning trace.
After each length the busiest worker's peak resident memory is recorded; the sweep stops at the
first length that fails or whose peak passes ``--limit-gb`` (the default leaves 2 GB of the
machine's 24 GiB to the driver and the system). Generation is left out: its KV cache for 2 sequences
is small beside training's activations, and sampling 16k tokens on 2 CPU cores would take hours.
With gradient checkpointing a model of a few hundred million parameters reaches the memory limit
only beyond 100k tokens, hours per step on 2 cores; without it the limit comes within reach.
Random-init shapes (benchmarks/scale.py ``SHAPES``) measure memory, not learning. Name the CPU with
every figure."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from scale import model_folder


def _batch(length: int, rows: int = 2, prompt: int = 16):
    """``rows`` responses of ``length`` tokens after a ``prompt``-token prompt, as the rollout hands them."""
    from hybridrl.protocol import DataProto

    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, 2000, (rows, prompt), generator=gen)
    responses = torch.randint(3, 2000, (rows, length), generator=gen)
    mask = torch.ones(rows, prompt + length, dtype=torch.long)
    batch = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": torch.ones(rows, length, dtype=torch.long),
        "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": mask,
        "position_ids": torch.arange(prompt + length).expand(rows, -1).clone(),
        "advantages": torch.randn(rows, length, generator=gen),
    }
    return DataProto.from_dict(tensors=batch)  # the worker's pass specs set the temperature


def _group(model: str, sp: int, max_length: int, checkpointing: bool):
    from hybridrl.config import load_config
    from hybridrl.config.batch_sizes import worker_batch_sizes
    from hybridrl.controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from hybridrl.workers.fsdp_workers import ActorRolloutRefWorker

    a = "actor_rollout_ref.actor"
    cfg = load_config(
        [
            f"actor_rollout_ref.model.path={model}",
            "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=1",
            f"data.max_response_length={max_length}",
            f"{a}.ppo_mini_batch_size=2",
            f"{a}.ppo_micro_batch_size_per_gpu=1",
            f"{a}.ulysses_sequence_parallel_size={sp}",
            f"{a}.entropy_from_logits_with_chunking=true",
            f"actor_rollout_ref.model.enable_gradient_checkpointing={str(checkpointing).lower()}",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        ]
    )
    section = cfg.actor_rollout_ref
    sizes = worker_batch_sizes(section.actor, 1, 2)
    return RayWorkerGroup(
        RayResourcePool([2]), RayClassWithInitArgs(ActorRolloutRefWorker, section, sizes, role="actor", device="cpu")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="sp-small")
    parser.add_argument("--sp", type=int, default=1)
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    parser.add_argument("--limit-gb", type=float, default=11.0)
    parser.add_argument("--no-gradient-checkpointing", dest="checkpointing", action="store_false")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "sp_length.jsonl"))
    args = parser.parse_args(argv)
    import ray

    ray.init(num_cpus=4, include_dashboard=False)
    group = _group(model_folder(args.model), args.sp, max(args.lengths), args.checkpointing)
    group.init_model()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    for length in args.lengths:
        start, record = (
            time.time(),
            {
                "model": args.model,
                "sp": args.sp,
                "response_length": length,
                "gradient_checkpointing": args.checkpointing,
                "cpu": torch.backends.cpu.get_cpu_capability(),
            },
        )
        try:
            batch = _batch(length)
            batch.batch["old_log_probs"] = group.compute_log_prob(batch).batch["old_log_probs"]
            group.update_actor(batch)
            peak = max(m["perf/max_memory_allocated_gb"] for m in group.get_memory_metrics())
            record.update(ok=peak <= args.limit_gb, peak_gb=round(peak, 2), seconds=round(time.time() - start, 1))
        except Exception as exc:  # noqa: BLE001 - a worker killed for memory ends the sweep, as recorded
            record.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:200]}")
        print(json.dumps(record), flush=True)
        with open(args.out, "a") as f:
            f.write(json.dumps(record) + "\n")
        if not record["ok"]:
            break
    group.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
