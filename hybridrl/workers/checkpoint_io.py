"""What one worker writes into (and reads from) a checkpoint folder.

Files per rank, as verl names them: ``model_world_size_{W}_rank_{R}.pt``,
``optim_world_size_{W}_rank_{R}.pt``, ``extra_state_world_size_{W}_rank_{R}.pt`` (lr scheduler
and RNG), plus ``huggingface/`` (config and tokenizer) from rank 0 so the folder can be turned
into an HF model. The driver makes the whole step folder appear atomically.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch


def _paths(local_path: str, rank: int, world_size: int) -> dict[str, str]:
    suffix = f"world_size_{world_size}_rank_{rank}.pt"
    return {name: os.path.join(local_path, f"{name}_{suffix}") for name in ("model", "optim", "extra_state")}


def rng_state() -> dict:
    state = {"cpu": torch.get_rng_state(), "numpy": np.random.get_state(), "random": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    np.random.set_state(state["numpy"])
    random.setstate(state["random"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_worker_state(local_path, module, optimizer, lr_scheduler, rank, world_size, tokenizer=None) -> None:
    os.makedirs(local_path, exist_ok=True)
    paths = _paths(local_path, rank, world_size)
    torch.save(module.state_dict(), paths["model"])
    torch.save(optimizer.state_dict(), paths["optim"])
    torch.save({"lr_scheduler": lr_scheduler.state_dict(), "rng": rng_state()}, paths["extra_state"])
    if rank == 0:
        hf_dir = os.path.join(local_path, "huggingface")
        module.config.save_pretrained(hf_dir)
        if tokenizer is not None:
            tokenizer.save_pretrained(hf_dir)


def load_worker_state(local_path, module, optimizer, lr_scheduler, rank, world_size) -> None:
    """Raises CheckpointError naming the missing file (e.g. a different world size)."""
    from hybridrl.trainer.checkpoint import CheckpointError

    paths = _paths(local_path, rank, world_size)
    for path in paths.values():
        if not os.path.exists(path):
            raise CheckpointError(
                f"checkpoint file {path} is missing; the checkpoint in {local_path} was written by a "
                f"different number of workers or is incomplete"
            )
    module.load_state_dict(torch.load(paths["model"], map_location="cpu", weights_only=True))
    optimizer.load_state_dict(torch.load(paths["optim"], map_location="cpu", weights_only=True))
    extra = torch.load(paths["extra_state"], map_location="cpu", weights_only=False)
    lr_scheduler.load_state_dict(extra["lr_scheduler"])
    set_rng_state(extra["rng"])
