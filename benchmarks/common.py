"""Helpers shared by the benchmark scripts: the model, GSM8K prompts, CPU time, memory, peak FLOP/s."""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass

import torch

from hybridrl.models.flops import forward_flops  # noqa: F401  (the one implementation; the scripts import it from here)

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
GSM8K_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "gsm8k"))


def load_smollm2(dtype: torch.dtype = torch.float32):
    """SmolLM2-135M-Instruct (the local HF folder the trainer resolves) and its left-padding tokenizer.

    The model's own sampling defaults are dropped: every mode samples from the plain softmax.
    """
    from transformers import GenerationConfig

    from hybridrl.models import load_causal_lm, load_tokenizer, resolve_model_path

    folder = resolve_model_path(MODEL)
    tokenizer = load_tokenizer(folder)
    model = load_causal_lm(folder, dtype=dtype).eval()
    model.generation_config = GenerationConfig(pad_token_id=tokenizer.pad_token_id)
    return model, tokenizer


def gsm8k_parquet(out_dir: str, train_size: int, test_size: int = 8) -> str:
    """``train.parquet`` / ``test.parquet`` of the first GSM8K rows, written by hybridrl's preprocess."""
    from hybridrl.data.preprocess import gsm8k

    gsm8k.convert(GSM8K_DIR, out_dir, train_size=train_size, test_size=test_size)
    return out_dir


def gsm8k_prompt_ids(tokenizer, n_prompts: int) -> list[list[int]]:
    """Chat-templated token ids of the first ``n_prompts`` GSM8K train questions (as the trainer sees them)."""
    from hybridrl.data.preprocess import gsm8k

    examples = gsm8k.read_jsonl(os.path.join(GSM8K_DIR, "train.jsonl"))[:n_prompts]
    rows = [gsm8k.make_row(ex["question"], ex["answer"], "train", i) for i, ex in enumerate(examples)]
    return [
        tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True, return_dict=False)
        for row in rows
    ]


def _live_children() -> list:
    """This process's running descendants (e.g. vLLM's async engine process), via psutil (which
    vLLM and Ray depend on; without it there is no engine process to count)."""
    try:
        import psutil
    except ImportError:
        return []
    return psutil.Process().children(recursive=True)


def cpu_seconds() -> float:
    """User + system CPU seconds of this process, its waited-for children and its running ones
    (an engine process is not waited for until it exits, so getrusage alone would miss it)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    live = 0.0
    for child in _live_children():
        try:
            times = child.cpu_times()
            live += times.user + times.system
        except Exception:  # noqa: BLE001 - it exited meanwhile; getrusage counts it once waited for
            continue
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + live


def reset_peak_rss() -> bool:
    """Resets this process's peak RSS (Linux ``clear_refs`` 5), so the next reading covers only
    what follows; returns False where that is not possible (then the reading is the lifetime peak)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _vm_hwm_mib(pid: str | int = "self") -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def peak_rss_mib() -> float:
    """Peak resident memory (VmHWM) of this process since start or the last :func:`reset_peak_rss`,
    plus the lifetime peaks of its running child processes (an engine process), MiB."""
    own = _vm_hwm_mib()
    if own is None:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return own + sum(_vm_hwm_mib(child.pid) or 0.0 for child in _live_children())


def matmul_peak_flops(size: int = 2048, dtype: torch.dtype = torch.bfloat16, seconds: float = 3.0) -> dict:
    """Measured peak of a ``size^3`` matmul loop in ``dtype`` on the CPU (all torch threads).

    Returns ``{"flops_per_s", "flops_per_cpu_s"}``: the best of several timed blocks per wall
    second and per CPU second (other processes on a shared machine only slow a block down, so
    the best is what this machine reaches undisturbed; the CPU-second figure is the steadier one).
    """
    a = torch.randn(size, size, dtype=dtype)
    b = torch.randn(size, size, dtype=dtype)
    for _ in range(2):
        torch.mm(a, b)  # warm-up: oneDNN picks its kernel
    flops, best_wall, best_cpu = 4 * 2.0 * size**3, 0.0, 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        wall0, cpu0 = time.perf_counter(), cpu_seconds()
        for _ in range(4):
            torch.mm(a, b)
        best_wall = max(best_wall, flops / (time.perf_counter() - wall0))
        best_cpu = max(best_cpu, flops / max(cpu_seconds() - cpu0, 1e-9))
    return {"flops_per_s": best_wall, "flops_per_cpu_s": best_cpu}


