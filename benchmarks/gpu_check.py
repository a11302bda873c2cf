"""hybridrl on one device, checked and measured in one command (docs/gpu.md).

    python benchmarks/gpu_check.py --device cuda --out report.json [--quick] [--budget-s 460]

The models are random-init from the config files in ``benchmarks/gpu_models/`` (SmolLM2-135M's and
Qwen2.5-1.5B's shapes, SmolLM2's tokenizer): no weights travel, nothing is downloaded. Their final
norm weight is raised to 12, which gives next-token entropies of a few nats (a uniform ~11 nats
otherwise), so bf16 errors have realistic sizes. They measure kernels, memory, throughput and
numerics; they learn nothing and never emit EOS (every response is full length).

Phases, in order of value; each is bounded by the time left, each is recorded when it fails, and
the report is rewritten after every phase (a run killed at its limit still leaves one):

- ``env``: versions, the device, every command importable, the tokenizer read;
- ``peak``: the device's bf16 matmul peak (8192^3 on CUDA, 2048^3 on CPU), FLOP/s;
- ``model_step``: the plain HF model's forward and backward on the train phase's micro batch,
  without hybridrl, with its MFU, and the framework's floor per micro batch (gpu_model_step.py);
- ``train``: GRPO steps of the big shape (Qwen2.5-1.5B; SmolLM2-135M with ``--quick``) through
  hybridrl's trainer (local backend, HF engine) on the device: generation and update tokens/s,
  the update's MFU against the measured peak (useful FLOPs: ``common.forward_flops`` x 3), the
  device's peak memory, ``hybridrl plan``'s estimate for the same keys, the attention kernel;
- ``numerics``: the actor's log-probs (``compute_log_prob``) of the first step's first responses,
  from fresh workers over the initial weights: on the device with bf16 autocast over fp32 weights
  (as the train phase runs), on the device in fp32, and on the CPU in fp32 (the reference): the
  max abs difference over response tokens;
- ``resume``: SmolLM2-135M's shape, ``hybridrl train`` in fresh processes: 3 steps with a
  checkpoint at step 2, then step 3 again resumed from it; step 3's metrics compared.

``--quick`` (CI runs ``--device cpu --quick``: tests/test_gpu_check.py) shrinks every phase to
seconds: a 2-layer model of the same tokenizer, 2048^3 matmuls, 16-token responses. The report's
top-level keys: ``device``, ``peak_bf16_tflops``, ``generation_tokens_per_s``,
``update_tokens_per_s``, ``update_mfu``, ``model_step_mfu``, ``framework_floor_ms``,
``peak_memory_gb``, ``plan_gb``,
``logprob_max_abs_diff_vs_cpu_fp32`` (bf16) and ``..._fp32``, ``resume_exact``,
``attention_kernel``; per-phase details under ``phases``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import defaultdict

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "gpu_models")
sys.path.insert(0, HERE)
from common import forward_flops  # noqa: E402
from gpu_model_step import phase_model_step  # noqa: E402

SHAPES = {"tiny": "tiny", "135m": "smollm2-135m", "1.5b": "qwen2.5-1.5b"}
PHASES = ("env", "peak", "model_step", "train", "numerics", "resume")  # in this order
COMMANDS = (
    "hybridrl.cli",
    "hybridrl.trainer.main_ppo",
    "hybridrl.trainer.main_generation",
    "hybridrl.trainer.main_eval",
    "hybridrl.trainer.sft_trainer",
    "hybridrl.trainer.rm_trainer",
)
FINAL_NORM_WEIGHT = 12.0
NUMERICS_ROWS = 8  # rows of the first step's batch recomputed in fp32 (the CPU pass is the slow one)


class Clock:
    """Seconds left of the run's budget."""

    def __init__(self, budget_s: float) -> None:
        self.deadline = time.monotonic() + budget_s

    def left(self) -> float:
        return self.deadline - time.monotonic()


