"""Memory and time of GRPO at model sizes beyond the bundled 135M, on this machine (docs/scale.md).

    python benchmarks/scale.py --model 360m --workers 2 [--lora 16] [--steps 2] [--response-length 48]
                               [--sp 2] [--out benchmarks/results/scale.jsonl]

Each run is the main job's GRPO step (generated arithmetic, ``rollout.n=4``) through ``hybridrl
train`` in a subprocess, on 1 (in-process) or 2 (Ray + FSDP2) CPU workers. Models beyond 135M are
random-init from their config.json shapes with the bundled SmolLM2 tokenizer: they measure memory
and time and learn nothing. Recorded per run (one JSON line):

- ``startup_peak_gb``: the busiest worker's peak resident memory once every role is built
  (the trainer's "workers built" line) - the start-up peak;
- ``peak_gb``: ``perf/max_memory_allocated_gb`` after the last step (the busiest worker's peak
  over the whole run; on CPU its peak RSS);
- ``plan_gb``: ``hybridrl plan``'s ``per_device_gb`` for the same overrides, and ``plan_error``
  = plan / peak - 1;
- ``s_per_step`` (mean of ``timing_s/step`` after the first step), the exit code and the wall time.

Run one at a time with nothing else heavy running; name the CPU kind with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

# SmolLM2's published config.json shapes (HuggingFaceTB/SmolLM2-{360M,1.7B}); 135M is the real model.
SHAPES = {
    "360m": {
        "hidden_size": 960,
        "intermediate_size": 2560,
        "num_hidden_layers": 32,
        "num_attention_heads": 15,
        "num_key_value_heads": 5,
    },
    "1.7b": {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 24,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
    },
    # a small body whose heads SP=2 divides (SmolLM2-135M has 9), for long-response sweeps on 2 cores
    "sp-small": {
        "hidden_size": 512,
        "intermediate_size": 1536,
        "num_hidden_layers": 12,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
    },
    # Qwen2.5-0.5B's body (14 heads, 2 KV heads: Ulysses SP=2 divides them), SmolLM2's vocabulary
    "qwen0.5b": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
    },
}
CACHE = os.path.join(os.path.expanduser("~"), ".cache", "hybridrl", "bench_models")


def model_folder(name: str) -> str:
    """The model's HF folder: the bundled 135M, or a random-init model of ``SHAPES[name]`` (bf16
    safetensors, written once into the cache)."""
    from hybridrl.models import load_tokenizer, resolve_model_path

    real = resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct")
    if name == "135m":
        return real
    folder = os.path.join(CACHE, name)
    if os.path.isfile(os.path.join(folder, "config.json")):
        return folder
    from transformers import AutoConfig, LlamaForCausalLM

    config = AutoConfig.from_pretrained(real)
    for key, value in SHAPES[name].items():
        setattr(config, key, value)
    config.head_dim = config.hidden_size // config.num_attention_heads
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    tmp = tempfile.mkdtemp(prefix=f".{name}-", dir=os.path.dirname(folder) if os.path.isdir(CACHE) else None)
    model.save_pretrained(tmp)
    load_tokenizer(real).save_pretrained(tmp)
    os.makedirs(CACHE, exist_ok=True)
    os.replace(tmp, folder)
    return folder


def overrides(args, model: str, data_dir: str, out_dir: str) -> list[str]:
    """The main job's GRPO keys for this run (examples/run_arithmetic_grpo.sh, shorter)."""
    a, r = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    keys = [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={data_dir}/train.parquet",
        f"data.val_files={data_dir}/test.parquet",
        f"data.train_batch_size={args.prompts}",
        "data.max_prompt_length=128",
        f"data.max_response_length={args.response_length}",
        f"actor_rollout_ref.model.path={model}",
        f"actor_rollout_ref.model.lora_rank={args.lora}",
        f"actor_rollout_ref.model.enable_gradient_checkpointing={args.gradient_checkpointing}",
        f"{a}.optim.lr=1e-5",
        f"{a}.ppo_mini_batch_size={args.prompts}",
        f"{a}.ppo_micro_batch_size_per_gpu={args.micro_batch}",
        f"{a}.use_kl_loss={args.kl}",
        f"{a}.ulysses_sequence_parallel_size={args.sp}",
        f"{r}.name=hf",
        f"{r}.n=4",
        f"{r}.log_prob_micro_batch_size_per_gpu={args.micro_batch}",
        "trainer.device=cpu",
        f"trainer.n_gpus_per_node={args.workers}",
        f"trainer.total_training_steps={args.steps}",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=['console','file']",
        f"trainer.default_local_dir={out_dir}",
        "trainer.project_name=bench",
        f"trainer.experiment_name=scale_{args.model}_{args.workers}w",
    ]
    if args.lora:
        keys.append("actor_rollout_ref.model.lora_alpha=32")
    return keys + list(args.set)


