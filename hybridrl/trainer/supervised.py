"""The training loop ``hybridrl sft`` and ``hybridrl rm`` share (one worker, one model) and its
checkpoint layout: ``<trainer.default_local_dir>/global_step_<N>/`` written atomically with
``huggingface/`` (an HF model + tokenizer, LoRA merged in), ``lora_adapter/`` (LoRA runs),
:data:`OPTIM_FILE`, :data:`EXTRA_FILE` (lr scheduler, RNG), ``data.pt`` (dataloader position)
and ``trainer_state.json``.
"""

from __future__ import annotations

import copy
import logging
import os

import torch

from hybridrl.workers.checkpoint_io import HF_DIR

logger = logging.getLogger(__name__)

LORA_DIR = "lora_adapter"
OPTIM_FILE, EXTRA_FILE = "optim_world_size_1_rank_0.pt", "extra_state_world_size_1_rank_0.pt"


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
        from hybridrl.workers.checkpoint_io import load_state_file, set_rng_state

        trainer_state, dataloader_state = checkpoint.read_checkpoint(path)
        for name in (OPTIM_FILE, EXTRA_FILE):
            if not os.path.isfile(os.path.join(path, name)):
                raise checkpoint.CheckpointError(f"checkpoint {path} has no {name}; {self.resume_hint}")
        self.optimizer.load_state_dict(torch.load(os.path.join(path, OPTIM_FILE), map_location=self.device,
                                                  weights_only=True))
        extra = load_state_file(os.path.join(path, EXTRA_FILE))
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
