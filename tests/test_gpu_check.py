"""benchmarks/gpu_check.py, as CI runs it (``--device cpu --quick``), so the GPU check cannot rot
between the sessions that are lent a GPU (docs/gpu.md)."""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "gpu_check.py")

pytestmark = pytest.mark.slow  # training runs in subprocesses


def test_quick_cpu_check_writes_every_number_of_the_report(tmp_path):
    out = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, SCRIPT, "--device", "cpu", "--quick", "--out", str(out), "--work-dir", str(tmp_path / "w")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = json.loads(out.read_text())
    assert done.returncode == 0, (report.get("failed_phases"), done.stdout[-3000:], done.stderr[-3000:])
    phases = {"env", "peak", "model_step", "train", "numerics", "resume"}
    assert report["failed_phases"] == [] and set(report["phases"]) == phases
    assert report["device"] == "cpu" and report["attention_kernel"] == "sdpa"
    assert report["peak_bf16_tflops"] > 0
    assert report["generation_tokens_per_s"] > 0 and report["update_tokens_per_s"] > 0
    assert 0 < report["update_mfu"] < 1
    assert 0 < report["model_step_mfu"] < 1 and 0 < report["model_step_bf16_mfu"] < 1
    assert 0 < report["framework_floor_ms"] < 1e3 * report["phases"]["model_step"]["model_step_s"]
    assert report["peak_memory_gb"] > 0 and report["plan_gb"] > 0
    assert 0 <= report["logprob_max_abs_diff_vs_cpu_fp32"] < 1
    assert report["resume_exact"] is True and report["phases"]["resume"]["compared_keys"] > 10


def test_cuda_without_a_gpu_is_one_usage_line(tmp_path):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    done = subprocess.run(
        [sys.executable, SCRIPT, "--device", "cuda", "--out", str(tmp_path / "r.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith("--device cuda: torch sees no CUDA device here")
