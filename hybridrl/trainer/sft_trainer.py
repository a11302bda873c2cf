"""Supervised fine-tuning: ``python -m hybridrl.trainer.sft_trainer key=value ...`` / ``hybridrl sft``.

verl's ``fsdp_sft_trainer`` with verl's keys (``hybridrl/config/sft_trainer.yaml``), on the PPO
trainer's worker stack: token-level cross-entropy on the assistant's tokens only, on one worker
or ``trainer.nnodes x trainer.n_gpus_per_node`` Ray workers with FSDP2, gradient accumulation
over micro batches that equals one step on the whole batch, AdamW with warmup +
cosine/constant schedule, optional LoRA (``peft``), validation loss, DCP checkpoints, and after
the last step an HF folder (LoRA merged in) that ``hybridrl train`` takes as
``actor_rollout_ref.model.path``. Errors the user can fix are printed as one line (exit 2).

The loop and the checkpoint layout are :mod:`hybridrl.trainer.supervised`'s; the model's side is
:class:`hybridrl.workers.supervised_worker.SFTWorker`.
"""

from __future__ import annotations

import os
import sys

import torch

from hybridrl.data.collate import collate_fn
from hybridrl.data.dataloader import create_rl_dataloader
from hybridrl.data.sft_dataset import SFTDataset
from hybridrl.models import load_tokenizer, resolve_model_path
from hybridrl.protocol import DataProto
from hybridrl.trainer.supervised import SupervisedTrainer, check_batch_split, run_supervised
from hybridrl.workers.supervised_worker import SFT_KEYS, SFTWorker, trim_padding

# key -> why it means nothing here; noted at start-up when set to a non-default value
_IGNORED = {
    "data.balance_dp_token": "the loss is normalised by the token count of the whole batch over every worker",
    "data.use_shm": "data and models load from their own paths",
    "model.use_shm": "models load from their own path",
    "model.use_liger": "no Liger kernels in this build",
    "model.fsdp_config.wrap_policy.min_num_params": "FSDP2 shards every decoder block",
    "model.fsdp_config.cpu_offload": "no parameter offload for SFT in this build",
    "model.fsdp_config.offload_params": "no parameter offload for SFT in this build",
    "ulysses_sequence_parallel_size": "no sequence parallelism in this build",
    "use_remove_padding": "micro batches are cut to their longest row instead (same results)",
    "trainer.default_hdfs_dir": "checkpoints stay in trainer.default_local_dir",
}
_CHOICES = {
    "data.truncation": ("error", "left", "right"),
    "optim.lr_scheduler": ("cosine", "constant"),
    "trainer.resume_mode": ("auto", "disable", "resume_path"),
}


# ---------------------------------------------------------------- config checks


def validate_sft_config(config) -> list[str]:
    """Check the SFT config at start-up; return notes about ignored keys that were set.

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
    if get("data.micro_batch_size_per_gpu") > get("data.train_batch_size"):
        raise ConfigError(f"data.micro_batch_size_per_gpu={get('data.micro_batch_size_per_gpu')} is larger than "
                          f"data.train_batch_size={get('data.train_batch_size')}; lower it")
    for key, allowed in _CHOICES.items():
        if get(key) not in allowed:
            raise ConfigError(f"{key}={get(key)!r} is not one of {', '.join(allowed)}")
    if get("trainer.resume_mode") == "resume_path" and not get("trainer.resume_from_path"):
        raise ConfigError("trainer.resume_mode=resume_path needs trainer.resume_from_path=<a global_step_N folder>")
    rank = get("model.lora_rank")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ConfigError(f"model.lora_rank={rank!r} must be 0 (full fine-tuning) or a positive whole number")
    ratio = get("optim.warmup_steps_ratio")
    if not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
        raise ConfigError(f"optim.warmup_steps_ratio={ratio!r} must be a number in [0, 1]")
    if not isinstance(get("optim.clip_grad"), (int, float)) or get("optim.clip_grad") <= 0:
        raise ConfigError(f"optim.clip_grad={get('optim.clip_grad')!r} must be a positive number")
    if not get("trainer.total_training_steps") and (get("trainer.total_epochs") or 0) < 1:
        raise ConfigError(f"trainer.total_epochs={get('trainer.total_epochs')!r} must be >= 1 "
                          "(or set trainer.total_training_steps)")
    return _ignored_notes(config)


def _ignored_notes(config) -> list[str]:
    from omegaconf import OmegaConf

    packaged = OmegaConf.load(os.path.join(os.path.dirname(_config_module_file()), "sft_trainer.yaml"))
    notes = []
    for key, reason in _IGNORED.items():
        value = OmegaConf.select(config, key)
        if value != OmegaConf.select(packaged, key):
            notes.append(f"{key}={value!r} is ignored: {reason}")
    return notes


def _config_module_file() -> str:
    import hybridrl.config

    return hybridrl.config.__file__


# ---------------------------------------------------------------- data and the driver


def build_sft_data(config):
    """``(train, val)``: a resumable shuffled loader of ``train_batch_size`` rows, and a loader of
    ``micro_batch_size_per_gpu`` rows per worker over the validation file(s) in order (None without)."""
    tokenizer = load_tokenizer(resolve_model_path(config.model.partial_pretrain, config_key="model.partial_pretrain"),
                               trust_remote_code=config.model.trust_remote_code, chat_template=config.data.chat_template)
    data_cfg = config.data
    train = create_rl_dataloader(SFTDataset(data_cfg.train_files, tokenizer, data_cfg, "data.train_files"),
                                 batch_size=data_cfg.train_batch_size, seed=config.trainer.seed)
    val = None
    if data_cfg.val_files:
        val_ds = SFTDataset(data_cfg.val_files, tokenizer, data_cfg, "data.val_files")
        val = torch.utils.data.DataLoader(val_ds, batch_size=data_cfg.micro_batch_size_per_gpu * check_batch_split(config),
                                          shuffle=False, collate_fn=collate_fn)
    return train, val


class SFTTrainer(SupervisedTrainer):
    """SFT's part of the loop: batches of ``SFTDataset`` rows, ``val/loss`` and the throughput."""

    name = "sft"

    def to_proto(self, batch: dict) -> DataProto:
        return DataProto.from_dict(tensors=trim_padding({k: batch[k] for k in SFT_KEYS}))

    def train_step(self, batch: dict) -> dict:
        metrics = super().train_step(batch)
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
    """Trains with a resolved ``sft_trainer`` config (see ``hybridrl.config.load_config``)."""
    for note in validate_sft_config(config):
        print(f"hybridrl: note: {note}", flush=True)
    trainer = run_supervised(config, SFTWorker, SFTTrainer, build_sft_data)
    if trainer.export_dir:
        print(f"hybridrl: the model of step {trainer.global_steps} is in {trainer.export_dir} (pass it as "
              "actor_rollout_ref.model.path)", flush=True)


def main(argv: list[str] | None = None) -> int:
    """``hybridrl sft key=value ...`` (see :func:`hybridrl.cli.run_cli`)."""
    from hybridrl.cli import run_cli  # the entry point hands over to the command line (see .importlinter)

    return run_cli(run_sft, "sft_trainer", argv)


if __name__ == "__main__":
    sys.exit(main())
