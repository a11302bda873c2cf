"""The driver ``hybridrl sft`` and ``hybridrl rm`` share, on the PPO trainer's stack.

The model lives in a worker group (:mod:`hybridrl.workers.supervised_worker`), built like PPO's:
in this process (``trainer.backend=local``) or on ``trainer.nnodes x trainer.n_gpus_per_node``
Ray workers with FSDP2. The driver draws each batch, hands it to the group (each worker trains
on its share; the update equals one worker on the whole batch); PPO's loop
(:func:`~hybridrl.trainer.run.loop.run_training`) resumes, validates, logs and checkpoints on schedule.

Checkpoint layout (PPO's): ``<trainer.default_local_dir>/global_step_<N>/`` written atomically
with ``model/`` (the workers' DCP checkpoint: ``dcp/``, ``extra_state_*.pt``, ``huggingface/``
config + tokenizer, ``lora_adapter/`` for LoRA runs), ``data.pt`` (dataloader position) and
``trainer_state.json``. After the last step, ``hybridrl merge`` exports its checkpoint into
``global_step_<N>/huggingface/``: a plain HF model (LoRA merged in).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

import torch

from hybridrl.errors import CheckpointError
from hybridrl.protocol import DataProto
from hybridrl.trainer.jobs.merge import merge
from hybridrl.trainer.jobs.supervised_config import steps_of
from hybridrl.trainer.run import checkpoint
from hybridrl.trainer.run.checkpoint_lock import run_folder_lock
from hybridrl.trainer.run.loop import LoopSettings, run_training
from hybridrl.trainer.run.metrics import reduce_metrics
from hybridrl.trainer.run.tracking import tracker_for_run
from hybridrl.trainer.run.worker_groups import launch_worker_groups
from hybridrl.workers.checkpoint_io import HF_DIR

MODEL_DIR = "model"  # the worker checkpoint inside a step folder (PPO's are actor/ and critic/)


class SupervisedTrainer:
    """``fit()`` trains until ``total_training_steps``, validating and checkpointing when due, in
    the loop PPO runs (:func:`~hybridrl.trainer.run.loop.run_training`). Subclasses give
    ``to_proto(batch)`` and ``validate()``.

    Args:
        config: the resolved ``sft_trainer`` / ``rm_trainer`` config.
        worker_group: the group of :class:`~hybridrl.workers.supervised_worker.SupervisedWorker`.
        train_dataloader: a ``StatefulDataLoader`` (its position is checkpointed).
        val_data: the validation loader or dataset, or None.
        total_training_steps: optimizer steps of the whole run.
        resume_path: the checkpoint ``fit()`` resumes from (:meth:`load_checkpoint`), or None.
    """

    name = ""  # the command, in messages
    always_on_last = False  # whether the last step validates and saves whatever test_freq/save_freq say

    def __init__(
        self,
        config,
        worker_group,
        train_dataloader,
        val_data,
        total_training_steps: int,
        resume_path: str | None = None,
    ):
        self.config = config
        self.worker_group = worker_group
        self.train_dataloader = train_dataloader
        self.val_data = val_data
        self.total_training_steps = total_training_steps
        self.resume_path = resume_path
        self.global_steps = 0
        self.export_dir: str | None = None

    def has_validation(self) -> bool:
        """Whether the run has validation data (``data.val_files``)."""
        return self.val_data is not None

    def to_proto(self, batch: dict) -> DataProto:
        """A dataloader batch as the rows the workers take."""
        raise NotImplementedError

    def validate(self) -> dict:
        """The validation metrics (``val/...``)."""
        raise NotImplementedError

    def step(self, batch: dict) -> dict:
        """One optimizer step on ``batch`` over the worker group; the step's metrics (with verl's
        ``perf/max_memory_allocated_gb``, ``perf/max_memory_reserved_gb``, ``perf/cpu_memory_used_gb``:
        GiB, the maximum over the workers)."""
        start = time.perf_counter()
        output = self.worker_group.train_batch(self.to_proto(batch))
        seconds = time.perf_counter() - start
        metrics = reduce_metrics(output.meta_info["metrics"])  # the mean over the workers, the memory's maximum
        metrics.update(self.output_metrics(output))
        metrics["perf/time_per_step"] = seconds
        return metrics

    def output_metrics(self, output: DataProto) -> dict:
        """Metrics of the rows the workers returned (none by default)."""
        return {}

    def _checkpoint_trainer_state(self) -> dict | None:
        """JSON-able state saved with a checkpoint (``trainer_state.json``)."""
        return None

    def save_checkpoint(self) -> str:
        """Writes ``global_step_<N>`` (module docstring); returns its folder."""
        trainer_cfg = self.config.trainer

        def write_workers(folder: str) -> None:
            self.worker_group.save_checkpoint(os.path.join(folder, MODEL_DIR), self.global_steps)

        return checkpoint.save_checkpoint(
            trainer_cfg.default_local_dir,
            self.global_steps,
            write_workers,
            self.train_dataloader.state_dict(),
            max_to_keep=trainer_cfg.max_ckpt_to_keep,
            trainer_state=self._checkpoint_trainer_state(),
            settings=self.resume_settings(),
        )

    def resume_settings(self) -> dict:
        """The config values (key -> value) a resume warns about when they changed
        (:func:`~hybridrl.trainer.run.checkpoint.warn_changed_settings`)."""
        cfg = self.config
        return {
            "optim.lr": cfg.optim.lr,
            "data.train_batch_size": cfg.data.train_batch_size,
            "data.micro_batch_size_per_gpu": cfg.data.micro_batch_size_per_gpu,
        }

    def load_checkpoint(self, path: str | None = None) -> Iterator[dict] | None:
        """Restores the workers (model, optimizer, schedule, RNG) and the data position from ``path``
        (default: ``resume_path``); returns the rest of the checkpoint's epoch (None: no checkpoint).

        Raises:
            CheckpointError: ``path`` has no ``model/`` worker checkpoint (e.g. a PPO checkpoint),
                or it is incomplete or of another ``model.lora_rank``.
        """
        path = path or self.resume_path
        if path is None:
            return None
        if not os.path.isdir(os.path.join(path, MODEL_DIR)):
            raise CheckpointError(
                f"checkpoint {path} has no {MODEL_DIR}/ folder: it was not written by this version of "
                f"hybridrl {self.name}; point trainer.resume_from_path at a global_step_<N> folder it "
                "wrote, or start over with trainer.resume_mode=disable"
            )
        trainer_state, dataloader_state = checkpoint.read_checkpoint(path)
        if dataloader_state is not None:
            self.train_dataloader.load_state_dict(dataloader_state)
        # Starting an epoch's iterator draws from the global RNG: do it before the workers restore
        # the RNG, so the resumed run continues exactly as an uninterrupted one (as PPO does).
        resumed = iter(self.train_dataloader)
        self.worker_group.load_checkpoint(os.path.join(path, MODEL_DIR))
        self.global_steps = trainer_state["global_step"]
        print(f"hybridrl: resumed from {path} (step {self.global_steps})", flush=True)
        checkpoint.warn_changed_settings(path, trainer_state, self.resume_settings())
        return resumed

    def fit(self, tracker) -> None:
        """Resumes from ``resume_path``, then trains until ``total_training_steps``, validating and
        checkpointing when due (:func:`~hybridrl.trainer.run.loop.run_training`). A run resumed at (or
        past) its last step trains nothing."""
        trainer_cfg = self.config.trainer
        settings = LoopSettings(
            test_freq=steps_of(trainer_cfg.test_freq, len(self.train_dataloader)),
            save_freq=steps_of(trainer_cfg.save_freq, len(self.train_dataloader)),
            val_before_train=trainer_cfg.val_before_train,
            always_on_last=self.always_on_last,
        )
        run_training(self, tracker, settings)

    def export(self) -> str | None:
        """``hybridrl merge`` of the last step's checkpoint into its ``huggingface/`` folder
        (written atomically); the folder, or None when the last step saved no checkpoint."""
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        if not os.path.isdir(os.path.join(folder, MODEL_DIR)):
            return None
        return merge(os.path.join(folder, MODEL_DIR), os.path.join(folder, HF_DIR))


def run_supervised(config, worker_cls, trainer_cls, build_data: Callable) -> SupervisedTrainer:
    """Trains with a typed ``sft_trainer`` / ``rm_trainer`` config (as a structured DictConfig,
    :mod:`.supervised_config`): data, then the worker group, ``fit()`` (resume included) with the
    run's tracker, and the export of the last checkpoint.

    Args:
        worker_cls: the :class:`~hybridrl.workers.supervised_worker.SupervisedWorker` to train with.
        trainer_cls: the :class:`SupervisedTrainer` subclass.
        build_data: ``config -> (train_dataloader, val_data)`` (the driver's tokenizer inside).

    Returns:
        the trainer after ``fit()`` (``global_steps``, ``export_dir``: the exported HF folder
        or None, and its subclass's last metrics).

    Raises:
        RunFolderBusy: another run holds ``trainer.default_local_dir``.
    """
    with run_folder_lock(config.trainer.default_local_dir):  # one run per folder: a second one stops here
        torch.manual_seed(config.trainer.seed)
        train_dataloader, val_data = build_data(config)
        trainer_cfg = config.trainer
        total_steps = int(trainer_cfg.total_training_steps or len(train_dataloader) * trainer_cfg.total_epochs)
        resume = checkpoint.resume_checkpoint_path(trainer_cfg)
        groups = launch_worker_groups(config, {MODEL_DIR: (worker_cls, (config, total_steps), {})})
        try:
            trainer = trainer_cls(config, groups.groups[MODEL_DIR], train_dataloader, val_data, total_steps, resume)
            tracker = tracker_for_run(config, total_steps)
            try:
                trainer.fit(tracker)
            finally:
                tracker.finish()
        finally:
            groups.shutdown()
        trainer.export_dir = trainer.export()
    return trainer
