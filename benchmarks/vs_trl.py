"""hybridrl's GRPO against TRL's ``GRPOTrainer`` on the identical configuration, on this CPU.

Both train SmolLM2-135M-Instruct (the same local HF folder, fp32 master weights, bf16
autocast compute) on the same GSM8K prompts (hybridrl's preprocess, in file order), with the
same prompt batch, group size, response length, sampling (temperature 1, no top-k/top-p),
loss (clip 0.2, token-mean over the batch, group-normalised advantages, k3 KL to the reference
with coefficient ``--kl_coef``), micro batch and optimizer (AdamW, constant lr, weight decay
0.01, grad clip 1), for ``--warmup`` + ``--steps`` steps. Each runs in its own process, one
after the other; the timed steps give, for each:

- tokens per CPU-second: valid prompt + response tokens of the timed steps / CPU seconds of
  the process and its children over those steps (``resource.getrusage``);
- the peak resident memory (RSS) during the timed steps;

and their ratios. Every framework keeps its own defaults beyond these settings (hybridrl
generates on a bf16 copy of the policy; TRL generates with the fp32 training model).

Setup: ``pip install 'hybridrl[bench]'`` (TRL without letting pip touch torch:
``pip install trl --no-deps`` and then ``datasets``).

    python benchmarks/vs_trl.py                       # 8 prompts x 4, 128 tokens, 1 + 2 steps
    python benchmarks/vs_trl.py --steps 3 --response_length 256
    python benchmarks/vs_trl.py --rollout vllm        # hybridrl generating with vLLM (the vllm extra)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see generation.py; both frameworks get the same
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

FRAMEWORKS = ("hybridrl", "trl")


class StepMeter:
    """CPU seconds, wall seconds and tokens at the end of each step; peak RSS after the warm-up."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.marks: list[tuple[float, float, float]] = []  # (cpu s, wall s, tokens so far)

    def step_done(self, tokens_so_far: float) -> None:
        from common import cpu_seconds, reset_peak_rss

        self.marks.append((cpu_seconds(), time.perf_counter(), float(tokens_so_far)))
        if len(self.marks) == self.warmup:
            reset_peak_rss()

    def result(self) -> dict:
        from common import peak_rss_mib

        (cpu0, wall0, tok0), (cpu1, wall1, tok1) = self.marks[self.warmup - 1], self.marks[-1]
        return {
            "steps": len(self.marks) - self.warmup,
            "tokens": tok1 - tok0,
            "cpu_s": cpu1 - cpu0,
            "wall_s": wall1 - wall0,
            "peak_rss_mib": peak_rss_mib(),
        }


ROLLOUTS = {
    "hf": [],
    "vllm": ["actor_rollout_ref.rollout.name=vllm"],
    "vllm_async": ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.mode=async"],
}


def run_hybridrl(settings, parquet_dir: str, warmup: int, steps: int, rollout: str = "hf") -> dict:
    from common import build_hybridrl_grpo

    trainer, batches, groups = build_hybridrl_grpo(settings, parquet_dir, warmup + steps, ROLLOUTS[rollout])
    meter, tokens = StepMeter(warmup), 0.0
    try:
        for _ in range(warmup + steps):
            metrics = trainer.step(next(batches))
            trainer.global_steps += 1
            tokens += metrics["perf/total_num_tokens"]
            meter.step_done(tokens)
    finally:
        groups.shutdown()
    return meter.result()


