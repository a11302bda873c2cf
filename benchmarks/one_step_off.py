"""The main job in synchronous and in one-step-off-policy mode: wall time per step and tokens per wall-second.

Runs ``examples/run_arithmetic_grpo.sh`` (GRPO, SmolLM2-135M-Instruct, generated arithmetic,
16 prompts x 4) with the vLLM engine for ``--steps`` steps, once per mode, each in its own
process, without validation or checkpoints, and prints for each mode:

- seconds per step: the median and mean of ``perf/time_per_step``, without step 1 (in
  one-step-off mode step 1 generates its batch with nothing to overlap);
- tokens per wall-second: prompt + response tokens (``perf/total_num_tokens``) and response
  tokens alone, over the same steps;
- the share of each step the trainer waited for generation (``timing_s/gen / timing_s/step``)
  and, in one-step-off mode, the engine's idle share (``fully_async/rollouter/idle_ratio``);
- ``critic/score/mean`` of the last step and the mean over the last 3 (one-step-off trains on
  samples one update old: compare the learning, not only the speed);
- the run's total wall time (process start to exit, engine start-up included).

``one_step_off`` runs as verl's one-step-off recipe does, in bypass mode
(``algorithm.rollout_correction.bypass_mode=true``: the rollout log-probs are the old ones, no
old-log-prob pass, as the synchronous step skips it on policy); pass
``algorithm.rollout_correction.bypass_mode=false`` for decoupled mode (the pass runs: slower).
Extra ``key=value`` arguments go to both modes, after the script's own (they win).

Threads: on a small CPU the trainer and a generating engine share the cores. ``sync`` runs
with the machine's default threads; ``one_step_off`` with ``--trainer_threads`` torch threads
for the trainer (``OMP_NUM_THREADS``; 0: the default) and ``--engine_threads`` for the engine
(``actor_rollout_ref.rollout.cpu_threads``); docs/async.md.

    python benchmarks/one_step_off.py                          # 10 steps per mode
    python benchmarks/one_step_off.py --steps 30 --rollout_mode async
    python benchmarks/one_step_off.py --modes one_step_off --trainer_threads 2 algorithm.rollout_correction.rollout_is=token
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

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAIN_JOB = os.path.join(REPO, "examples", "run_arithmetic_grpo.sh")
ROWS_PER_STEP = 16 * 4  # the main job's data.train_batch_size x rollout.n


def run_mode(mode: str, args, extra: list[str], out_dir: str) -> dict:
    """Trains the main job in ``mode`` (sync | one_step_off); returns its metrics rows and wall time."""
    run_dir = os.path.join(out_dir, mode)
    overrides = [f"trainer.total_training_steps={args.steps}", "trainer.val_before_train=False",
                 "trainer.test_freq=-1", "trainer.save_freq=-1", f"trainer.default_local_dir={run_dir}",
                 "trainer.logger=['console','file']", "trainer.resume_mode=disable",
                 f"actor_rollout_ref.rollout.mode={args.rollout_mode}"]
    env = dict(os.environ, ROLLOUT="vllm")
    if args.data_dir:
        env["DATA_DIR"] = args.data_dir
    if mode == "one_step_off":
        overrides += ["trainer.one_step_off_policy=true", "algorithm.rollout_correction.bypass_mode=true",
                      f"actor_rollout_ref.rollout.cpu_threads={args.engine_threads}"]
        if args.trainer_threads > 0:
            env["OMP_NUM_THREADS"] = str(args.trainer_threads)
    log_path = os.path.join(out_dir, f"{mode}.log")
    started = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.run(["bash", MAIN_JOB, *overrides, *extra], env=env, stdout=log, stderr=subprocess.STDOUT)
    wall_s = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"{mode}: the run failed (exit {proc.returncode}); see {log_path}")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {"rows": [r for r in rows if r.get("step", 0) >= 1], "wall_s": wall_s, "log": log_path}


def summarize(result: dict) -> dict:
    """The numbers of one mode (module docstring); steps after the first."""
    rows = result["rows"]
    timed = rows[1:] or rows
    seconds = [r["perf/time_per_step"] for r in timed]
    total_s = sum(seconds)
    response_tokens = sum(r["response_length/mean"] * ROWS_PER_STEP for r in timed)
    scores = [r["critic/score/mean"] for r in rows]
    summary = {
        "steps": len(rows),
        "s_per_step_median": statistics.median(seconds),
        "s_per_step_mean": total_s / len(seconds),
        "tokens_per_s": sum(r["perf/total_num_tokens"] for r in timed) / total_s,
        "response_tokens_per_s": response_tokens / total_s,
        "trainer_wait_share": statistics.mean(r.get("timing_s/gen", 0.0) / r["timing_s/step"] for r in timed),
        "score_last": scores[-1],
        "score_last3": statistics.mean(scores[-3:]),
        "wall_s": result["wall_s"],
    }
    idle = [r["fully_async/rollouter/idle_ratio"] for r in timed if "fully_async/rollouter/idle_ratio" in r]
    if idle:
        summary["engine_idle_share"] = statistics.mean(idle)
    return summary


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=10, help="training steps per mode")
    p.add_argument("--modes", nargs="+", default=["sync", "one_step_off"], choices=["sync", "one_step_off"])
    p.add_argument("--rollout_mode", choices=["sync", "async"], default="sync",
                   help="vLLM in the trainer's process (sync) or in its own (async)")
    p.add_argument("--trainer_threads", type=int, default=1, help="one_step_off: the trainer's torch threads (0: default)")
    p.add_argument("--engine_threads", type=int, default=1, help="one_step_off: rollout.cpu_threads")
    p.add_argument("--data_dir", default=None, help="arithmetic parquet folder (default: the main job's)")
    p.add_argument("--out_dir", default=None, help="run folders and logs (default: a new temporary folder)")
    args, extra = p.parse_known_args(argv)
    if args.steps < 2:
        p.error("--steps must be >= 2 (step 1 is not timed)")
    out_dir = args.out_dir or tempfile.mkdtemp(prefix="hybridrl-one-step-off-")
    os.makedirs(out_dir, exist_ok=True)
    results = {}
    for mode in args.modes:
        print(f"{mode}: {args.steps} steps (log: {os.path.join(out_dir, mode + '.log')}) ...", flush=True)
        results[mode] = summarize(run_mode(mode, args, extra, out_dir))
    keys = list(dict.fromkeys(k for summary in results.values() for k in summary))
    print(f"\nmain job, vLLM ({args.rollout_mode} mode), {args.steps} steps; timed: steps 2..{args.steps}")
    print(f"{'':24s}" + "".join(f"{mode:>14s}" for mode in results))
    for key in keys:
        print(f"{key:24s}" + "".join(f"{results[m].get(key, float('nan')):14.3f}" for m in results))
    if len(results) == 2:
        sync, off = results["sync"], results["one_step_off"]
        print(f"one_step_off / sync: {off['tokens_per_s'] / sync['tokens_per_s']:.2f}x tokens per wall-second, "
              f"{off['s_per_step_median'] / sync['s_per_step_median']:.2f}x median seconds per step")
    return results


if __name__ == "__main__":
    main()
