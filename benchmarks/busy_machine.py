"""The main job on a busy machine (issue 33 item 7): seconds per step alone and beside one
single-threaded busy process (``python -c "while True: pass"``). The goal: at most 2.0x.

Runs ``examples/run_arithmetic_grpo.sh`` (its keys; the vLLM engine when installed, else hf;
``--rollout`` picks) for ``--steps`` steps without validation or checkpoints, each run in its own
process, in these variants (``--variants``):

- ``alone``: nothing else started;
- ``busy``: beside one busy process that the script starts before the run and kills after it
  (the busy process also ends by itself after ``--timeout_s`` + 60 s, should the script die);
- ``busy_off``: the same, with hybridrl's mechanism off (``HYBRIDRL_AUTO_THREADS=0``, and
  ``OMP_WAIT_POLICY`` empty, which OpenMP ignores: its own default wait) - the "before" number.

It prints, and writes as JSON (``--out``): s/step per variant (median of ``perf/time_per_step``
after the first step; all steps when there is one), the ratios to ``alone``, the CPU (torch's
capability, ``/proc/cpuinfo``'s model name, the allowed cores), the load average before each run,
and the threads hybridrl picked (its ``hybridrl: N of M cores busy at start-up ...`` lines, and
re-check lines; none: all cores). Other processes on the machine spoil the numbers: run it on a
quiet machine. Extra ``key=value`` arguments go to every run after the script's own (they win).

    python benchmarks/busy_machine.py                                  # 4 steps, alone and busy
    python benchmarks/busy_machine.py --steps 6 --variants alone,busy,busy_off --out busy.json
    python benchmarks/busy_machine.py --steps 1 --rollout hf data.train_batch_size=4 \\
        actor_rollout_ref.rollout.n=2 data.max_response_length=8 actor_rollout_ref.actor.ppo_mini_batch_size=4 \\
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4    # a quick check of the script itself
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(REPO, "examples", "run_arithmetic_grpo.sh")
VARIANTS = ("alone", "busy", "busy_off")
GOAL = 2.0


def cpu_facts() -> dict:
    """The CPU the numbers come from."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    try:
        import torch

        capability = torch.backends.cpu.get_cpu_capability()
    except Exception as exc:  # noqa: BLE001 - a fact we could not read
        capability = f"unknown ({type(exc).__name__})"
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count()
    return {"model_name": model, "torch_cpu_capability": capability, "allowed_cores": cores}


def start_busy(deadline_s: float) -> subprocess.Popen:
    """One single-threaded busy process, which also stops by itself after ``deadline_s``."""
    code = f"import time\nend = time.monotonic() + {deadline_s:.0f}\nwhile time.monotonic() < end: pass\n"
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)


def overrides(args, run_dir: str) -> list[str]:
    return [
        f"trainer.total_training_steps={args.steps}",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        f"trainer.default_local_dir={run_dir}",
        "trainer.logger=['console','file']",
        "trainer.resume_mode=disable",
        f"actor_rollout_ref.rollout.name={args.rollout}",
    ]


def variant_env(variant: str, args) -> dict:
    env = dict(os.environ, ROLLOUT=args.rollout)
    if args.data_dir:
        env["DATA_DIR"] = args.data_dir
    if variant == "busy_off":
        env["HYBRIDRL_AUTO_THREADS"] = "0"
        env["OMP_WAIT_POLICY"] = ""
    return env


def thread_lines(log_path: str) -> list[str]:
    """hybridrl's lines about the threads it picked (start-up) or changed (re-checks)."""
    with open(log_path, errors="replace") as f:
        return [
            line.strip()
            for line in f
            if line.startswith("hybridrl: ") and ("cores busy at start-up" in line or "torch threads" in line)
        ]