def plan_gb(keys: list[str]) -> float | None:
    """``hybridrl plan``'s ``per_device_gb`` for ``keys`` (None when it fails)."""
    out = subprocess.run(
        [sys.executable, "-m", "hybridrl.cli", "plan", *keys, "--json"], capture_output=True, text=True, timeout=300
    )
    try:
        return float(json.loads(out.stdout)["per_device_gb"])
    except (ValueError, KeyError):
        print(out.stdout[-2000:], out.stderr[-2000:], file=sys.stderr)
        return None


def run(args) -> dict:
    from hybridrl.data.preprocess import arithmetic

    model = model_folder(args.model)
    with tempfile.TemporaryDirectory(prefix="hybridrl-scale-") as tmp:
        data_dir = os.path.join(tmp, "data")
        arithmetic.main(["--local_dir", data_dir])
        keys = overrides(args, model, data_dir, os.path.join(tmp, "out"))
        planned = plan_gb(keys)
        start = time.time()
        proc = subprocess.run([sys.executable, "-m", "hybridrl.cli", "train", *keys], capture_output=True, text=True)
        wall = time.time() - start
        startup = next(
            (
                float(line.split("peak memory ")[1].split(" GB")[0])
                for line in proc.stdout.splitlines()
                if "workers built: peak memory" in line
            ),
            None,
        )
        metrics_file = os.path.join(tmp, "out", "metrics.jsonl")
        steps = [json.loads(line) for line in open(metrics_file)] if os.path.isfile(metrics_file) else []
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
    peak = steps[-1].get("perf/max_memory_allocated_gb") if steps else None
    timings = [s["timing_s/step"] for s in steps[1:] if "timing_s/step" in s] or [
        s["timing_s/step"] for s in steps if "timing_s/step" in s
    ]
    return {
        "model": args.model,
        "workers": args.workers,
        "lora": args.lora,
        "sp": args.sp,
        "set": args.set,
        "response_length": args.response_length,
        "gradient_checkpointing": args.gradient_checkpointing,
        "steps": len(steps),
        "exit": proc.returncode,
        "wall_s": round(wall, 1),
        "startup_peak_gb": startup,
        "peak_gb": peak,
        "plan_gb": planned,
        "plan_error": round(planned / peak - 1, 3) if planned and peak else None,
        "s_per_step": round(sum(timings) / len(timings), 1) if timings else None,
        "cpu": torch.backends.cpu.get_cpu_capability(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["135m", *SHAPES], default="135m")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--lora", type=int, default=0)
    parser.add_argument("--sp", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--response-length", type=int, default=48)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--kl", action="store_true", help="use_kl_loss: build the reference too")
    parser.add_argument("--set", nargs="*", default=[], help="more key=value overrides")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "scale.jsonl"))
    args = parser.parse_args(argv)
    result = run(args)
    print(json.dumps(result))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "a") as f:
        f.write(json.dumps(result) + "\n")
    return 0 if result["exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