def run_trl(settings, parquet_dir: str, warmup: int, steps: int) -> dict:
    import datasets
    import torch
    from common import MODEL
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from hybridrl.models import load_causal_lm, load_tokenizer, resolve_model_path
    from hybridrl.rewards import default_compute_score

    path = resolve_model_path(MODEL)
    torch.manual_seed(settings.seed)
    data = datasets.Dataset.from_parquet(os.path.join(parquet_dir, "train.parquet"))
    data = data.map(lambda row: {"ground_truth": row["reward_model"]["ground_truth"]})
    data = data.select_columns(["prompt", "ground_truth", "data_source"])

    def gsm8k_reward(completions, ground_truth, data_source, **_) -> list[float]:
        scores = [
            default_compute_score(src, c[0]["content"], gt)
            for c, gt, src in zip(completions, ground_truth, data_source)
        ]
        return [float(s["score"] if isinstance(s, dict) else s) for s in scores]

    rows = settings.prompts * settings.group
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-"),
        use_cpu=True,
        bf16=True,
        seed=settings.seed,
        per_device_train_batch_size=settings.micro_batch,
        gradient_accumulation_steps=rows // settings.micro_batch,
        num_generations=settings.group,
        max_completion_length=settings.response_length,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=settings.kl_coef,
        epsilon=settings.clip_ratio,
        loss_type="dapo",
        scale_rewards="group",
        num_iterations=1,
        learning_rate=settings.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=settings.weight_decay,
        max_grad_norm=settings.grad_clip,
        gradient_checkpointing=False,
        shuffle_dataset=False,
        max_steps=warmup + steps,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    meter = StepMeter(warmup)

    class Meter(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            meter.step_done(state.num_input_tokens_seen)

    trainer = GRPOTrainer(
        model=load_causal_lm(path),
        reward_funcs=gsm8k_reward,
        args=args,
        train_dataset=data,
        processing_class=load_tokenizer(path),
        callbacks=[Meter()],
    )
    trainer.train()
    return meter.result()


def child(framework: str, args) -> int:
    from common import GRPOSettings, gsm8k_parquet

    settings = GRPOSettings(
        prompts=args.prompts,
        group=args.group,
        response_length=args.response_length,
        micro_batch=args.micro_batch,
        kl_coef=args.kl_coef,
        lr=args.lr,
    )
    with tempfile.TemporaryDirectory() as tmp:
        parquet = gsm8k_parquet(tmp, train_size=args.prompts * (args.warmup + args.steps))
        if framework == "trl":
            result = run_trl(settings, parquet, args.warmup, args.steps)
        else:
            result = run_hybridrl(settings, parquet, args.warmup, args.steps, args.rollout)
    tmp_out = f"{args.json_out}.tmp"
    with open(tmp_out, "w") as f:
        json.dump(result, f)
    os.replace(tmp_out, args.json_out)
    return 0


def parent(args, argv: list[str]) -> int:
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for framework in args.frameworks:
            out = os.path.join(tmp, f"{framework}.json")
            print(f"running {framework} (load average {os.getloadavg()[0]:.1f}) ...", flush=True)
            cmd = [sys.executable, os.path.abspath(__file__), *argv, "--child", framework, "--json_out", out]
            code = subprocess.run(cmd, stdout=sys.stderr if args.quiet else None).returncode
            if code != 0:
                print(f"{framework} failed (exit {code})", file=sys.stderr)
                return code
            with open(out) as f:
                results[framework] = json.load(f)
    print(
        f"\nGRPO, SmolLM2-135M, {args.prompts} prompts x {args.group} responses, {args.response_length} new tokens, "
        f"micro batch {args.micro_batch}, kl_coef {args.kl_coef}; {args.steps} timed steps after {args.warmup}; "
        f"hybridrl's rollout: {args.rollout}"
    )
    print(f"{'framework':<10}{'tokens':>9}{'cpu s':>9}{'wall s':>9}{'tok/cpu-s':>11}{'peak RSS MiB':>14}")
    for name, r in results.items():
        print(
            f"{name:<10}{r['tokens']:>9.0f}{r['cpu_s']:>9.1f}{r['wall_s']:>9.1f}{r['tokens'] / r['cpu_s']:>11.1f}"
            f"{r['peak_rss_mib']:>14.0f}"
        )
    if len(results) == 2:
        h, t = results["hybridrl"], results["trl"]
        ratio = (h["tokens"] / h["cpu_s"]) / (t["tokens"] / t["cpu_s"])
        print(
            f"hybridrl / TRL: {ratio:.2f}x tokens per CPU-second, {h['peak_rss_mib'] / t['peak_rss_mib']:.2f}x peak RSS"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--response_length", type=int, default=128)
    parser.add_argument("--micro_batch", type=int, default=8)
    parser.add_argument("--kl_coef", type=float, default=0.04)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--frameworks", nargs="+", default=list(FRAMEWORKS), choices=FRAMEWORKS)
    parser.add_argument("--rollout", default="hf", choices=sorted(ROLLOUTS), help="hybridrl's rollout engine")
    parser.add_argument("--quiet", action="store_true", help="the frameworks' own output to stderr")
    parser.add_argument("--child", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    parser.add_argument("--json_out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    return child(args.child, args) if args.child else parent(args, argv)


if __name__ == "__main__":
    sys.exit(main())
