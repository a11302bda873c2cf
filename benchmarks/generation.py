"""Which transformers generation path is fastest for the rollout on this device.

Generates ``--new_tokens`` tokens for ``--prompts`` GSM8K prompts x ``--n`` samples (the rows
the trainer hands the rollout: each prompt repeated ``n`` times, interleaved) with
SmolLM2-135M-Instruct in bf16, sampling at temperature 1 and never stopping at EOS (so every
mode does the same work), and prints wall seconds, process CPU seconds and tokens per second
for each mode:

- ``dynamic``: ``generate`` with the default DynamicCache (the HF rollout's path);
- ``static``: ``cache_implementation="static"`` (pre-allocated KV cache);
- ``static_compile``: static cache + ``torch.compile`` of the decoding forward (inductor);
- ``return_sequences``: the ``prompts`` rows once, ``num_return_sequences=n``;
- ``continuous``: ``generate_batch`` (continuous batching with a paged KV cache);
- ``fast``: ``dynamic`` with hybridrl's ``rollout.fast_decoding`` (``hybridrl.models.attention``
  and the sampler of ``hybridrl.workers.rollout.decoding``), the HF engine's default;
- ``vllm``: hybridrl's vLLM engine (``rollout.name=vllm``, in-process, eager), with
  ``--vllm_threads`` torch threads while it generates (needs the ``vllm`` extra);
- ``vllm_async``: the same with ``rollout.mode=async`` (vLLM's async engine in a child process,
  one request per prompt; its CPU seconds are counted with this process's).

    python benchmarks/generation.py                          # all modes, batch 64, 256 tokens
    python benchmarks/generation.py --modes dynamic static --repeats 3
    python benchmarks/generation.py --modes fast vllm --dtype float32 --prompts 8 --n 4 --new_tokens 128
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

# Idle OpenMP threads sleep instead of spinning: on a shared CPU spinning threads fight the other
# processes for cores (10x slower decoding measured at load 10). Must be set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import cpu_seconds, gsm8k_prompt_ids, load_smollm2

MODES = ("dynamic", "fast", "static", "static_compile", "return_sequences", "continuous", "vllm", "vllm_async")
_VLLM: dict = {}  # mode -> its one vLLM engine (vLLM keeps the in-process engine's state in module globals)


def vllm_tokens(
    model, tokenizer, rows: list[list[int]], new_tokens: int, threads: int | None, mode: str = "vllm"
) -> int:
    """Generates with hybridrl's vLLM engine of ``mode`` (built once); returns the number of new tokens."""
    from omegaconf import OmegaConf

    from hybridrl.protocol import DataProto
    from hybridrl.workers.rollout import get_rollout_cls

    if mode not in _VLLM:
        dtype = "bf16" if next(model.parameters()).dtype == torch.bfloat16 else "fp32"
        cfg = OmegaConf.create(
            {
                "dtype": dtype,
                "prompt_length": 512,
                "response_length": 1024,
                "ignore_eos": True,
                "cpu_threads": threads,
                "max_num_seqs": 1024,
            }
        )
        cls = get_rollout_cls("vllm", "async" if mode == "vllm_async" else "sync")
        _VLLM[mode] = cls(model, cfg, tokenizer, model.generation_config)
    engine = _VLLM[mode]
    ids, mask = left_pad(rows, tokenizer.pad_token_id)
    prompts = DataProto.from_dict(
        {"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(1) - 1},
        meta_info={"response_length": new_tokens, "temperature": 1.0, "top_k": -1, "top_p": 1.0},
    )
    return int(engine.generate_sequences(prompts).batch["response_mask"].sum())


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.tensor([[pad_id] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def run_mode(
    mode: str, model, prompt_rows: list[list[int]], n: int, new_tokens: int, tokenizer, vllm_threads: int | None = None
) -> int:
    """Generates once in ``mode``; returns the number of new tokens produced."""
    from transformers import CompileConfig, GenerationConfig

    pad_id = tokenizer.pad_token_id
    if mode.startswith("vllm"):
        return vllm_tokens(model, tokenizer, [r for r in prompt_rows for _ in range(n)], new_tokens, vllm_threads, mode)
    sampling = dict(
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        eos_token_id=None,
        pad_token_id=pad_id,
    )
    rows = [r for r in prompt_rows for _ in range(n)]
    if mode == "continuous":
        from transformers import ContinuousBatchingConfig

        # Size the paged KV cache for this batch (its default takes 90% of free memory).
        pages = len(rows) * (-(-(max(map(len, rows)) + new_tokens) // 64))
        cb = ContinuousBatchingConfig(page_size=64, num_blocks=pages, max_batch_tokens=2048)
        out = model.generate_batch(
            rows, generation_config=GenerationConfig(**sampling), continuous_batching_config=cb, progress_bar=False
        )
        return sum(len(o.generated_tokens) for o in out.values())
    extra = {}
    if mode in ("static", "static_compile"):
        extra["cache_implementation"] = "static"
    if mode == "static_compile":
        compile_config = CompileConfig(fullgraph=False, mode="default")
        compile_config._compile_all_devices = True  # transformers compiles on CUDA only unless told
        extra["compile_config"] = compile_config
    if mode == "return_sequences":
        rows, extra["num_return_sequences"] = prompt_rows, n
    kwargs = {}
    if mode == "fast":
        from transformers import LogitsProcessorList

        from hybridrl.models.attention import register_attention
        from hybridrl.workers.rollout.decoding import InverseCDFSampler

        model.set_attn_implementation(register_attention())
        sampler = InverseCDFSampler(sampling.pop("temperature"), sampling.pop("top_k"), sampling.pop("top_p"))
        sampling["do_sample"] = False
        kwargs["logits_processor"] = LogitsProcessorList([sampler])
    ids, mask = left_pad(rows, pad_id)
    try:
        out = model.generate(
            input_ids=ids, attention_mask=mask, generation_config=GenerationConfig(**sampling, **extra), **kwargs
        )
    finally:
        model.set_attn_implementation("sdpa")
    return out[:, ids.shape[1] :].numel()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4, help="samples per prompt; batch = prompts x n")
    parser.add_argument("--new_tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per mode after one warm-up run")
    parser.add_argument("--warmup_tokens", type=int, default=16, help="new tokens of the untimed warm-up run")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--vllm_threads", type=int, default=None, help="vllm mode: torch threads while generating")
    args = parser.parse_args(argv)

    model, tokenizer = load_smollm2(getattr(torch, args.dtype))
    prompt_rows = gsm8k_prompt_ids(tokenizer, args.prompts)
    print(
        f"batch {args.prompts} prompts x n={args.n} = {args.prompts * args.n} rows, {args.new_tokens} new tokens, "
        f"{args.dtype}, {torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    print(f"{'mode':<18}{'wall s':>10}{'cpu s':>10}{'tok/s':>10}{'tok/cpu-s':>11}   runs (wall s)")
    for mode in args.modes:
        torch.manual_seed(0)
        try:  # warm-up: compilation, allocator, first-call overheads
            run_mode(mode, model, prompt_rows, args.n, args.warmup_tokens, tokenizer, args.vllm_threads)
        except Exception as exc:  # noqa: BLE001 - a mode this device cannot run is reported, not fatal
            print(f"{mode:<18}failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}", flush=True)
            continue
        walls, cpus, tokens = [], [], 0
        for _ in range(args.repeats):
            wall0, cpu0 = time.perf_counter(), cpu_seconds()
            with torch.no_grad():
                tokens = run_mode(mode, model, prompt_rows, args.n, args.new_tokens, tokenizer, args.vllm_threads)
            walls.append(time.perf_counter() - wall0)
            cpus.append(cpu_seconds() - cpu0)
        wall, cpu = statistics.median(walls), statistics.median(cpus)
        print(
            f"{mode:<18}{wall:>10.1f}{cpu:>10.1f}{tokens / wall:>10.1f}{tokens / cpu:>11.1f}   "
            f"{' '.join(f'{w:.1f}' for w in walls)}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