class Report:
    """The JSON report, rewritten after every phase."""

    def __init__(self, path: str, device: str) -> None:
        self.path = path
        self.data: dict = {"device": device, "phases": {}}

    def run(self, name: str, clock: Clock, min_s: float, fn, *args) -> dict | None:
        """Runs ``fn(*args) -> dict`` as phase ``name`` unless fewer than ``min_s`` seconds are left."""
        entry: dict = {}
        self.data["phases"][name] = entry
        if clock.left() < min_s:
            entry.update(ok=False, skipped=f"{clock.left():.0f} s left, the phase needs about {min_s:.0f}")
            print(f"[{name}] skipped: {entry['skipped']}", flush=True)
            self.write()
            return None
        start = time.perf_counter()
        print(f"[{name}] start ({clock.left():.0f} s left)", flush=True)
        try:
            result = fn(*args)
            entry.update(ok=True, **result)
        except Exception as exc:  # noqa: BLE001 - a phase's failure is a result, the next phases still run
            entry.update(ok=False, error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-4000:])
            print(traceback.format_exc(), flush=True)
            result = None
        entry["seconds"] = round(time.perf_counter() - start, 1)
        print(f"[{name}] {'ok' if entry['ok'] else 'FAILED'} in {entry['seconds']} s", flush=True)
        self.write()
        return result

    def write(self) -> None:
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1, default=str)
        os.replace(tmp, self.path)


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------------------- models
def write_tokenizer(folder: str) -> None:
    """SmolLM2's tokenizer files (``tokenizer.json`` is kept gzipped in the repo)."""
    src = os.path.join(MODELS, "tokenizer")
    with gzip.open(os.path.join(src, "tokenizer.json.gz"), "rb") as f, open(f"{folder}/tokenizer.json", "wb") as g:
        shutil.copyfileobj(f, g)
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(os.path.join(src, name), folder)


def build_model(shape: str, root: str, device: str) -> str:
    """A random-init HF folder of ``SHAPES[shape]`` (bf16 safetensors, seed 0) under ``root``;
    initialised on ``device`` (fast on a GPU), saved once, read by every phase."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = os.path.join(root, shape)
    if os.path.isfile(os.path.join(folder, "model.safetensors")) or os.path.isfile(
        os.path.join(folder, "model.safetensors.index.json")
    ):
        return folder
    os.makedirs(folder, exist_ok=True)
    shutil.copy(os.path.join(MODELS, f"{SHAPES[shape]}.json"), os.path.join(folder, "config.json"))
    write_tokenizer(folder)
    config = AutoConfig.from_pretrained(folder)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        model.model.norm.weight.fill_(FINAL_NORM_WEIGHT)
    model.to(torch.bfloat16).save_pretrained(folder)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return folder


# ----------------------------------------------------------------------------------------- phases
def phase_env(device: str) -> dict:
    import importlib
    import platform

    import transformers

    from hybridrl.models import load_tokenizer

    out = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_threads": torch.get_num_threads(),
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        out.update(
            gpu=props.name,
            gpu_memory_gb=round(props.total_memory / 1024**3, 1),
            capability=f"{props.major}.{props.minor}",
            bf16=torch.cuda.is_bf16_supported(),
        )
    out["flash_attn"] = importlib.util.find_spec("flash_attn") is not None
    out["torch_varlen_attn"] = importlib.util.find_spec("torch.nn.attention.varlen") is not None
    for module in ("vllm", "ray", "pydantic", "peft"):
        out[module] = importlib.util.find_spec(module) is not None
    for command in COMMANDS:
        importlib.import_module(command)
    out["commands_import"] = list(COMMANDS)
    with tempfile.TemporaryDirectory() as tmp:
        write_tokenizer(tmp)
        tokenizer = load_tokenizer(tmp)
        out["tokenizer_vocab"] = len(tokenizer)
    return out


def phase_peak(device: str, quick: bool) -> dict:
    """Best of a few timed blocks of ``size^3`` bf16 matmuls (FLOP/s)."""
    size = 2048 if device == "cpu" or quick else 8192
    a = torch.randn(size, size, dtype=torch.bfloat16, device=device)
    b = torch.randn(size, size, dtype=torch.bfloat16, device=device)
    reps = 2 if device == "cpu" else 20
    for _ in range(3):
        torch.mm(a, b)
    best = 0.0
    for _ in range(3 if quick else 5):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b)
        synchronize(device)
        best = max(best, reps * 2.0 * size**3 / (time.perf_counter() - start))
    return {"matmul_size": size, "peak_bf16_flops": best, "peak_bf16_tflops": round(best / 1e12, 1)}


def train_overrides(device: str, quick: bool, model: str, data: str, steps: int, extra: list[str]) -> list[str]:
    """GRPO keys of the ``train`` phase (the main job's, sized for the device)."""
    prompts, response, micro = (4, 16, 8) if quick else (32, 512, 8)
    a, r = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={data}/train.parquet",
        "data.val_files=null",
        "data.shuffle=false",
        f"data.train_batch_size={prompts}",
        "data.max_prompt_length=128",
        f"data.max_response_length={response}",
        f"actor_rollout_ref.model.path={model}",
        f"actor_rollout_ref.model.enable_gradient_checkpointing={quick}",
        f"{a}.optim.lr=1e-6",
        f"{a}.ppo_mini_batch_size={prompts}",
        f"{a}.ppo_micro_batch_size_per_gpu={micro}",
        f"{a}.use_kl_loss=false",
        f"{a}.entropy_coeff=0",
        f"{a}.fsdp_config.mixed_precision.param_dtype={'bf16' if device == 'cuda' else 'auto'}",
        f"{r}.name=hf",
        f"{r}.n=4",
        f"{r}.temperature=1.0",
        f"{r}.dtype=auto",
        f"{r}.log_prob_micro_batch_size_per_gpu={2 * micro}",
        f"trainer.device={device}",
        "trainer.backend=local",
        "trainer.n_gpus_per_node=1",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=['console']",
        f"trainer.total_training_steps={steps}",
        *extra,
    ]


