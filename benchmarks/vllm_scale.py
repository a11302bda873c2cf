"""Tensor parallelism and bucketed weight sync of the vLLM engine of its own process (issue 30, docs/rollout.md).

    python benchmarks/vllm_scale.py tp --model qwen0.5b --tp 1 2
    python benchmarks/vllm_scale.py sync --model 360m --buckets 64 256 2048 0

``tp``: for each tensor-parallel size, an engine (``AsyncVLLMRollout`` with
``rollout.tensor_model_parallel_size``) generates ``--new_tokens`` tokens (EOS ignored) for
``--prompts`` GSM8K prompts x ``--n`` samples; printed: start seconds, generated tokens per wall
second, and the resident memory of each of the engine's processes after generating.

``sync``: one engine; for each bucket (MB; 0: the whole state dict in one file, the path before
buckets) ``sync_weights`` of an fp32 actor's weights into the bf16 engine; printed: seconds, this
process's peak resident memory above its level before the sync (the cast tensors of a bucket), and
the peak size of the weights file in the RAM folder (``/dev/shm``).

Models: ``135m`` is the bundled SmolLM2-135M-Instruct; the others are random-init shapes of
benchmarks/scale.py. Run one at a time with nothing else heavy running; name the CPU kind.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import gsm8k_prompt_ids
from scale import model_folder


def _engine(model, tokenizer, tp: int, dtype: str, bucket_mb: int | None = None):
    from hybridrl.workers.rollout.vllm_async import AsyncVLLMRollout

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from tests.tiny_models import ppo_section

    rollout = {
        "name": "vllm",
        "mode": "async",
        "dtype": dtype,
        "prompt_length": 256,
        "response_length": 256,
        "tensor_model_parallel_size": tp,
        "kv_cache_memory_gb": 0.5,
        "enforce_eager": True,
        "calculate_log_probs": True,
    }
    if bucket_mb is not None:
        rollout["checkpoint_engine"] = {"update_weights_bucket_megabytes": bucket_mb}
    config = ppo_section("actor_rollout_ref.rollout", rollout)
    return AsyncVLLMRollout(model, config, tokenizer, None)


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))


def _load(name: str, dtype: str):
    from hybridrl.models import load_causal_lm, load_tokenizer

    folder = model_folder(name)
    return load_causal_lm(folder, dtype=dtype).eval(), load_tokenizer(folder)


def run_tp(args) -> list[dict]:
    import psutil

    from hybridrl.protocol import DataProto

    model, tokenizer = _load(args.model, args.dtype)
    ids = gsm8k_prompt_ids(tokenizer, args.prompts)
    width = max(map(len, ids))
    input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(i)) + i for i in ids])
    mask = (input_ids != tokenizer.pad_token_id).long()
    prompts = DataProto.from_dict(
        {"input_ids": input_ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)},
        meta_info={"response_length": args.new_tokens},
    ).repeat(args.n, interleave=True)
    rows = []
    for tp in args.tp:
        started = time.monotonic()
        engine = _engine(model, tokenizer, tp, args.dtype)
        engine.config.ignore_eos = True
        start_s = time.monotonic() - started
        began = time.monotonic()
        out = engine.generate_sequences(prompts)
        wall = time.monotonic() - began
        tokens = int(out.batch["response_mask"].sum())
        rss = {f"{p.pid}:{p.name()}": round(_rss_mib(p.pid)) for p in psutil.Process().children(recursive=True)}
        engine.shutdown()
        row = {
            "bench": "tp",
            "model": args.model,
            "tp": tp,
            "dtype": args.dtype,
            "start_s": round(start_s, 1),
            "tokens": tokens,
            "tok_per_s": round(tokens / wall, 1),
            "engine_rss_mib": rss,
            "cpu": torch.backends.cpu.get_cpu_capability(),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def _folder_mib(folder: str) -> float:
    total = 0
    for name in os.listdir(folder):
        try:
            total += os.path.getsize(os.path.join(folder, name))
        except OSError:  # replaced meanwhile
            continue
    return total / 2**20


def run_sync(args) -> list[dict]:
    model, tokenizer = _load(args.model, args.actor_dtype)  # the actor's dtype: cast to the engine's per bucket
    engine = _engine(model, tokenizer, 1, args.dtype)
    rows = []
    for mb in args.buckets:
        engine.bucket_bytes = mb * 2**20 if mb else 2**62
        base, peak, ram, done = _rss_mib(os.getpid()), [0.0], [0.0], threading.Event()

        def watch(base=base, peak=peak, ram=ram, done=done):
            while not done.is_set():
                peak[0] = max(peak[0], _rss_mib(os.getpid()) - base)
                ram[0] = max(ram[0], _folder_mib(engine._folder.name))
                time.sleep(0.002)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        began = time.monotonic()
        engine.sync_weights(model)
        seconds = time.monotonic() - began
        done.set()
        watcher.join()
        row = {
            "bench": "sync",
            "model": args.model,
            "dtype": args.dtype,
            "bucket_mb": mb or "whole",
            "sync_s": round(seconds, 2),
            "actor_dtype": args.actor_dtype,
            "peak_above_mib": round(peak[0]),
            "ram_folder_peak_mib": round(ram[0]),
            "cpu": torch.backends.cpu.get_cpu_capability(),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    engine.shutdown()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("tp", "sync"))
    parser.add_argument("--model", default="135m")
    parser.add_argument("--dtype", default="bf16", help="the engine's dtype")
    parser.add_argument("--actor_dtype", default="fp32", help="sync: the weights' dtype before the cast")
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--buckets", type=int, nargs="+", default=[64, 256, 2048, 0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--new_tokens", type=int, default=128)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "vllm_scale.jsonl"))
    args = parser.parse_args(argv)
    rows = run_tp(args) if args.what == "tp" else run_sync(args)
    with open(args.out, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
