"""The synchronous and the asynchronous trainers on one job: wall time per step, tokens per
wall-second, and the learning after the same number of samples.

Runs a job (``--job arithmetic``: ``examples/run_arithmetic_grpo.sh``, the main job, GRPO,
SmolLM2-135M-Instruct, 16 prompts x 4; ``--job gsm8k``: ``examples/run_gsm8k_grpo.sh``, 8 GSM8K
prompts x 4, 256-token responses) with the vLLM engine for ``--steps`` steps, once per mode and
per ``--seeds`` value (``actor_rollout_ref.rollout.seed``: the sampling seed), each in its own
process, without validation or checkpoints. Modes:

- ``sync``: the synchronous trainer (``actor_rollout_ref.rollout.mode`` = ``--rollout_mode``);
- ``one_step_off``: ``trainer.one_step_off_policy=true``;
- ``colocate_async`` / ``separate_async``: ``trainer.v1.trainer_mode`` (the async engine);

the asynchronous ones in bypass mode, as verl's recipes (``algorithm.rollout_correction.bypass_mode=true``).
For each mode it prints, as the mean over seeds:

- seconds per step (median and mean of ``perf/time_per_step``, without step 1, which has
  nothing to overlap);
- tokens per wall-second: prompt + response tokens (``perf/total_num_tokens``), and response
  tokens alone, over the same steps;
- the share of each step the trainer waited for generation (``timing_s/gen / timing_s/step``)
  and the engine's idle share (``fully_async/rollouter/idle_ratio``);
- ``critic/score/mean``: the mean over the last 3 steps, per seed (every mode trains the same
  number of samples per step); the spread of ``sync`` over the seeds is the yardstick;
- the run's wall time (process start to exit, engine start-up included).

Threads: on a small CPU the trainer and a generating engine share the cores. ``sync`` runs
with the machine's default threads; the asynchronous modes with ``--trainer_threads`` torch
threads for the trainer (``OMP_NUM_THREADS``; 0: the default) and ``--engine_threads`` for the
engine (``actor_rollout_ref.rollout.cpu_threads``); docs/async.md. Extra ``key=value``
arguments go to every run, after the script's own (they win).

    python benchmarks/async_modes.py                                   # main job, sync vs one_step_off, 10 steps
    python benchmarks/async_modes.py --modes sync separate_async --seeds 0 1 2 --trainer_threads 2
    python benchmarks/async_modes.py --job gsm8k --steps 6 --modes sync separate_async
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOBS = {
    "arithmetic": os.path.join(REPO, "examples", "run_arithmetic_grpo.sh"),
    "gsm8k": os.path.join(REPO, "examples", "run_gsm8k_grpo.sh"),
}
MODES = ("sync", "one_step_off", "colocate_async", "separate_async")


def mode_overrides(mode: str, args) -> tuple[list[str], dict]:
    """The trainer's keys and the environment of ``mode``."""
    env = {}
    if mode == "sync":
        return [f"actor_rollout_ref.rollout.mode={args.rollout_mode}"], env
    if args.trainer_threads > 0:
        env["OMP_NUM_THREADS"] = str(args.trainer_threads)
    common = [
        "algorithm.rollout_correction.bypass_mode=true",
        f"actor_rollout_ref.rollout.cpu_threads={args.engine_threads}",
    ]
    if mode == "one_step_off":
        return ["trainer.one_step_off_policy=true", f"actor_rollout_ref.rollout.mode={args.rollout_mode}", *common], env
    return [f"trainer.v1.trainer_mode={mode}", "actor_rollout_ref.rollout.mode=async", *common], env


def run(mode: str, seed: int, args, extra: list[str], out_dir: str) -> dict:
    """Trains the job in ``mode`` with sampling seed ``seed``; returns its metrics rows, batch shape and wall time."""
    name = f"{mode}_seed{seed}"
    run_dir = os.path.join(out_dir, name)
    overrides, env = mode_overrides(mode, args)
    overrides = [
        f"trainer.total_training_steps={args.steps}",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        f"trainer.default_local_dir={run_dir}",
        "trainer.logger=['console','file']",
        "trainer.resume_mode=disable",
        "actor_rollout_ref.rollout.name=vllm",
        f"actor_rollout_ref.rollout.seed={seed}",
        *overrides,
    ]
    env = dict(os.environ, ROLLOUT="vllm", **env)
    if args.data_dir:
        env["DATA_DIR"] = args.data_dir
    log_path = os.path.join(out_dir, f"{name}.log")
    started = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.run(
            ["bash", JOBS[args.job], *overrides, *extra], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    wall_s = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"{name}: the run failed (exit {proc.returncode}); see {log_path}")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    with open(os.path.join(run_dir, "config.yaml")) as f:
        config = yaml.safe_load(f)
    rows_per_step = config["data"]["train_batch_size"] * config["actor_rollout_ref"]["rollout"]["n"]
    return {"rows": [r for r in rows if r.get("step", 0) >= 1], "wall_s": wall_s, "rows_per_step": rows_per_step}