def arithmetic_data(root: str) -> str:
    from hybridrl.data.preprocess import arithmetic

    folder = os.path.join(root, "arithmetic")
    if not os.path.isfile(os.path.join(folder, "train.parquet")):
        arithmetic.main(["--local_dir", folder, "--train_size", "512", "--test_size", "16"])
    return folder


def build_trainer(overrides: list[str], steps: int):
    """hybridrl's GRPO trainer as ``hybridrl train`` builds it; ``(trainer, batches, groups)``."""
    from hybridrl.algorithms.config import algo_config
    from hybridrl.config import load_config
    from hybridrl.data import RLHFDataset, create_rl_dataloader
    from hybridrl.models import load_tokenizer
    from hybridrl.rewards.load import load_reward_manager
    from hybridrl.trainer.ppo.config_check import validate_ppo_config
    from hybridrl.trainer.ppo.ppo_trainer import PPOTrainer
    from hybridrl.trainer.ppo.step_plan import make_step_plan
    from hybridrl.trainer.run.worker_groups import build_worker_groups

    config = load_config(overrides)
    algo = algo_config(config)
    for note in validate_ppo_config(config, algo=algo):
        print(f"hybridrl: note: {note}", flush=True)
    plan = make_step_plan(config, algo)
    torch.manual_seed(1)
    tokenizer = load_tokenizer(config.actor_rollout_ref.model.path)
    dataset = RLHFDataset(config.data.train_files, tokenizer, config.data)
    loader = create_rl_dataloader(dataset, batch_size=config.data.train_batch_size, shuffle=False, seed=1)
    groups = build_worker_groups(
        config, use_critic=False, use_reference=plan.use_reference_policy, total_training_steps=steps
    )
    trainer = PPOTrainer(
        config, tokenizer, groups.actor_rollout, None, load_reward_manager(config, tokenizer), None, loader, None,
        steps, algo=algo, plan=plan, n_workers=1,
    )  # fmt: skip
    return trainer, iter(loader), groups


class StageClock:
    """Wall seconds, tokens and useful FLOPs of the worker-group calls of one step; keeps the first
    rows of the first generation (the initial weights' responses) for the numerics phase."""

    STAGES = {"gen": "generate_sequences", "old_log_prob": "compute_log_prob", "update": "update_actor"}

    def __init__(self, group, model_config, device: str) -> None:
        self.step: dict = defaultdict(float)
        self.profile_path: str | None = None  # set: the next update runs under torch.profiler, its table written here
        self.first_rollout = None
        for stage, method in self.STAGES.items():
            self._wrap(group, stage, method, model_config, device)

    def _wrap(self, group, stage: str, method: str, model_config, device: str) -> None:
        call = getattr(group, method)

        def timed(data, **kwargs):
            synchronize(device)
            start = time.perf_counter()
            if stage == "update" and self.profile_path:
                out = profiled(call, data, kwargs, device, self.profile_path)
                self.profile_path = None
            else:
                out = call(data, **kwargs)
            synchronize(device)
            self.step[f"{stage}/s"] += time.perf_counter() - start
            if stage == "gen":
                self.step["gen/tokens"] += float(out.batch["response_mask"].sum())
                if self.first_rollout is None:
                    self.first_rollout = out[:NUMERICS_ROWS].to("cpu")
                return out
            mask = data.batch["attention_mask"]
            self.step[f"{stage}/tokens"] += float(mask.sum())
            if stage == "update":
                self.step["update/flops"] += 3 * forward_flops(model_config, mask, data.batch["response_mask"])
            return out

        setattr(group, method, timed)