@dataclass
class GRPOSettings:
    """One GRPO configuration, expressed for hybridrl (verl keys) and for TRL (GRPOConfig)."""

    prompts: int = 8  # prompts per optimizer step
    group: int = 4  # responses per prompt (rollout.n / num_generations)
    response_length: int = 128  # max new tokens
    micro_batch: int = 8  # rows per forward/backward
    lr: float = 1e-6
    weight_decay: float = 0.01
    kl_coef: float = 0.04  # KL to the reference in the loss (k3 estimator); 0: no reference model
    clip_ratio: float = 0.2
    grad_clip: float = 1.0
    seed: int = 1

    def hybridrl_overrides(self, model_path: str, parquet_dir: str, steps: int) -> list[str]:
        a, r = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
        micro = self.micro_batch
        return [
            "algorithm.adv_estimator=grpo",
            "algorithm.norm_adv_by_std_in_grpo=true",
            "algorithm.use_kl_in_reward=false",
            f"data.train_files={parquet_dir}/train.parquet",
            "data.val_files=null",
            "data.shuffle=false",
            f"data.train_batch_size={self.prompts}",
            "data.max_prompt_length=512",
            f"data.max_response_length={self.response_length}",
            f"data.seed={self.seed}",
            f"actor_rollout_ref.model.path={model_path}",
            "actor_rollout_ref.model.enable_gradient_checkpointing=false",
            f"{a}.ppo_mini_batch_size={self.prompts}",
            f"{a}.ppo_micro_batch_size_per_gpu={micro}",
            f"{a}.use_kl_loss={str(self.kl_coef > 0).lower()}",
            f"{a}.kl_loss_coef={self.kl_coef}",
            f"{a}.kl_loss_type=low_var_kl",
            f"{a}.loss_agg_mode=token-mean",
            f"{a}.clip_ratio={self.clip_ratio}",
            f"{a}.clip_ratio_low={self.clip_ratio}",
            f"{a}.clip_ratio_high={self.clip_ratio}",
            f"{a}.grad_clip={self.grad_clip}",
            f"{a}.optim.lr={self.lr}",
            f"{a}.optim.weight_decay={self.weight_decay}",
            f"{a}.fsdp_config.mixed_precision.param_dtype=bf16",
            f"{r}.n={self.group}",
            f"{r}.temperature=1.0",
            f"{r}.top_p=1.0",
            f"{r}.top_k=-1",
            f"{r}.dtype=bfloat16",
            f"{r}.log_prob_micro_batch_size_per_gpu={micro}",
            f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro}",
            "trainer.device=cpu",
            "trainer.backend=local",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            f"trainer.total_training_steps={steps}",
        ]


def build_hybridrl_grpo(settings: GRPOSettings, parquet_dir: str, steps: int, extra_overrides=()):
    """hybridrl's GRPO trainer on SmolLM2-135M, built as ``hybridrl train`` builds it.

    Returns ``(trainer, batches, groups)``: ``trainer.step(next(batches))`` runs one step.
    """

    from hybridrl.algorithms.config import algo_config
    from hybridrl.config import load_config
    from hybridrl.data import RLHFDataset, create_rl_dataloader
    from hybridrl.models import load_tokenizer, resolve_model_path
    from hybridrl.rewards.load import load_reward_manager
    from hybridrl.trainer.ppo.config_check import validate_ppo_config
    from hybridrl.trainer.ppo.ppo_trainer import PPOTrainer
    from hybridrl.trainer.ppo.step_plan import make_step_plan
    from hybridrl.trainer.run.worker_groups import build_worker_groups

    model_path = resolve_model_path(MODEL)
    config = load_config(settings.hybridrl_overrides(model_path, parquet_dir, steps) + list(extra_overrides))
    algo = algo_config(config)
    for note in validate_ppo_config(config, algo=algo):
        print(f"hybridrl: note: {note}")
    plan = make_step_plan(config, algo)
    torch.manual_seed(settings.seed)
    tokenizer = load_tokenizer(model_path)
    dataset = RLHFDataset(config.data.train_files, tokenizer, config.data)
    loader = create_rl_dataloader(dataset, batch_size=settings.prompts, shuffle=False, seed=settings.seed)
    groups = build_worker_groups(
        config, use_critic=False, use_reference=plan.use_reference_policy, total_training_steps=steps
    )
    trainer = PPOTrainer(
        config,
        tokenizer,
        groups.actor_rollout,
        None,
        load_reward_manager(config, tokenizer),
        None,
        loader,
        None,
        steps,
        algo=algo,
        plan=plan,
        n_workers=1,
    )
    return trainer, iter(loader), groups
