"""Reward-model training: ``hybridrl rm key=value ...`` / ``python -m hybridrl.trainer.rm_trainer``.

A scalar head on a causal-LM backbone (``load_value_model``, the critic's model class) is trained
on preference pairs with the Bradley-Terry loss ``-log sigmoid(r_chosen - r_rejected - margin)``
(``hybridrl/algorithms/reward_loss.py``); each sequence is scored at its last token, exactly as
the PPO reward-model worker will read it. Gradient accumulation over micro batches equals one
step on the whole batch. Config: ``hybridrl/config/rm_trainer.yaml``. Errors the user can fix are
printed as one line (exit 2).

Checkpoint layout (``<trainer.default_local_dir>/global_step_<N>/``, written atomically):
``huggingface/`` (config, safetensors, tokenizer: the folder to pass as
``reward_model.model.path``), ``optim_world_size_1_rank_0.pt``,
``extra_state_world_size_1_rank_0.pt`` (lr scheduler, RNG), ``data.pt`` (dataloader position)
and ``trainer_state.json`` (with the last validation accuracy).
"""

from __future__ import annotations

import os
import sys
import time

import torch

from hybridrl.algorithms.reward_loss import compute_bradley_terry_loss, compute_preference_accuracy
from hybridrl.data.preference_dataset import pad_pairs
from hybridrl.trainer.supervised import HF_DIR, SupervisedTrainer
from hybridrl.workers.reward_model import forward_sequence_scores

_CHOICES = {
    "data.truncation": ("left", "drop", "error"),
    "optim.lr_scheduler": ("cosine", "constant"),
    "trainer.resume_mode": ("auto", "disable", "resume_path"),
}


def validate_rm_config(config) -> None:
    """Start-up checks of the ``rm_trainer`` config.

    Raises:
        ConfigError: the first bad value, naming the key, the value and what to change.
    """
    from omegaconf import OmegaConf

    from hybridrl.errors import ConfigError

    def get(key):
        return OmegaConf.select(config, key)

    for key in ("data.train_batch_size", "data.micro_batch_size_per_gpu", "data.max_length"):
        value = get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{key}={value!r} must be a whole number >= 1")
    batch, micro = get("data.train_batch_size"), get("data.micro_batch_size_per_gpu")
    if batch % micro:
        raise ConfigError(f"data.train_batch_size={batch} is not a multiple of data.micro_batch_size_per_gpu={micro}; "
                          "pick a micro batch that divides the batch")
    for key, allowed in _CHOICES.items():
        if get(key) not in allowed:
            raise ConfigError(f"{key}={get(key)!r} is not one of {', '.join(allowed)}")
    if not get("model.path"):
        raise ConfigError("model.path is not set; set it to the backbone (an HF folder, a .gguf file, "
                          "or HuggingFaceTB/SmolLM2-135M-Instruct)")
    if get("trainer.resume_mode") == "resume_path" and not get("trainer.resume_from_path"):
        raise ConfigError("trainer.resume_mode=resume_path needs trainer.resume_from_path=<a global_step_N folder>")
    ratio = get("optim.warmup_steps_ratio")
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
        raise ConfigError(f"optim.warmup_steps_ratio={ratio!r} must be a number in [0, 1]")
    clip = get("optim.clip_grad")
    if isinstance(clip, bool) or not isinstance(clip, (int, float)) or clip <= 0:
        raise ConfigError(f"optim.clip_grad={clip!r} must be a positive number")
    if not get("trainer.total_training_steps") and (get("trainer.total_epochs") or 0) < 1:
        raise ConfigError(f"trainer.total_epochs={get('trainer.total_epochs')!r} must be >= 1 "
                          "(or set trainer.total_training_steps)")