def profiled(call, data, kwargs: dict, device: str, path: str):
    """``call(data, **kwargs)`` under torch.profiler; the operators' table (by device time, then by
    host time, 40 rows each) is written to ``path``."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        out = call(data, **kwargs)
        synchronize(device)
    averages = prof.key_averages()
    with open(path, "w") as f:
        if device == "cuda":
            f.write(averages.table(sort_by="self_cuda_time_total", row_limit=40) + "\n")
        f.write(averages.table(sort_by="self_cpu_time_total", row_limit=40) + "\n")
    return out


def plan_gb(overrides: list[str]) -> float | None:
    """``hybridrl plan``'s per-device GiB for the same keys."""
    from hybridrl.trainer.jobs.plan_cli import load_plan_config
    from hybridrl.trainer.jobs.plan_config import build_plan

    config, _ = load_plan_config(overrides)
    return float(build_plan(config).per_device_gb)


def phase_train(
    device: str, quick: bool, root: str, peak_flops: float | None, extra: list[str], state: dict, profile: str | None
) -> dict:
    from transformers import AutoConfig

    from hybridrl.models.attention import attention_kernel

    shape = "tiny" if quick else "1.5b"
    warmup, timed = (0, 1) if quick else (1, 2)
    model = build_model(shape, root, device)
    overrides = train_overrides(device, quick, model, arithmetic_data(root), warmup + timed, extra)
    out: dict = {"shape": SHAPES[shape], "overrides": overrides}
    try:
        out["plan_gb"] = plan_gb(overrides)
    except Exception as exc:  # noqa: BLE001 - the plan's failure is reported, the run goes on
        out["plan_error"] = f"{type(exc).__name__}: {exc}"
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    trainer, batches, groups = build_trainer(overrides, warmup + timed)
    try:
        worker = groups.actor_rollout.workers[0]
        module = worker.actor.actor_module
        out["attention_kernel"] = attention_kernel(module, device, packed=True)
        clock = StageClock(groups.actor_rollout, AutoConfig.from_pretrained(model), device)
        steps, metrics = [], {}
        for index in range(warmup + timed):
            clock.step = defaultdict(float)
            clock.profile_path = profile if index == warmup else None  # the first timed step: a cut run still has it
            metrics = trainer.step(next(batches)) or {}
            trainer.global_steps += 1
            print(f"step {index + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in clock.step.items() if k.endswith("/s")))
            if index >= warmup:
                steps.append(dict(clock.step))
        state["first_rollout"] = clock.first_rollout
        state["model"] = model
        state["overrides"] = overrides
    finally:
        groups.shutdown()
    stages = [s for s in ("gen", "old_log_prob", "update") if f"{s}/s" in steps[0]]  # old_log_prob: skipped on-policy
    rate = {s: sum(x[f"{s}/tokens"] for x in steps) / sum(x[f"{s}/s"] for x in steps) for s in stages}
    achieved = sum(x["update/flops"] for x in steps) / sum(x["update/s"] for x in steps)
    out.update(
        steps_timed=timed,
        step_seconds=[round(sum(v for k, v in x.items() if k.endswith("/s")), 2) for x in steps],
        generation_tokens_per_s=round(rate["gen"]),
        old_log_prob_tokens_per_s=round(rate["old_log_prob"]) if "old_log_prob" in rate else None,
        update_tokens_per_s=round(rate["update"]),
        update_tflops=round(achieved / 1e12, 2),
        update_mfu=round(achieved / peak_flops, 4) if peak_flops else None,
        metrics={k: v for k, v in metrics.items() if isinstance(v, (int, float))},
    )
    if device == "cuda":
        out["peak_memory_gb"] = round(torch.cuda.max_memory_allocated() / 1024**3, 2)
        out["peak_reserved_gb"] = round(torch.cuda.max_memory_reserved() / 1024**3, 2)
    else:
        out["peak_memory_gb"] = round(metrics.get("perf/max_memory_allocated_gb", float("nan")), 2)
    if out.get("plan_gb"):
        out["plan_error"] = round(out["plan_gb"] / out["peak_memory_gb"] - 1, 3)
    return out


def recompute_log_probs(overrides: list[str], batch, device: str, param_dtype: str):
    """The old log-probs of ``batch`` from a fresh actor worker on ``device`` in ``param_dtype``."""
    changed = [
        o for o in overrides if not o.startswith(("trainer.device=", "actor_rollout_ref.actor.fsdp_config.mixed"))
    ]
    changed += [
        f"trainer.device={device}",
        f"actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype={param_dtype}",
    ]
    trainer, _, groups = build_trainer(changed, 1)
    try:
        data = batch.to(device)
        data.meta_info.update(batch.meta_info)
        return groups.actor_rollout.compute_log_prob(data).batch["old_log_probs"].float().cpu()
    finally:
        groups.shutdown()
        del trainer


def phase_numerics(device: str, state: dict) -> dict:
    if state.get("first_rollout") is None:
        raise RuntimeError("no responses from the train phase to score")
    batch = state["first_rollout"]
    mask = batch.batch["response_mask"].bool()
    reference = recompute_log_probs(state["overrides"], batch, "cpu", "fp32")
    device_bf16 = recompute_log_probs(state["overrides"], batch, device, "bf16")

    def diff(values: torch.Tensor) -> dict:
        d = (values.float() - reference).abs()[mask]
        return {"max_abs": float(d.max()), "mean_abs": float(d.mean())}

    out = {
        "rows": int(mask.shape[0]),
        "tokens": int(mask.sum()),
        "reference_mean_log_prob": float(reference[mask].mean()),
    }
    out["device_bf16_vs_cpu_fp32"] = diff(device_bf16)
    if device == "cuda":
        out["device_fp32_vs_cpu_fp32"] = diff(recompute_log_probs(state["overrides"], batch, device, "fp32"))
    return out


def run_main_ppo(overrides: list[str], timeout_s: float) -> None:
    cmd = [sys.executable, "-m", "hybridrl.trainer.main_ppo", *overrides]
    # Both runs with the same CPU thread count (not one picked from the machine's load at each
    # start): a different count sums CPU matmuls in another order.
    env = {**os.environ, "HYBRIDRL_AUTO_THREADS": "0"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=max(timeout_s, 1), env=env)
    if done.returncode != 0:
        raise RuntimeError(f"hybridrl train exited {done.returncode}: {done.stdout[-1500:]}\n{done.stderr[-2500:]}")


def phase_resume(device: str, quick: bool, root: str, clock: Clock) -> dict:
    """Step 3 of a straight 3-step run against step 3 resumed from its step-2 checkpoint in a fresh
    process (as a user resumes)."""
    model = build_model("tiny" if quick else "135m", root, device)
    data = arithmetic_data(root)
    base = train_overrides(device, True, model, data, 3, [])
    base = [o for o in base if not o.startswith(("trainer.logger=", "trainer.save_freq=", "trainer.total_training"))]
    base += [
        "trainer.logger=['console','file']",
        "data.max_response_length=32",
        "actor_rollout_ref.actor.optim.lr=1e-4",
    ]
    straight, resumed = os.path.join(root, "straight"), os.path.join(root, "resumed")
    for out_dir in (resumed, straight):
        shutil.rmtree(out_dir, ignore_errors=True)
    # 3 steps without stopping (a checkpoint at step 2 on the way), then step 3 again from that checkpoint
    run_main_ppo(
        [*base, f"trainer.default_local_dir={straight}", "trainer.save_freq=2", "trainer.total_training_steps=3"],
        clock.left() - 5,
    )
    run_main_ppo(
        [
            *base,
            f"trainer.default_local_dir={resumed}",
            "trainer.save_freq=-1",
            "trainer.total_training_steps=3",
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={straight}/global_step_2",
        ],
        clock.left() - 5,
    )

    def rows(folder: str) -> list[dict]:
        with open(os.path.join(folder, "metrics.jsonl")) as f:
            return [json.loads(line) for line in f]

    resumed_steps = [r.get("step") for r in rows(resumed)]
    if resumed_steps != [3]:  # a resume that started over would repeat step 3 exactly: not a resume
        raise RuntimeError(f"the resumed run logged steps {resumed_steps}, not step 3 alone")
    a, b = rows(resumed)[0], next(r for r in rows(straight) if r.get("step") == 3)
    keys = sorted(
        k for k in set(a) & set(b)
        if isinstance(a[k], (int, float)) and k.split("/")[0] in ("actor", "critic", "response_length", "prompt_length")
    )  # fmt: skip
    rel = {k: abs(a[k] - b[k]) / max(abs(b[k]), 1e-12) for k in keys}
    worst = max(rel, key=rel.get) if rel else None
    return {
        "compared_keys": len(keys),
        "resume_exact": bool(keys) and all(a[k] == b[k] for k in keys),
        "max_rel_diff": rel[worst] if worst else None,
        "worst_key": worst,
        "step3_resumed": {k: a[k] for k in keys},
        "step3_straight": {k: b[k] for k in keys},
    }


# ------------------------------------------------------------------------------------------- main
SUMMARY = {
    "peak": ("peak_bf16_tflops",),
    "model_step": ("model_step_mfu", "model_step_bf16_mfu", "framework_floor_ms"),
    "train": (
        "generation_tokens_per_s", "update_tokens_per_s", "update_mfu", "peak_memory_gb", "plan_gb",
        "plan_error", "attention_kernel",
    ),
    "resume": ("resume_exact",),
}  # fmt: skip


def summarise(report: Report) -> None:
    phases = report.data["phases"]
    for name, keys in SUMMARY.items():
        for key in keys:
            report.data[key] = phases.get(name, {}).get(key)
    numerics = phases.get("numerics", {})
    for label, key in (("bf16", "device_bf16_vs_cpu_fp32"), ("fp32", "device_fp32_vs_cpu_fp32")):
        report.data[f"logprob_max_abs_diff_vs_cpu_fp32_{label}"] = numerics.get(key, {}).get("max_abs")
    report.data["logprob_max_abs_diff_vs_cpu_fp32"] = report.data["logprob_max_abs_diff_vs_cpu_fp32_bf16"]
    report.data["failed_phases"] = [n for n, p in phases.items() if not p.get("ok")]
    report.write()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), required=True)
    parser.add_argument("--out", required=True, help="the JSON report's path")
    parser.add_argument("--quick", action="store_true", help="every phase in seconds (the small model only)")
    parser.add_argument("--budget-s", type=float, default=460.0, help="the whole run's time budget")
    parser.add_argument("--work-dir", default=None, help="models and runs (default: a temporary folder)")
    parser.add_argument("--phases", default=",".join(PHASES), help="comma-separated phases to run")
    parser.add_argument("--profile", default=None, help="write a torch.profiler table of the last update here")
    parser.add_argument("overrides", nargs="*", help="extra hybridrl keys for the train phase (key=value)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here")
    clock = Clock(args.budget_s)
    report = Report(args.out, args.device)
    root = args.work_dir or tempfile.mkdtemp(prefix="hybridrl-gpu-check-")
    state: dict = {}
    phases = args.phases.split(",")
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        parser.error(f"--phases: unknown {', '.join(unknown)}; pick from {','.join(PHASES)}")
    quick = args.quick
    todo = {
        "env": (5, phase_env, args.device),
        "peak": (5, phase_peak, args.device, quick),
        "model_step": (5 if quick else 30, lambda: phase_model_step(
            args.device, quick, build_model("tiny" if quick else "1.5b", root, args.device), state.get("peak"))),
        "train": (5 if quick else 60, lambda: phase_train(
            args.device, quick, root, state.get("peak"), args.overrides, state, args.profile)),
        "numerics": (5 if quick else 30, phase_numerics, args.device, state),
        "resume": (5 if quick else 60, phase_resume, args.device, quick, root, clock),
    }  # fmt: skip
    for name in PHASES:
        if name in phases:
            min_s, fn, *fn_args = todo[name]
            result = report.run(name, clock, min_s, fn, *fn_args)
            if name == "peak" and result:
                state["peak"] = result["peak_bf16_flops"]
    summarise(report)
    if not args.work_dir:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({k: v for k, v in report.data.items() if k != "phases"}, indent=1), flush=True)
    return 0 if not report.data["failed_phases"] else 1


if __name__ == "__main__":
    sys.exit(main())