def run_variant(variant: str, args, extra: list[str], out_dir: str) -> dict:
    """Trains the job once in ``variant``; returns its seconds per step and what hybridrl picked."""
    run_dir = os.path.join(out_dir, variant)
    log_path = os.path.join(out_dir, f"{variant}.log")
    command = ["bash", JOB, *overrides(args, run_dir), *extra]
    load_before = os.getloadavg()[0]
    busy = start_busy(args.timeout_s + 60) if variant.startswith("busy") else None
    started = time.perf_counter()
    try:
        if busy is not None:
            time.sleep(1.0)  # the busy process is running before hybridrl samples the cores
        with open(log_path, "w") as log:
            proc = subprocess.run(
                command,
                env=variant_env(variant, args),
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=args.timeout_s,
            )
    except subprocess.TimeoutExpired:
        sys.exit(f"{variant}: the run took more than --timeout_s={args.timeout_s}; see {log_path}")
    finally:
        stop(busy)
    wall_s = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"{variant}: the run failed (exit {proc.returncode}); see {log_path}")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    steps = [r["perf/time_per_step"] for r in rows if r.get("step", 0) >= 1 and "perf/time_per_step" in r]
    timed = steps[1:] or steps
    return {
        "s_per_step": statistics.median(timed) if timed else None,
        "step_s": steps,
        "wall_s": wall_s,
        "load_before": load_before,
        "thread_lines": thread_lines(log_path),
        "log": log_path,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--variants", default="alone,busy", help=f"comma-separated, of {','.join(VARIANTS)}")
    default_rollout = "vllm" if importlib.util.find_spec("vllm") else "hf"
    parser.add_argument("--rollout", choices=("vllm", "hf"), default=default_rollout)
    parser.add_argument("--data_dir", default=None, help="the job's DATA_DIR (default: the script's)")
    parser.add_argument("--timeout_s", type=float, default=3600.0, help="deadline of each run")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--keep", action="store_true", help="keep the run folders and logs")
    parser.add_argument("--dry_run", action="store_true", help="print the commands and exit")
    args, extra = parser.parse_known_args(argv)
    unknown = [a for a in extra if a.startswith("--")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not args.variants or set(args.variants) - set(VARIANTS):
        parser.error(f"--variants: comma-separated names of {', '.join(VARIANTS)}")
    if args.dry_run:
        for variant in args.variants:
            env = {k: v for k, v in variant_env(variant, args).items() if os.environ.get(k) != v}
            busy = " (beside: python -c 'while True: pass')" if variant.startswith("busy") else ""
            print(f"{variant}{busy}: {env} bash {JOB} {' '.join(overrides(args, '<dir>/' + variant) + extra)}")
        return 0
    out_dir = tempfile.mkdtemp(prefix="hybridrl-busy-machine-")
    results = {
        "cpu": cpu_facts(),
        "rollout": args.rollout,
        "steps": args.steps,
        "extra": extra,
        "goal_ratio": GOAL,
        "variants": {},
    }
    for variant in args.variants:
        print(f"busy_machine: {variant} ...", flush=True)
        results["variants"][variant] = run_variant(variant, args, extra, out_dir)
    alone = results["variants"].get("alone", {}).get("s_per_step")
    for name, result in results["variants"].items():
        ratio = result["s_per_step"] / alone if alone and result["s_per_step"] else None
        result["ratio_to_alone"] = ratio
        picked = "; ".join(result["thread_lines"]) or "all cores (no line)"
        shown = f"{ratio:.2f}x" if ratio else "-"
        per_step = f"{result['s_per_step']:.2f}" if result["s_per_step"] else "-"
        print(
            f"{name:9} {per_step} s/step ({shown}); steps {[round(s, 1) for s in result['step_s']]}; "
            f"load before {result['load_before']:.1f}; threads: {picked}"
        )
    busy = results["variants"].get("busy", {}).get("ratio_to_alone")
    if busy:
        print(f"busy / alone: {busy:.2f}x (goal <= {GOAL}x): {'met' if busy <= GOAL else 'NOT met'}")
    cpu = results["cpu"]
    print(
        f"CPU: {cpu['model_name']}, {cpu['torch_cpu_capability']}, {cpu['allowed_cores']} cores; rollout {args.rollout}"
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    if args.keep:
        print(f"runs kept in {out_dir}")
    else:
        import shutil

        shutil.rmtree(out_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
