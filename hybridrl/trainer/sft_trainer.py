"""Supervised fine-tuning: ``python -m hybridrl.trainer.sft_trainer key=value ...`` / ``hybridrl sft``.

verl's ``fsdp_sft_trainer`` on one worker, with verl's keys (``hybridrl/config/sft_trainer.yaml``):
token-level cross-entropy on the assistant's tokens only, gradient accumulation over micro
batches that equals one step on the whole batch, AdamW with warmup + cosine/constant schedule,
optional LoRA (``peft``), validation loss, and checkpoints whose ``huggingface/`` folder is a
plain HF model (LoRA merged in) that ``hybridrl train`` takes as
``actor_rollout_ref.model.path``. Errors the user can fix are printed as one line (exit 2).

Checkpoint layout (``<trainer.default_local_dir>/global_step_<N>/``, written atomically):
``huggingface/`` (config, safetensors, tokenizer), ``lora_adapter/`` (LoRA runs),
``optim_world_size_1_rank_0.pt``, ``extra_state_world_size_1_rank_0.pt`` (lr scheduler, RNG),
``data.pt`` (dataloader position) and ``trainer_state.json``.
"""

from __future__ import annotations

import copy
import logging
import os
import sys
import time

import torch

logger = logging.getLogger(__name__)

HF_DIR, LORA_DIR = "huggingface", "lora_adapter"
OPTIM_FILE, EXTRA_FILE = "optim_world_size_1_rank_0.pt", "extra_state_world_size_1_rank_0.pt"

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

    from hybridrl.config import ConfigError

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
    from hybridrl.config import ConfigError
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


def save_hf_folder(model, tokenizer, folder: str) -> None:
    """``folder/huggingface``: a plain HF model (LoRA merged in) + tokenizer; ``folder/lora_adapter`` for LoRA.

    The merge runs on a copy, so the LoRA model keeps training unchanged.
    """
    is_lora = hasattr(model, "merge_and_unload")
    if is_lora:
        model.save_pretrained(os.path.join(folder, LORA_DIR))
        model = copy.deepcopy(model).merge_and_unload()
    use_cache, model.config.use_cache = model.config.use_cache, True  # a folder for inference too
    try:
        model.save_pretrained(os.path.join(folder, HF_DIR))
    finally:
        model.config.use_cache = use_cache
    tokenizer.save_pretrained(os.path.join(folder, HF_DIR))


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
        return os.path.abspath(os.path.expanduser(trainer_cfg.resume_from_path))
    return checkpoint.find_latest_checkpoint(trainer_cfg.default_local_dir)


# ---------------------------------------------------------------- the trainer