def pairwise_scores(model, chosen: list, rejected: list, pad_token_id: int, device,
                    compute_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(chosen_scores (B,), rejected_scores (B,), tokens)`` of ``B`` pairs of id lists, in one forward."""
    batch = {k: v.to(device) for k, v in pad_pairs(chosen, rejected, pad_token_id).items()}
    scores = forward_sequence_scores(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"],
                                     compute_dtype)
    return scores[: len(chosen)], scores[len(chosen):], int(batch["attention_mask"].sum())


def build_reward_model(config, device: str, weights_path: str | None = None):
    """The backbone + scalar head (``load_value_model``: a new head starts at zero, so every pair
    ties at first and the backbone gets gradients from the second step on), the head's bias
    frozen. ``weights_path``: a checkpoint's ``huggingface/`` folder to resume from."""
    import importlib

    from hybridrl.models import load_value_model, resolve_model_path

    model_cfg = config.model
    if model_cfg.get("external_lib"):
        importlib.import_module(model_cfg.external_lib)
    path = weights_path or resolve_model_path(model_cfg.path, config_key="model.path")
    model = load_value_model(
        path, dtype=model_cfg.fsdp_config.get("model_dtype", "fp32"),
        trust_remote_code=model_cfg.get("trust_remote_code", False), override_config=model_cfg.get("override_config"),
        enable_gradient_checkpointing=model_cfg.get("enable_gradient_checkpointing", False),
    )
    # The loss sees only score differences, so the head's bias has no gradient in exact arithmetic;
    # Adam would still turn float rounding into drift. Frozen at its zero init, the checkpoint
    # also loads unchanged as a (bias-free) AutoModelForSequenceClassification.
    prefix = model.base_model_prefix + "."
    for name, param in model.named_parameters():
        if not name.startswith(prefix) and name.endswith("bias"):
            param.requires_grad_(False)
    return model.to(device)


def build_dataloaders(config, tokenizer):
    """``(train, val)``: a resumable shuffled loader of ``train_batch_size`` pairs, and the
    validation dataset (None without ``data.val_files``)."""
    from hybridrl.data.dataloader import create_rl_dataloader
    from hybridrl.data.preference_dataset import PreferenceDataset

    data_cfg = config.data
    train_ds = PreferenceDataset(data_cfg.train_files, tokenizer, data_cfg, "data.train_files",
                                 max_samples=data_cfg.get("train_max_samples", -1))
    train = create_rl_dataloader(train_ds, batch_size=data_cfg.train_batch_size, seed=config.trainer.seed)
    val = None
    if data_cfg.get("val_files"):
        val = PreferenceDataset(data_cfg.val_files, tokenizer, data_cfg, "data.val_files",
                                max_samples=data_cfg.get("val_max_samples", -1))
    return train, val


class RewardModelTrainer(SupervisedTrainer):
    """Runs ``fit()``: validation, then ``train_step()`` per batch, checkpoints and logging.
    Unlike SFT, the last step always validates and saves, and a checkpoint keeps the last
    validation metrics.

    Args:
        config: the resolved ``rm_trainer`` config.
        model: the scalar-head model on its device.
        tokenizer: saved into each checkpoint's ``huggingface/`` folder; gives the pad id.
        train_dataloader: a ``StatefulDataLoader`` of ``PreferenceDataset`` batches.
        val_dataset: a ``PreferenceDataset`` or None.
        total_training_steps: optimizer steps of the whole run.
    """

    name = "rm"
    resume_hint = "point trainer.resume_from_path at a checkpoint written by hybridrl rm"

    def __init__(self, config, model, tokenizer, train_dataloader, val_dataset, total_training_steps: int):
        super().__init__(config, model, tokenizer, train_dataloader, total_training_steps)
        self.val_dataset = val_dataset
        self.last_val: dict = {}

    def has_validation(self) -> bool:
        return self.val_dataset is not None

    def _due(self, freq, is_last: bool) -> bool:
        return is_last or (bool(freq) and freq > 0 and self.global_steps % freq == 0)

    def _checkpoint_trainer_state(self) -> dict:
        return self.last_val

    def train_step(self, batch: dict) -> dict:
        """One optimizer step on ``batch`` (``train_batch_size`` pairs) in micro batches; metrics."""
        start = time.perf_counter()
        self.model.train()
        n_pairs = len(batch["margin"])
        micro = self.config.data.micro_batch_size_per_gpu
        self.optimizer.zero_grad(set_to_none=True)
        chosen_all, rejected_all, tokens, loss_total = [], [], 0, 0.0
        for i in range(0, n_pairs, micro):
            chosen, rejected, n_tokens = pairwise_scores(
                self.model, batch["chosen_input_ids"][i : i + micro], batch["rejected_input_ids"][i : i + micro],
                self.tokenizer.pad_token_id, self.device, self.compute_dtype)
            margin = torch.tensor([float(m) for m in batch["margin"][i : i + micro]], device=self.device)
            loss = compute_bradley_terry_loss(chosen, rejected, margin) * (len(chosen) / n_pairs)
            loss.backward()  # weighted by the micro batch's share: accumulation == one step on the whole batch
            loss_total += loss.item()
            chosen_all.append(chosen.detach())
            rejected_all.append(rejected.detach())
            tokens += n_tokens
        grad_norm, lr = self._optimizer_step()
        seconds = time.perf_counter() - start
        metrics = {"train/loss": loss_total, "train/lr": lr, "train/grad_norm": grad_norm.item(),
                   "perf/time_per_step": seconds, "perf/throughput": tokens / seconds}
        metrics.update(_score_metrics("train", torch.cat(chosen_all), torch.cat(rejected_all)))
        return metrics

    @torch.no_grad()
    def validate(self) -> dict:
        """``val/accuracy`` (chosen scored above rejected, ties half), ``val/loss`` and score means."""
        self.model.eval()
        ds, micro = self.val_dataset, self.config.data.micro_batch_size_per_gpu
        chosen_all, rejected_all, margins = [], [], []
        for i in range(0, len(ds), micro):
            chosen, rejected, _ = pairwise_scores(self.model, ds.chosen[i : i + micro], ds.rejected[i : i + micro],
                                                  self.tokenizer.pad_token_id, self.device, self.compute_dtype)
            chosen_all.append(chosen)
            rejected_all.append(rejected)
            margins.extend(ds.margins[i : i + micro])
        chosen, rejected = torch.cat(chosen_all), torch.cat(rejected_all)
        loss = compute_bradley_terry_loss(chosen, rejected, torch.tensor(margins, device=chosen.device))
        self.last_val = {"val/loss": loss.item(), **_score_metrics("val", chosen, rejected)}
        return self.last_val


def _score_metrics(prefix: str, chosen: torch.Tensor, rejected: torch.Tensor) -> dict:
    return {f"{prefix}/accuracy": compute_preference_accuracy(chosen, rejected).item(),
            f"{prefix}/chosen_score/mean": chosen.mean().item(),
            f"{prefix}/rejected_score/mean": rejected.mean().item(),
            f"{prefix}/score_gap/mean": (chosen - rejected).mean().item()}


def run_rm(config) -> str:
    """Trains with a resolved ``rm_trainer`` config; returns the last checkpoint's
    ``huggingface/`` folder (the reward model for ``reward_model.model.path``)."""
    from hybridrl.controller.worker import resolve_device
    from hybridrl.models import load_tokenizer, resolve_model_path
    from hybridrl.trainer.sft_trainer import find_resume_checkpoint
    from hybridrl.trainer.tracking import Tracking

    validate_rm_config(config)
    trainer_cfg = config.trainer
    device = resolve_device(trainer_cfg.get("device", "auto"))
    torch.manual_seed(trainer_cfg.seed)
    base = resolve_model_path(config.model.path, config_key="model.path")
    tokenizer = load_tokenizer(base, trust_remote_code=config.model.get("trust_remote_code", False),
                               padding_side="right", chat_template=config.data.get("chat_template"))
    train_dataloader, val_dataset = build_dataloaders(config, tokenizer)
    total_steps = int(trainer_cfg.total_training_steps or len(train_dataloader) * trainer_cfg.total_epochs)

    resume = find_resume_checkpoint(trainer_cfg)
    weights = os.path.join(resume, HF_DIR) if resume else None
    if weights is not None and not os.path.isfile(os.path.join(weights, "config.json")):
        from hybridrl.trainer.checkpoint import CheckpointError

        raise CheckpointError(f"checkpoint {resume} has no {HF_DIR}/config.json; point trainer.resume_from_path "
                              "at a global_step_<N> folder written by hybridrl rm")
    model = build_reward_model(config, device, weights_path=weights)
    trainer = RewardModelTrainer(config, model, tokenizer, train_dataloader, val_dataset, total_steps)
    if resume:
        trainer.load_checkpoint(resume)
    tracker = Tracking(
        project_name=trainer_cfg.project_name, experiment_name=trainer_cfg.experiment_name,
        default_backend=[trainer_cfg.logger] if isinstance(trainer_cfg.logger, str) else list(trainer_cfg.logger),
        config=config, local_dir=trainer_cfg.default_local_dir, total_steps=total_steps,
    )
    try:
        trainer.fit(tracker)
    finally:
        tracker.finish()
    from hybridrl.trainer.checkpoint import find_latest_checkpoint

    folder = os.path.join(find_latest_checkpoint(trainer_cfg.default_local_dir), HF_DIR)
    accuracy = f"val/accuracy {trainer.last_val['val/accuracy']:.3f}; " if trainer.last_val else ""
    print(f"hybridrl: reward model saved in {folder} ({accuracy}pass it as reward_model.model.path)", flush=True)
    return folder


def main(argv: list[str] | None = None) -> int:
    """``hybridrl rm key=value ...`` (see :func:`hybridrl.cli.run_cli`)."""
    from hybridrl.cli import run_cli  # the entry point hands over to the command line (see .importlinter)

    return run_cli(run_rm, "rm_trainer", argv)


if __name__ == "__main__":
    sys.exit(main())
