"""Supervised fine-tuning: ``python -m hybridrl.trainer.sft_trainer key=value ...`` / ``hybridrl sft``.

verl's ``fsdp_sft_trainer`` with verl's keys (``hybridrl/config/sft_trainer.yaml``), on the PPO
trainer's worker stack: token-level cross-entropy on the assistant's tokens only, on one worker
or ``trainer.nnodes x trainer.n_gpus_per_node`` Ray workers with FSDP2, gradient accumulation
over micro batches that equals one step on the whole batch, AdamW with warmup +
cosine/constant schedule, optional LoRA (``peft``), validation loss, DCP checkpoints, and after
the last step an HF folder (LoRA merged in) that ``hybridrl train`` takes as
``actor_rollout_ref.model.path``. Errors the user can fix are printed as one line (exit 2).

The loop and the checkpoint layout are :mod:`hybridrl.trainer.jobs.supervised`'s; the model's side is
:class:`hybridrl.workers.supervised_worker.SFTWorker`.
"""

from __future__ import annotations

import sys

import torch
from omegaconf import OmegaConf

from hybridrl.data.collate import collate_fn
from hybridrl.data.dataloader import create_rl_dataloader
from hybridrl.data.sft_dataset import SFTDataset
from hybridrl.models import load_tokenizer
from hybridrl.protocol import DataProto
from hybridrl.trainer.jobs.supervised import SupervisedTrainer, run_supervised
from hybridrl.trainer.jobs.supervised_config import ignored_notes, sft_config
from hybridrl.workers.supervised_worker import SFT_KEYS, SFTWorker, sft_tokenizer_path, trim_padding

# ---------------------------------------------------------------- data and the driver


def build_sft_data(config):
    """``(train, val)``: a resumable shuffled loader of ``train_batch_size`` rows, and a loader of
    ``micro_batch_size_per_gpu`` rows per worker over the validation file(s) in order (None without)."""
    tokenizer = load_tokenizer(
        sft_tokenizer_path(config.model),
        trust_remote_code=config.model.trust_remote_code,
        chat_template=config.data.chat_template,
    )
    data_cfg = config.data
    train = create_rl_dataloader(
        SFTDataset(data_cfg.train_files, tokenizer, data_cfg, "data.train_files", data_cfg.train_max_samples),
        batch_size=data_cfg.train_batch_size,
        seed=config.trainer.seed,
    )
    val = None
    if data_cfg.val_files:
        val_ds = SFTDataset(data_cfg.val_files, tokenizer, data_cfg, "data.val_files", data_cfg.val_max_samples)
        workers = config.trainer.nnodes * config.trainer.n_gpus_per_node
        val = torch.utils.data.DataLoader(
            val_ds, batch_size=data_cfg.micro_batch_size_per_gpu * workers, shuffle=False, collate_fn=collate_fn
        )
    return train, val


class SFTTrainer(SupervisedTrainer):
    """SFT's part of the loop: batches of ``SFTDataset`` rows, ``val/loss`` and the throughput."""

    name = "sft"

    def to_proto(self, batch: dict) -> DataProto:
        return DataProto.from_dict(tensors=trim_padding({k: batch[k] for k in SFT_KEYS}))

    def step(self, batch: dict) -> dict:
        """:meth:`SupervisedTrainer.step`, with ``perf/throughput`` (tokens per second)."""
        metrics = super().step(batch)
        metrics["perf/throughput"] = batch["attention_mask"].sum().item() / metrics["perf/time_per_step"]
        return metrics

    def validate(self) -> dict:
        """``val/loss``: mean negative log-likelihood per assistant token over the validation set."""
        loss_total, n_total = 0.0, 0.0
        for batch in self.val_data:
            output = self.worker_group.evaluate_batch(self.to_proto(batch))
            loss_total += output.batch["loss_sum"].sum().item()
            n_total += output.batch["loss_tokens"].sum().item()
        return {"val/loss": loss_total / max(n_total, 1)}


def run_sft(config) -> None:
    """Trains with a composed ``sft_trainer`` config (see ``hybridrl.config.load_config``).

    Raises:
        ConfigError: a bad key or value (see :class:`~hybridrl.trainer.jobs.supervised_config.SFTConfig`).
    """
    typed = sft_config(config)
    for note in ignored_notes(typed):
        print(f"hybridrl: note: {note}", flush=True)
    trainer = run_supervised(OmegaConf.structured(typed), SFTWorker, SFTTrainer, build_sft_data)
    if trainer.export_dir:
        print(
            f"hybridrl: the model of step {trainer.global_steps} is in {trainer.export_dir} (pass it as "
            "actor_rollout_ref.model.path)",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    """``hybridrl sft key=value ...`` (see :func:`hybridrl.cli.run_cli`)."""
    from hybridrl.cli import run_cli  # the entry point hands over to the command line (see .importlinter)

    return run_cli(run_sft, "sft_trainer", argv)


if __name__ == "__main__":
    sys.exit(main())
