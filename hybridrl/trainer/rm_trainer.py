"""Reward-model training: ``hybridrl rm key=value ...`` / ``python -m hybridrl.trainer.rm_trainer``.

A scalar head on a causal-LM backbone (``load_value_model``, the critic's model class) is trained
on preference pairs with the Bradley-Terry loss ``-log sigmoid(r_chosen - r_rejected - margin)``
(``hybridrl/algorithms/reward_loss.py``); each sequence is scored at its last token, exactly as
the PPO reward-model worker will read it. It runs on the PPO trainer's worker stack (one worker,
or Ray workers with FSDP2); gradient accumulation over micro batches and workers equals one step
on the whole batch. Config: ``hybridrl/config/rm_trainer.yaml``. Errors the user can fix are
printed as one line (exit 2).

The loop and the checkpoint layout are :mod:`hybridrl.trainer.jobs.supervised`'s (the last step is
always saved and exported: ``global_step_<N>/huggingface/`` is the folder to pass as
``reward_model.model.path``; ``trainer_state.json`` keeps the last validation metrics); the
model's side is :class:`hybridrl.workers.supervised_worker.RewardModelTrainingWorker`.
"""

from __future__ import annotations

import sys

import torch
from omegaconf import OmegaConf

from hybridrl.algorithms.reward_loss import compute_bradley_terry_loss, compute_preference_accuracy
from hybridrl.data.dataloader import create_rl_dataloader
from hybridrl.data.preference_dataset import PreferenceDataset
from hybridrl.models import load_tokenizer, resolve_model_path
from hybridrl.protocol import DataProto
from hybridrl.trainer.jobs.supervised import SupervisedTrainer, run_supervised
from hybridrl.trainer.jobs.supervised_config import rm_config
from hybridrl.workers.supervised_worker import RewardModelTrainingWorker, pairs_to_proto


def build_rm_data(config):
    """``(train, val)``: a resumable shuffled loader of ``train_batch_size`` pairs, and the
    validation dataset (None without ``data.val_files``)."""
    model_cfg, data_cfg = config.model, config.data
    tokenizer = load_tokenizer(
        resolve_model_path(model_cfg.path, config_key="model.path"),
        trust_remote_code=model_cfg.trust_remote_code,
        padding_side="right",
        chat_template=data_cfg.chat_template,
    )
    train_ds = PreferenceDataset(
        data_cfg.train_files, tokenizer, data_cfg, "data.train_files", max_samples=data_cfg.train_max_samples
    )
    train = create_rl_dataloader(train_ds, batch_size=data_cfg.train_batch_size, seed=config.trainer.seed)
    val = None
    if data_cfg.val_files:
        val = PreferenceDataset(
            data_cfg.val_files, tokenizer, data_cfg, "data.val_files", max_samples=data_cfg.val_max_samples
        )
    return train, val


class RewardModelTrainer(SupervisedTrainer):
    """The reward model's part of the loop: batches of pairs, score metrics, validation accuracy.
    Unlike SFT, the last step always validates and saves, and a checkpoint keeps the last
    validation metrics."""

    name = "rm"
    always_on_last = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.last_val: dict = {}

    def _checkpoint_trainer_state(self) -> dict:
        return self.last_val

    def to_proto(self, batch: dict) -> DataProto:
        return pairs_to_proto(batch["chosen_input_ids"], batch["rejected_input_ids"], batch["margin"])

    def output_metrics(self, output: DataProto) -> dict:
        return _score_metrics("train", output.batch["chosen_scores"], output.batch["rejected_scores"])

    def validate(self) -> dict:
        """``val/accuracy`` (chosen scored above rejected, ties half), ``val/loss`` and score means."""
        ds = self.val_data
        step = self.config.data.micro_batch_size_per_gpu * self.worker_group.world_size
        chosen_all, rejected_all = [], []
        for i in range(0, len(ds), step):
            output = self.worker_group.evaluate_batch(
                pairs_to_proto(ds.chosen[i : i + step], ds.rejected[i : i + step], ds.margins[i : i + step])
            )
            chosen_all.append(output.batch["chosen_scores"])
            rejected_all.append(output.batch["rejected_scores"])
        chosen, rejected = torch.cat(chosen_all), torch.cat(rejected_all)
        loss = compute_bradley_terry_loss(chosen, rejected, torch.tensor(ds.margins, dtype=torch.float32))
        self.last_val = {"val/loss": loss.item(), **_score_metrics("val", chosen, rejected)}
        return self.last_val


def _score_metrics(prefix: str, chosen: torch.Tensor, rejected: torch.Tensor) -> dict:
    return {
        f"{prefix}/accuracy": compute_preference_accuracy(chosen, rejected).item(),
        f"{prefix}/chosen_score/mean": chosen.mean().item(),
        f"{prefix}/rejected_score/mean": rejected.mean().item(),
        f"{prefix}/score_gap/mean": (chosen - rejected).mean().item(),
    }


def run_rm(config) -> str | None:
    """Trains with a composed ``rm_trainer`` config; returns the exported ``huggingface/`` folder
    of the last step (the reward model for ``reward_model.model.path``).

    Raises:
        ConfigError: a bad key or value (see :class:`~hybridrl.trainer.jobs.supervised_config.RMConfig`).
    """
    trainer = run_supervised(
        OmegaConf.structured(rm_config(config)), RewardModelTrainingWorker, RewardModelTrainer, build_rm_data
    )
    folder = trainer.export_dir
    accuracy = f"val/accuracy {trainer.last_val['val/accuracy']:.3f}; " if trainer.last_val else ""
    print(f"hybridrl: reward model saved in {folder} ({accuracy}pass it as reward_model.model.path)", flush=True)
    return folder


def main(argv: list[str] | None = None) -> int:
    """``hybridrl rm key=value ...`` (see :func:`hybridrl.cli.run_cli`)."""
    from hybridrl.cli import run_cli  # the entry point hands over to the command line (see .importlinter)

    return run_cli(run_rm, "rm_trainer", argv)


if __name__ == "__main__":
    sys.exit(main())
