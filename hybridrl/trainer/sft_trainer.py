"""Supervised fine-tuning: ``python -m hybridrl.trainer.sft_trainer key=value ...`` / ``hybridrl sft``.

verl's ``fsdp_sft_trainer`` on one worker, with verl's keys (``hybridrl/config/sft_trainer.yaml``):
token-level cross-entropy on the assistant's tokens only, gradient accumulation over micro
batches that equals one step on the whole batch, AdamW with warmup + cosine/constant schedule,
optional LoRA (``peft``), validation loss, and checkpoints whose ``huggingface/`` folder is a
plain HF model (LoRA merged in) that ``hybridrl train`` takes as
``actor_rollout_ref.model.path``. Errors the user can fix are printed as one line (exit 2).

The checkpoint layout is :mod:`hybridrl.trainer.supervised`'s.
"""

from __future__ import annotations

import os
import sys
import time

import torch

from hybridrl.trainer.supervised import HF_DIR, LORA_DIR, SupervisedTrainer

# key -> why it means nothing here; noted at start-up when set to a non-default value
_IGNORED = {
    "data.balance_dp_token": "one worker: the loss is already normalised by the batch's token count",
    "data.use_shm": "data and models load from their own paths",
    "model.use_shm": "models load from their own path",
    "model.use_liger": "no Liger kernels in this build",
    "model.fsdp_config.wrap_policy.min_num_params": "one worker holds the whole model",
    "model.fsdp_config.cpu_offload": "one worker holds the whole model",
    "model.fsdp_config.offload_params": "one worker holds the whole model",
    "ulysses_sequence_parallel_size": "no sequence parallelism in this build",
    "use_remove_padding": "micro batches are cut to their longest row instead (same results)",
    "trainer.default_hdfs_dir": "checkpoints stay in trainer.default_local_dir",
    "trainer.nnodes": "this build trains with one worker (same global batch, same results)",
    "trainer.n_gpus_per_node": "this build trains with one worker (same global batch, same results)",
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


# ---------------------------------------------------------------- the loss


def trim_padding(batch: dict) -> dict:
    """Cut right-padding columns that no row of ``batch`` uses; tensors ``(bs, seqlen)``."""
    length = int(batch["attention_mask"].sum(-1).max().item())
    return {k: v[:, :length] for k, v in batch.items()}


def sft_loss(model, batch: dict, compute_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed negative log-likelihood of the loss-masked tokens, and their count.

    ``loss_sum = -sum_{b,t>=1} loss_mask[b,t] * log p(input_ids[b,t] | input_ids[b,<t])``; the
    caller divides by the token count of the whole batch, so any split into micro batches gives
    the gradient of one big batch.

    Args:
        model: a causal LM returning ``logits (bs, seqlen, vocab)``.
        batch: ``input_ids``, ``attention_mask``, ``position_ids``, ``loss_mask``, each
            ``(bs, seqlen)``; ``loss_mask`` aligned with ``input_ids`` (1 = a label token).
        compute_dtype: bf16 runs the forward under autocast (fp32 weights).

    Returns:
        ``(loss_sum, n_tokens)``: fp32 scalars; ``loss_sum`` in nats.
    """
    from hybridrl.algorithms.functional import logprobs_from_logits
    from hybridrl.workers.actor import autocast

    with autocast(model, compute_dtype):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"], use_cache=False).logits
    mask = batch["loss_mask"][:, 1:].to(torch.float32)
    log_probs = logprobs_from_logits(logits[:, :-1], batch["input_ids"][:, 1:])
    return -(log_probs * mask).sum(), mask.sum()


def accumulate_gradients(model, batch: dict, micro_batch_size: int,
                         compute_dtype: torch.dtype = torch.float32) -> tuple[float, int]:
    """Add to ``.grad`` the gradient of the batch's mean token loss, one micro batch at a time.

    Each micro batch's summed loss is divided by the loss-token count of the WHOLE batch, so the
    accumulated gradient equals that of one forward/backward over the batch whatever the split
    (verl divides by each micro batch's own count, which weights short rows differently).

    Args:
        batch: ``SFTDataset`` tensors ``(bs, seqlen)`` on any device (moved to the model's).
        micro_batch_size: rows per forward/backward (``data.micro_batch_size_per_gpu``).

    Returns:
        ``(loss, n_tokens)``: mean NLL per loss token (nats) and the number of loss tokens.
    """
    device = next(model.parameters()).device
    batch = trim_padding(batch)
    n_tokens = int(batch["loss_mask"][:, 1:].sum().item())
    loss_total = 0.0
    for i in range(0, batch["input_ids"].shape[0], micro_batch_size):
        micro = trim_padding({k: v[i : i + micro_batch_size].to(device) for k, v in batch.items()})
        loss_sum, _ = sft_loss(model, micro, compute_dtype)
        (loss_sum / max(n_tokens, 1)).backward()
        loss_total += loss_sum.item()
    return loss_total / max(n_tokens, 1), n_tokens


# ---------------------------------------------------------------- model, data, checkpoints


def build_sft_model(config, device: str, weights_path: str | None = None):
    """The causal LM of ``model.partial_pretrain`` (or ``weights_path``), LoRA-wrapped if asked.

    Raises:
        ModelPathError / ModelDependencyError / ModelConfigError: see ``hybridrl.models``;
        ModelDependencyError also when ``model.lora_rank > 0`` and ``peft`` is missing.
        ConfigError: ``model.target_modules`` names no module of the model.
    """
    import importlib

    from hybridrl.models import load_causal_lm, resolve_model_path

    model_cfg = config.model
    if model_cfg.get("external_lib"):
        importlib.import_module(model_cfg.external_lib)
    path = weights_path or resolve_model_path(model_cfg.partial_pretrain, config_key="model.partial_pretrain")
    model = load_causal_lm(path, dtype=model_cfg.fsdp_config.get("model_dtype", "fp32"),
                           trust_remote_code=model_cfg.get("trust_remote_code", False),
                           enable_gradient_checkpointing=model_cfg.get("enable_gradient_checkpointing", False))
    if model_cfg.lora_rank > 0:
        model = _wrap_lora(model, model_cfg)
    return model.to(device)


def _wrap_lora(model, model_cfg):
    from hybridrl.errors import ConfigError
    from hybridrl.models import ModelDependencyError

    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as err:
        raise ModelDependencyError(f"model.lora_rank={model_cfg.lora_rank} needs the peft package: "
                                   "run `pip install 'hybridrl[lora]'`") from err
    targets = model_cfg.target_modules
    targets = targets if isinstance(targets, str) else list(targets)
    lora = LoraConfig(task_type="CAUSAL_LM", r=model_cfg.lora_rank, lora_alpha=model_cfg.lora_alpha,
                      target_modules=targets, bias="none")
    try:
        return get_peft_model(model, lora)
    except ValueError as err:
        reason = str(err).splitlines()[0].split(". ")[0].rstrip(".")  # peft's first sentence
        raise ConfigError(f"model.target_modules={targets!r}: {reason}; use all-linear or names of the "
                          "model's linear layers (e.g. [q_proj,v_proj])") from err


def build_model_for_run(config, device: str, resume: str | None):
    """The model to train: fresh from ``model.partial_pretrain``, or with the weights of the
    checkpoint folder ``resume`` (its ``huggingface/`` model, or the base plus its adapter).

    Raises:
        CheckpointError: ``resume`` is incomplete, or was written with another ``model.lora_rank``.
    """
    import json

    from hybridrl.trainer import checkpoint

    if resume is None:
        return build_sft_model(config, device)
    checkpoint.read_checkpoint(resume)  # raises for an incomplete folder
    rank = config.model.lora_rank
    adapter_config = os.path.join(resume, LORA_DIR, "adapter_config.json")
    saved_rank = 0
    if os.path.isfile(adapter_config):
        with open(adapter_config) as f:
            saved_rank = json.load(f)["r"]
    if saved_rank != rank:
        raise checkpoint.CheckpointError(
            f"checkpoint {resume} was written with model.lora_rank={saved_rank} but model.lora_rank={rank}; "
            "resume with the same model.lora_rank, or start over with trainer.resume_mode=disable")
    if rank == 0:
        return build_sft_model(config, device, weights_path=os.path.join(resume, HF_DIR))
    model = build_sft_model(config, device)  # LoRA-wrapped (ModelDependencyError without peft)
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    set_peft_model_state_dict(model, load_file(os.path.join(resume, LORA_DIR, "adapter_model.safetensors")))
    return model


def build_dataloaders(config, tokenizer):
    """``(train, val)``: a resumable shuffled loader of ``train_batch_size`` rows, and a
    ``micro_batch_size_per_gpu`` loader over the validation file(s) in order (None without)."""
    from hybridrl.data.collate import collate_fn
    from hybridrl.data.dataloader import create_rl_dataloader
    from hybridrl.data.sft_dataset import SFTDataset

    data_cfg = config.data
    train = create_rl_dataloader(SFTDataset(data_cfg.train_files, tokenizer, data_cfg, "data.train_files"),
                                 batch_size=data_cfg.train_batch_size, seed=config.trainer.seed)
    val = None
    if data_cfg.get("val_files"):
        val_ds = SFTDataset(data_cfg.val_files, tokenizer, data_cfg, "data.val_files")
        val = torch.utils.data.DataLoader(val_ds, batch_size=data_cfg.micro_batch_size_per_gpu,
                                          shuffle=False, collate_fn=collate_fn)
    return train, val


def find_resume_checkpoint(trainer_cfg) -> str | None:
    """The step folder to resume from (``trainer.resume_mode``), or None to start fresh."""
    from hybridrl.trainer import checkpoint

    if trainer_cfg.resume_mode == "disable":
        return None
    if trainer_cfg.resume_mode == "resume_path":
        path = os.path.abspath(os.path.expanduser(trainer_cfg.resume_from_path))
        checkpoint.require_intact_checkpoint(path)
        return path
    return checkpoint.find_latest_checkpoint(trainer_cfg.default_local_dir)


# ---------------------------------------------------------------- the trainer


class SFTTrainer(SupervisedTrainer):
    """Runs ``fit()``: validation, then ``train_step()`` per batch, checkpoints and logging.

    Args:
        config: the resolved ``sft_trainer`` config.
        model: the causal LM (possibly LoRA-wrapped), on ``device``.
        tokenizer: saved into each checkpoint's ``huggingface/`` folder.
        train_dataloader: a ``StatefulDataLoader`` of ``SFTDataset`` batches.
        val_dataloader: validation batches, or None.
        total_training_steps: optimizer steps of the whole run.
    """

    name = "sft"
    resume_hint = "it was not written by hybridrl sft: point trainer.resume_from_path at an SFT checkpoint"

    def __init__(self, config, model, tokenizer, train_dataloader, val_dataloader, total_training_steps: int):
        super().__init__(config, model, tokenizer, train_dataloader, total_training_steps)
        self.val_dataloader = val_dataloader

    def has_validation(self) -> bool:
        return self.val_dataloader is not None

    def train_step(self, batch: dict) -> dict:
        """One optimizer step on ``batch`` (``train_batch_size`` rows) in micro batches; metrics."""
        start = time.perf_counter()
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss, n_tokens = accumulate_gradients(self.model, batch, self.config.data.micro_batch_size_per_gpu,
                                              self.compute_dtype)
        grad_norm, lr = self._optimizer_step()
        seconds = time.perf_counter() - start
        return {"train/loss": loss, "train/lr": lr, "train/grad_norm": grad_norm.item(),
                "train/loss_tokens": n_tokens, "perf/time_per_step": seconds,
                "perf/throughput": batch["attention_mask"].sum().item() / seconds}

    @torch.no_grad()
    def validate(self) -> dict:
        """``val/loss``: mean negative log-likelihood per assistant token over the validation set."""
        self.model.eval()
        loss_total, n_total = 0.0, 0.0
        for batch in self.val_dataloader:
            mb = trim_padding({k: v.to(self.device) for k, v in batch.items()})
            loss_sum, n = sft_loss(self.model, mb, self.compute_dtype)
            loss_total, n_total = loss_total + loss_sum.item(), n_total + n.item()
        return {"val/loss": loss_total / max(n_total, 1)}


# ---------------------------------------------------------------- entry point


def run_sft(config) -> None:
    """Trains with a resolved ``sft_trainer`` config (see ``hybridrl.config.load_config``)."""
    from hybridrl.controller.worker import resolve_device
    from hybridrl.models import load_tokenizer, resolve_model_path
    from hybridrl.trainer.tracking import Tracking

    for note in validate_sft_config(config):
        print(f"hybridrl: note: {note}", flush=True)
    trainer_cfg = config.trainer
    device = resolve_device(trainer_cfg.get("device", "auto"))
    torch.manual_seed(trainer_cfg.seed)
    base = resolve_model_path(config.model.partial_pretrain, config_key="model.partial_pretrain")
    tokenizer = load_tokenizer(base, trust_remote_code=config.model.get("trust_remote_code", False),
                               chat_template=config.data.get("chat_template"))
    train_dataloader, val_dataloader = build_dataloaders(config, tokenizer)
    total_steps = int(trainer_cfg.total_training_steps or len(train_dataloader) * trainer_cfg.total_epochs)

    resume = find_resume_checkpoint(trainer_cfg)
    model = build_model_for_run(config, device, resume)
    trainer = SFTTrainer(config, model, tokenizer, train_dataloader, val_dataloader, total_steps)
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


def main(argv: list[str] | None = None) -> int:
    """``hybridrl sft key=value ...`` (see :func:`hybridrl.cli.run_cli`)."""
    from hybridrl.cli import run_cli  # the entry point hands over to the command line (see .importlinter)

    return run_cli(run_sft, "sft_trainer", argv)


if __name__ == "__main__":
    sys.exit(main())
