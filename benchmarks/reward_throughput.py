"""Reward scoring throughput: the reward manager scoring in the driver (serial) against scoring in
a pool of processes (``reward.num_workers``), in samples per second, for the GSM8K and MATH
scorers and, where the code scorer is installed, HumanEval programs run in the code sandbox.

The responses are real: GSM8K's and MATH-500's reference solutions (every other one with its
final answer changed, so half score 0) and HumanEval's canonical solutions (every other one with
its last line dropped). Each timing is the best of ``--repeats`` calls of the manager on a batch
of ``--samples``, decoding included (what the trainer waits for). Every call gets responses it
has not seen (the MATH scorer caches parsed answers per process), serial and pool the same ones;
the pool is started and warmed up on another batch first.

    python benchmarks/reward_throughput.py                  # 128 samples a call, 2 workers, best of 2
    python benchmarks/reward_throughput.py --samples 64 --workers 2 --repeats 3
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import time

import torch
from common import GSM8K_DIR, MODEL

DATA_DIR = os.path.dirname(GSM8K_DIR)


def _jsonl(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def gsm8k_task(n: int) -> tuple[str, list[str], list[str]]:
    rows = _jsonl(os.path.join(GSM8K_DIR, "test.jsonl"))[:n]
    truths = [row["answer"].split("####")[-1].strip().replace(",", "") for row in rows]
    responses = [
        row["answer"] if i % 2 == 0 else re.sub(r"####.*$", "#### 0.5", row["answer"]) for i, row in enumerate(rows)
    ]
    return "openai/gsm8k", responses, truths


def math_task(n: int) -> tuple[str, list[str], list[str]]:
    rows = _jsonl(os.path.join(DATA_DIR, "math500", "test.jsonl"))[:n]
    responses = [
        row["solution"] if i % 2 == 0 else row["solution"] + r" Final answer: $\boxed{\frac{3}{7}}$"
        for i, row in enumerate(rows)
    ]
    return "HuggingFaceH4/MATH-500", responses, [row["answer"] for row in rows]


def code_task(n: int) -> tuple[str, list[str], list[str]] | None:
    from hybridrl.rewards import known_data_sources

    if "humaneval" not in known_data_sources():
        return None
    from hybridrl.data.preprocess.humaneval import make_ground_truth

    problems = _jsonl(os.path.join(DATA_DIR, "humaneval", "HumanEval.jsonl.gz"))
    rows = [problems[i % len(problems)] for i in range(n)]
    responses = [
        row["canonical_solution"] if i % 2 == 0 else "\n".join(row["canonical_solution"].splitlines()[:-1])
        for i, row in enumerate(rows)
    ]
    return "humaneval", responses, [make_ground_truth(row) for row in rows]


def make_batch(tokenizer, source: str, responses: list[str], truths: list[str]):
    """One-token prompts (bs, 1) and right-padded responses (bs, R), as the reward manager reads them."""
    from hybridrl.protocol import DataProto

    ids = [tokenizer.encode(r) + [tokenizer.eos_token_id] for r in responses]
    width = max(map(len, ids))
    pad = tokenizer.pad_token_id
    response_ids = torch.tensor([row + [pad] * (width - len(row)) for row in ids])
    mask = torch.tensor([[1] + [1] * len(row) + [0] * (width - len(row)) for row in ids])
    return DataProto.from_dict(
        tensors={"prompts": torch.full((len(ids), 1), pad), "responses": response_ids, "attention_mask": mask},
        non_tensors={
            "data_source": [source] * len(ids),
            "reward_model": [{"style": "rule", "ground_truth": t} for t in truths],
        },
    )


def rate(manager, data) -> tuple[float, torch.Tensor]:
    """(samples per second of one call, its scores)."""
    started = time.perf_counter()
    scores = manager(data)
    return len(data) / (time.perf_counter() - started), scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=128, help="responses scored per task")
    parser.add_argument("--workers", type=int, default=2, help="processes of the pool (reward.num_workers)")
    parser.add_argument("--repeats", type=int, default=2, help="timed calls per setting; the best counts")
    args = parser.parse_args()

    from hybridrl.models import load_tokenizer, resolve_model_path
    from hybridrl.rewards.manager import NaiveRewardManager
    from hybridrl.rewards.pool import build_reward_pool

    tokenizer = load_tokenizer(resolve_model_path(MODEL))
    rows = args.samples * (args.repeats + 1)  # a warm-up batch, then a fresh batch per repeat
    tasks = [task for task in (gsm8k_task(rows), math_task(rows), code_task(rows)) if task]
    print(
        f"{args.samples} samples per call, best of {args.repeats}; {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    print(f"{'task':<24} {'serial/s':>10} {f'{args.workers} workers/s':>13} {'speed-up':>9} {'mean score':>11}")
    with build_reward_pool(args.workers) as pool:
        serial = NaiveRewardManager(tokenizer, 0)
        parallel = NaiveRewardManager(tokenizer, 0, pool=pool)
        pool.check_started(serial.compute_score)
        for source, responses, truths in tasks:
            data = make_batch(tokenizer, source, responses, truths)
            n = args.samples
            parallel(data[:n])  # each worker imports the scorer before timing
            serial(data[:2])
            serial_rate = pool_rate = 0.0
            means = []
            for k in range(1, min(args.repeats, len(data) // n - 1) + 1):
                batch = data[k * n : (k + 1) * n]
                serial_k, serial_scores = rate(serial, batch)
                pool_k, pool_scores = rate(parallel, batch)
                assert torch.equal(serial_scores, pool_scores), f"{source}: the pool scored differently"
                serial_rate, pool_rate = max(serial_rate, serial_k), max(pool_rate, pool_k)
                means.append(serial_scores.sum(-1).mean().item())
            mean = sum(means) / len(means)
            print(
                f"{source:<24} {serial_rate:>10.1f} {pool_rate:>13.1f} {pool_rate / serial_rate:>8.2f}x {mean:>11.2f}"
            )


if __name__ == "__main__":
    main()