def summarize(result: dict) -> dict:
    """The numbers of one run (module docstring); steps after the first."""
    rows = result["rows"]
    timed = rows[1:] or rows
    seconds = [r["perf/time_per_step"] for r in timed]
    total_s = sum(seconds)
    scores = [r["critic/score/mean"] for r in rows]
    summary = {
        "s_per_step_median": statistics.median(seconds),
        "s_per_step_mean": total_s / len(seconds),
        "tokens_per_s": sum(r["perf/total_num_tokens"] for r in timed) / total_s,
        "response_tokens_per_s": sum(r["response_length/mean"] * result["rows_per_step"] for r in timed) / total_s,
        "trainer_wait_share": statistics.mean(r.get("timing_s/gen", 0.0) / r["timing_s/step"] for r in timed),
        "score_last3": statistics.mean(scores[-3:]),
        "wall_s": result["wall_s"],
    }
    idle = [r["fully_async/rollouter/idle_ratio"] for r in timed if "fully_async/rollouter/idle_ratio" in r]
    if idle:
        summary["engine_idle_share"] = statistics.mean(idle)
    stale = [r["fully_async/staleness/mean"] for r in timed if "fully_async/staleness/mean" in r]
    if stale:
        summary["staleness_mean"] = statistics.mean(stale)
    return summary


def report(results: dict[str, list[dict]], args) -> None:
    """Prints the mean over seeds of every number, then each mode's scores against sync's spread."""
    keys = list(dict.fromkeys(k for runs in results.values() for summary in runs for k in summary))
    print(
        f"\n{args.job} job, vLLM, {args.steps} steps, seeds {args.seeds}; timed: steps 2..{args.steps}; mean over seeds"
    )
    print(f"{'':24s}" + "".join(f"{mode:>16s}" for mode in results))
    for key in keys:
        values = [
            statistics.mean([s[key] for s in runs if key in s]) if any(key in s for s in runs) else float("nan")
            for runs in results.values()
        ]
        print(f"{key:24s}" + "".join(f"{v:16.3f}" for v in values))
    print("\ncritic/score/mean, mean of the last 3 steps, per seed:")
    for mode, runs in results.items():
        print(f"  {mode:16s} " + "  ".join(f"{s['score_last3']:.3f}" for s in runs))
    if "sync" in results and len(results["sync"]) > 1:
        sync = [s["score_last3"] for s in results["sync"]]
        print(f"  sync's run-to-run spread: {min(sync):.3f} .. {max(sync):.3f} (std {statistics.stdev(sync):.3f})")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--job", choices=sorted(JOBS), default="arithmetic")
    p.add_argument("--steps", type=int, default=10, help="training steps per run")
    p.add_argument("--modes", nargs="+", default=["sync", "one_step_off"], choices=MODES)
    p.add_argument("--seeds", nargs="+", type=int, default=[0], help="actor_rollout_ref.rollout.seed of each run")
    p.add_argument(
        "--rollout_mode",
        choices=["sync", "async"],
        default="sync",
        help="sync and one_step_off: vLLM in the trainer's process (sync) or in its own (async)",
    )
    p.add_argument(
        "--trainer_threads", type=int, default=1, help="async modes: the trainer's torch threads (0: default)"
    )
    p.add_argument("--engine_threads", type=int, default=1, help="async modes: rollout.cpu_threads")
    p.add_argument("--data_dir", default=None, help="the job's parquet folder (default: the job's own)")
    p.add_argument("--out_dir", default=None, help="run folders and logs (default: a new temporary folder)")
    args, extra = p.parse_known_args(argv)
    if args.steps < 4:
        p.error("--steps must be >= 4 (step 1 is not timed; the score is the mean of the last 3)")
    out_dir = args.out_dir or tempfile.mkdtemp(prefix="hybridrl-async-modes-")
    os.makedirs(out_dir, exist_ok=True)
    results: dict[str, list[dict]] = {}
    for mode in args.modes:
        for seed in args.seeds:
            print(
                f"{mode}, seed {seed}: {args.steps} steps (log: {os.path.join(out_dir, f'{mode}_seed{seed}.log')}) ...",
                flush=True,
            )
            results.setdefault(mode, []).append(summarize(run(mode, seed, args, extra, out_dir)))
    report(results, args)
    return results


if __name__ == "__main__":
    main()
