"""Driver-side checkpoints: one folder per step that appears atomically, or not at all.

Layout (verl's): ``<default_local_dir>/global_step_<N>/{actor,critic}/...`` written by the
workers, ``data.pt`` (dataloader state) and ``trainer_state.json`` written by the driver, and
``<default_local_dir>/latest_checkpointed_iteration.txt`` naming the newest step.

Everything is first written into ``.global_step_<N>.tmp``; only when it is complete is it
renamed into place and the tracker file replaced (both ``os.replace``, atomic on POSIX). A
crash at any moment leaves the previous checkpoint intact and found by ``find_latest_checkpoint``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Callable

import torch

TRACKER_FILE = "latest_checkpointed_iteration.txt"
STATE_FILE = "trainer_state.json"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


class CheckpointError(ValueError):
    pass


def _atomic_write_text(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(
    root: str,
    global_step: int,
    write_workers: Callable[[str], None],
    dataloader_state: dict | None,
    max_to_keep: int | None = None,
    trainer_state: dict | None = None,
) -> str:
    """Writes ``global_step_<N>`` under ``root`` atomically and returns its path.

    ``write_workers(tmp_folder)`` asks the workers to write their parts into the temporary
    folder; ``trainer_state`` (JSON-able driver state, e.g. the adaptive KL coefficient) goes
    into ``trainer_state.json`` with the step. Older step folders beyond ``max_to_keep`` are
    removed afterwards.
    """
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, f"global_step_{global_step}")
    tmp = os.path.join(root, f".global_step_{global_step}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    write_workers(tmp)
    if dataloader_state is not None:
        torch.save(dataloader_state, os.path.join(tmp, "data.pt"))
    with open(os.path.join(tmp, STATE_FILE), "w") as f:
        json.dump({**(trainer_state or {}), "global_step": global_step}, f)
    if os.path.exists(final):  # re-saving a step (e.g. after a resume): swap, then drop the old one
        stale = f"{final}.stale"
        shutil.rmtree(stale, ignore_errors=True)
        os.replace(final, stale)
        os.replace(tmp, final)
        shutil.rmtree(stale, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _atomic_write_text(os.path.join(root, TRACKER_FILE), str(global_step))
    if max_to_keep:
        _prune(root, max_to_keep)
    return final


def _complete_steps(root: str) -> list[int]:
    steps = []
    for name in os.listdir(root) if os.path.isdir(root) else []:
        match = _STEP_DIR.match(name)
        if match and os.path.exists(os.path.join(root, name, STATE_FILE)):
            steps.append(int(match.group(1)))
    return sorted(steps)


def _prune(root: str, max_to_keep: int) -> None:
    for step in _complete_steps(root)[:-max_to_keep]:
        shutil.rmtree(os.path.join(root, f"global_step_{step}"), ignore_errors=True)


def find_latest_checkpoint(root: str) -> str | None:
    """The newest complete ``global_step_<N>`` folder under ``root``, or None."""
    tracker = os.path.join(root, TRACKER_FILE)
    if os.path.exists(tracker):
        with open(tracker) as f:
            text = f.read().strip()
        path = os.path.join(root, f"global_step_{text}")
        if text.isdigit() and os.path.exists(os.path.join(path, STATE_FILE)):
            return path
    steps = _complete_steps(root)
    return os.path.join(root, f"global_step_{steps[-1]}") if steps else None


def read_checkpoint(path: str) -> tuple[dict, dict | None]:
    """``(trainer_state, dataloader_state)`` of a step folder; ``trainer_state["global_step"]``.

    Raises:
        CheckpointError: the folder is not a complete hybridrl checkpoint.
    """
    state_file = os.path.join(path, STATE_FILE)
    if not os.path.exists(state_file):
        raise CheckpointError(
            f"trainer.resume_from_path: {path} is not a complete checkpoint (no {STATE_FILE}); "
            f"point it at a global_step_<N> folder"
        )
    with open(state_file) as f:
        trainer_state = json.load(f)
    data_file = os.path.join(path, "data.pt")
    dataloader_state = torch.load(data_file, weights_only=False) if os.path.exists(data_file) else None
    return trainer_state, dataloader_state
