"""On-policy distillation against GRPO on the main job's task, from the same start (issue 32, docs/distillation.md).

    python benchmarks/opd_compare.py --teacher ~/models/arith_teacher --steps 12 --test_freq 4

Runs, each as ``bash examples/...`` in a subprocess with the same sizes, seed and steps:

- ``opd_k1``: examples/run_arithmetic_opd.sh (k1 reverse KL as a per-token reward, no task reward);
- ``gkd_topk``: the same with ``loss_mode=forward_kl_topk`` (top 16) as a direct loss;
- ``grpo``: examples/run_arithmetic_grpo.sh (the task reward alone).

Printed per run (one JSON line, also appended to ``--out``): the validation score at each test step,
the first step whose validation reaches 90% of the teacher's (``--teacher_score``), the CPU seconds of
the run (its process tree), the median step time and, for the distillation runs, the teacher stage's
median share of the step. Run one at a time with nothing else heavy running; name the CPU kind.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VAL_KEY = "val-core/arithmetic/reward/mean@1"
RUNS = {
    "opd_k1": ("run_arithmetic_opd.sh", []),
    "gkd_topk": (
        "run_arithmetic_opd.sh",
        [
            "distillation.distillation_loss.loss_mode=forward_kl_topk",
            "distillation.distillation_loss.use_policy_gradient=false",
            "distillation.distillation_loss.topk=16",
        ],
    ),
    "grpo": ("run_arithmetic_grpo.sh", []),
}


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(name: str, args, out_dir: str) -> dict:
    script, extra = RUNS[name]
    overrides = [
        f"trainer.total_training_steps={args.steps}",
        f"trainer.test_freq={args.test_freq}",
        "trainer.save_freq=-1",
        f"trainer.default_local_dir={out_dir}",
        "trainer.logger=['file']",
        *extra,
    ]
    env = {**os.environ, "TEACHER": os.path.expanduser(args.teacher)}
    before = _children_cpu_s()
    subprocess.run(["bash", os.path.join(ROOT, "examples", script), *overrides], check=True, env=env, cwd=ROOT)
    cpu_s = _children_cpu_s() - before
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    val = {row["step"]: row[VAL_KEY] for row in rows if VAL_KEY in row}
    target = 0.9 * args.teacher_score
    steps = [row["timing_s/step"] for row in rows if "timing_s/step" in row]
    shares = [row["timing_s/teacher"] / row["timing_s/step"] for row in rows if "timing_s/teacher" in row]
    return {
        "run": name,
        "steps": args.steps,
        "val": val,
        "first_step_at_90pct_teacher": next((step for step, score in sorted(val.items()) if score >= target), None),
        "teacher_score": args.teacher_score,
        "cpu_s": round(cpu_s),
        "step_s_median": round(statistics.median(steps), 1) if steps else None,
        "teacher_share_median": round(statistics.median(shares), 3) if shares else None,
        "cpu": torch.backends.cpu.get_cpu_capability(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", required=True, help="the teacher's HF folder (hybridrl merge of a GRPO run)")
    parser.add_argument("--teacher_score", type=float, required=True, help="the teacher's validation score")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--test_freq", type=int, default=4)
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "opd_compare.jsonl"))
    args = parser.parse_args(argv)
    for name in args.runs:
        with tempfile.TemporaryDirectory(prefix=f"opd-{name}-") as out_dir:
            row = run(name, args, out_dir)
        print(json.dumps(row), flush=True)
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