class SupervisedTrainer:
    """The loop ``hybridrl sft`` and ``hybridrl rm`` share: optimizer and schedule, the guarded
    optimizer step, checkpoints (HF folder + optimizer + schedule/RNG, atomically) and resume,
    and ``fit()``. Subclasses give ``train_step(batch) -> metrics``, ``validate() -> metrics``
    and ``has_validation()``.

    Args:
        config: the resolved trainer config (``optim``, ``trainer``, ``model.fsdp_config``).
        model: the model being trained, on its device.
        tokenizer: saved into each checkpoint's ``huggingface/`` folder.
        train_dataloader: a ``StatefulDataLoader`` (its position is checkpointed).
        total_training_steps: optimizer steps of the whole run.
    """

    name = ""  # the command, in messages
    resume_hint = ""  # what to do when trainer.resume_from_path is not one of this command's checkpoints

    def __init__(self, config, model, tokenizer, train_dataloader, total_training_steps: int):
        from hybridrl.models import to_torch_dtype
        from hybridrl.workers.optim import build_lr_scheduler, build_optimizer

        self.config, self.model, self.tokenizer = config, model, tokenizer
        self.train_dataloader = train_dataloader
        self.total_training_steps = total_training_steps
        self.device = next(model.parameters()).device
        mixed = config.model.fsdp_config.get("mixed_precision") or {}
        self.compute_dtype = to_torch_dtype(mixed.get("param_dtype", "fp32"))
        self.optimizer = build_optimizer(model, config.optim)
        schedule = {"lr_warmup_steps": -1, "lr_warmup_steps_ratio": config.optim.warmup_steps_ratio,
                    "warmup_style": config.optim.lr_scheduler, "min_lr_ratio": 0.0, "num_cycles": 0.5}
        self.lr_scheduler = build_lr_scheduler(self.optimizer, schedule, total_training_steps)
        self.global_steps = 0
        self._resumed_batches = None

    def has_validation(self) -> bool:
        raise NotImplementedError

    def _optimizer_step(self) -> tuple[torch.Tensor, float]:
        """Clips, steps (skipped with a warning when the gradient norm is not finite) and
        advances the schedule; returns ``(grad_norm, lr used)``."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.config.optim.clip_grad)
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        else:
            logger.warning("%s: grad_norm is %s at step %d; this update is skipped", self.name, grad_norm.item(),
                           self.global_steps)
            self.optimizer.zero_grad(set_to_none=True)
        lr = self.lr_scheduler.get_last_lr()[0]
        self.lr_scheduler.step()
        return grad_norm, lr

    def _checkpoint_trainer_state(self) -> dict | None:
        """JSON-able state saved with a checkpoint (``trainer_state.json``)."""
        return None

    def save_checkpoint(self) -> str:
        from hybridrl.trainer import checkpoint
        from hybridrl.workers.checkpoint_io import rng_state

        def write(folder: str) -> None:
            save_hf_folder(self.model, self.tokenizer, folder)
            torch.save(self.optimizer.state_dict(), os.path.join(folder, OPTIM_FILE))
            torch.save({"lr_scheduler": self.lr_scheduler.state_dict(), "rng": rng_state()},
                       os.path.join(folder, EXTRA_FILE))

        trainer_cfg = self.config.trainer
        return checkpoint.save_checkpoint(trainer_cfg.default_local_dir, self.global_steps, write,
                                          self.train_dataloader.state_dict(),
                                          max_to_keep=trainer_cfg.get("max_ckpt_to_keep"),
                                          trainer_state=self._checkpoint_trainer_state())

    def load_checkpoint(self, path: str) -> None:
        """Restore optimizer, schedule, data position and RNG from ``path`` (the model weights
        were loaded when the model was built).

        Raises:
            CheckpointError: ``path`` lacks the optimizer or schedule file.
        """
        from hybridrl.trainer import checkpoint
        from hybridrl.workers.checkpoint_io import set_rng_state

        trainer_state, dataloader_state = checkpoint.read_checkpoint(path)
        for name in (OPTIM_FILE, EXTRA_FILE):
            if not os.path.isfile(os.path.join(path, name)):
                raise checkpoint.CheckpointError(f"checkpoint {path} has no {name}; {self.resume_hint}")
        self.optimizer.load_state_dict(torch.load(os.path.join(path, OPTIM_FILE), map_location=self.device,
                                                  weights_only=True))
        extra = torch.load(os.path.join(path, EXTRA_FILE), weights_only=False)
        self.lr_scheduler.load_state_dict(extra["lr_scheduler"])
        if dataloader_state is not None:
            self.train_dataloader.load_state_dict(dataloader_state)
        # Starting an epoch's iterator draws from the global RNG: do it before restoring the RNG,
        # so the resumed run continues exactly as an uninterrupted one (as the PPO trainer does).
        self._resumed_batches = iter(self.train_dataloader)
        set_rng_state(extra["rng"])
        self.global_steps = trainer_state["global_step"]
        print(f"hybridrl: resumed from {path} (step {self.global_steps})", flush=True)

    def _due(self, freq, is_last: bool) -> bool:
        """Whether a ``*_freq`` event (validation, checkpoint) happens at this step."""
        return bool(freq) and freq > 0 and (is_last or self.global_steps % freq == 0)

    def fit(self, tracker) -> None:
        """Trains until ``total_training_steps``; validates and checkpoints when due."""
        trainer_cfg = self.config.trainer
        if self.has_validation() and trainer_cfg.get("val_before_train") and self.global_steps == 0:
            tracker.log(self.validate(), step=0)
        self.global_steps += 1
        while self.global_steps <= self.total_training_steps:
            batches, self._resumed_batches = self._resumed_batches or iter(self.train_dataloader), None
            for batch in batches:
                metrics = self.train_step(batch)
                is_last = self.global_steps >= self.total_training_steps
                if self.has_validation() and self._due(trainer_cfg.test_freq, is_last):
                    metrics.update(self.validate())
                if self._due(trainer_cfg.save_freq, is_last):
                    self.save_checkpoint()
                tracker.log(metrics, step=self.global_steps)
                if is_last:
                    return
                self.global_steps += 1


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
    """``hybridrl sft key=value ...`` (see :func:`hybridrl.trainer.main_ppo.run_cli`)."""
    from hybridrl.trainer.main_ppo import run_cli

    return run_cli(run_sft, "sft_trainer", argv)


if __name__ == "__main__":
    sys.exit(main())
