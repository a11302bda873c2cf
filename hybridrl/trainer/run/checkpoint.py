"""Driver-side checkpoints: one folder per step that appears atomically, or not at all.

Layout (verl's): ``<default_local_dir>/global_step_<N>/{actor,critic}/...`` written by the
workers, ``data.pt`` (dataloader state) and ``trainer_state.json`` written by the driver, and
``<default_local_dir>/latest_checkpointed_iteration.txt`` naming the newest step.

Everything is first written into ``.global_step_<N>.tmp``; only when it is complete is it
renamed into place and the tracker file replaced (both ``os.replace``, atomic on POSIX). A
crash at any moment leaves the previous checkpoint intact and found by ``find_latest_checkpoint``.
The last file written into it is ``checksums.json`` (every file's size and sha256), compared at
resume; nothing in a checkpoint is unpickled beyond plain data (``checkpoint_files``).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from typing import Callable

import torch

from hybridrl.errors import CheckpointError
from hybridrl.trainer.run.checkpoint_files import verify_dcp, verify_manifest, write_manifest
from hybridrl.workers.checkpoint_io import load_state_file

TRACKER_FILE = "latest_checkpointed_iteration.txt"
STATE_FILE = "trainer_state.json"
SETTINGS = "settings"  # the trainer_state.json entry of the config values a resume compares
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


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
    settings: dict | None = None,
) -> str:
    """Writes ``global_step_<N>`` under ``root`` atomically and returns its path.

    ``write_workers(tmp_folder)`` asks the workers to write their parts into the temporary
    folder; ``trainer_state`` (JSON-able driver state, e.g. the adaptive KL coefficient) goes
    into ``trainer_state.json`` with the step, and ``settings`` (config key -> value) with it,
    for :func:`warn_changed_settings` at resume. Older step folders beyond ``max_to_keep`` are
    removed afterwards.
    """
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, f"global_step_{global_step}")
    tmp = os.path.join(root, f".global_step_{global_step}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        os.makedirs(tmp)
        write_workers(tmp)
        if dataloader_state is not None:
            torch.save(dataloader_state, os.path.join(tmp, "data.pt"))
        state = {**(trainer_state or {}), "global_step": global_step}
        if settings:
            state[SETTINGS] = settings
        with open(os.path.join(tmp, STATE_FILE), "w") as f:
            json.dump(state, f)
        write_manifest(tmp)  # last: the checksums of every file above, renamed into place with them
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)  # never leave half a checkpoint behind
        if _out_of_space(exc):
            raise CheckpointError(
                f"no space left on the device of {root} while writing the step {global_step} checkpoint; the "
                "half-written folder was removed and the earlier checkpoints are intact; free space, or keep fewer "
                "(trainer.max_actor_ckpt_to_keep) or save less often (trainer.save_freq)"
            ) from None
        raise
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


def _out_of_space(exc: BaseException) -> bool:
    """ENOSPC anywhere in the chain, or in a worker's error message (Ray sends text)."""
    while exc is not None:
        if getattr(exc, "errno", None) == errno.ENOSPC or "No space left on device" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


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


def find_latest_checkpoint(root: str, verify: bool = True) -> str | None:
    """The newest intact ``global_step_<N>`` folder under ``root``, or None when there is none.

    The tracker file's step comes first, then the other complete folders, newest first. With
    ``verify`` each candidate is checked (:func:`verify_checkpoint`); a damaged one is reported
    in one line and the next older one is tried.

    Raises:
        CheckpointError: checkpoints exist but every one is damaged (names the newest and why).
    """
    candidates = [os.path.join(root, f"global_step_{step}") for step in reversed(_complete_steps(root))]
    tracker = os.path.join(root, TRACKER_FILE)
    if os.path.exists(tracker):
        with open(tracker) as f:
            text = f.read().strip()
        path = os.path.join(root, f"global_step_{text}")
        if text.isdigit() and path in candidates:
            candidates.remove(path)
            candidates.insert(0, path)
    first_damage = None
    for path in candidates:
        if not verify:
            return path
        try:
            verify_checkpoint(path)
            return path
        except CheckpointError as exc:
            first_damage = first_damage or str(exc)
            print(f"hybridrl: skipping a damaged checkpoint: {exc}", flush=True)
    if first_damage is not None:
        raise CheckpointError(
            f"no intact checkpoint in {root} (newest: {first_damage}); remove the damaged "
            "global_step_* folders or start over with trainer.resume_mode=disable"
        )
    return None


def verify_checkpoint(path: str) -> None:
    """Checks that every file of the step folder ``path`` can be read, before any is used:
    ``trainer_state.json`` parses, every file has the size and sha256 its ``checksums.json``
    recorded at the save (older checkpoints have none), every ``*.pt`` state file loads
    (``weights_only``), every ``*.safetensors`` file opens, and every DCP folder reads without
    running code (``checkpoint_files.verify_dcp``: its ``.metadata``, shard lengths, bytes items).

    Raises:
        CheckpointError: one line naming the damaged file and what is wrong with it.
    """
    state_file = os.path.join(path, STATE_FILE)
    try:
        with open(state_file) as f:
            step = json.load(f)["global_step"]
        if not isinstance(step, int):
            raise ValueError(f"global_step is {step!r}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{state_file}: unreadable ({type(exc).__name__}: {exc})") from None
    verify_manifest(path)
    for folder, _, files in os.walk(path):
        for name in sorted(files):
            file = os.path.join(folder, name)
            if name.endswith(".pt"):
                load_state_file(file)
            elif name.endswith(".safetensors"):
                _verify_safetensors(file)
        if ".metadata" in files:
            verify_dcp(folder)


def _verify_safetensors(file: str) -> None:
    """The header parses and the file holds every tensor's bytes (a cut file fails here)."""
    try:
        with open(file, "rb") as f:
            header_size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(header_size))
        ends = [meta["data_offsets"][1] for key, meta in header.items() if key != "__metadata__"]
        needed = 8 + header_size + max(ends, default=0)
        if os.path.getsize(file) < needed:
            raise ValueError(f"{os.path.getsize(file)} bytes, its header describes {needed}")
    except Exception as exc:  # noqa: BLE001 - any failure to parse means a damaged file
        raise CheckpointError(f"{file}: damaged safetensors file ({type(exc).__name__}: {exc})") from None


def _require_state_file(path: str) -> str:
    """``path``'s ``trainer_state.json``, which only a complete step folder has.

    Raises:
        CheckpointError: there is none.
    """
    state_file = os.path.join(path, STATE_FILE)
    if not os.path.exists(state_file):
        raise CheckpointError(
            f"trainer.resume_from_path: {path} is not a complete checkpoint (no {STATE_FILE}); "
            f"point it at a global_step_<N> folder"
        )
    return state_file


def require_intact_checkpoint(path: str) -> None:
    """``trainer.resume_from_path``: a complete step folder whose files all read.

    Raises:
        CheckpointError: the folder is not a complete checkpoint, or one of its files is damaged.
    """
    _require_state_file(path)
    try:
        verify_checkpoint(path)
    except CheckpointError as exc:
        raise CheckpointError(
            f"trainer.resume_from_path: {exc}; point it at an intact global_step_<N> folder"
        ) from None


def read_checkpoint(path: str) -> tuple[dict, dict | None]:
    """``(trainer_state, dataloader_state)`` of a step folder; ``trainer_state["global_step"]``.

    Raises:
        CheckpointError: the folder is not a complete hybridrl checkpoint, or its state files
            do not read.
    """
    state_file = _require_state_file(path)
    try:
        with open(state_file) as f:
            trainer_state = json.load(f)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{state_file}: unreadable ({type(exc).__name__}: {exc})") from None
    data_file = os.path.join(path, "data.pt")
    dataloader_state = load_state_file(data_file) if os.path.exists(data_file) else None
    return trainer_state, dataloader_state


def run_is_complete(global_step: int, total_training_steps: int) -> bool:
    """Whether a run resumed at ``global_step`` has nothing left to train (its checkpoint is at or
    past ``total_training_steps``), in which case it says so in one line."""
    if global_step < total_training_steps:
        return False
    print(
        f"hybridrl: the run is complete: its checkpoint is at step {global_step} of "
        f"trainer.total_training_steps={total_training_steps}; nothing to train (raise "
        "trainer.total_training_steps or trainer.total_epochs to train on)",
        flush=True,
    )
    return True


def warn_changed_settings(path: str, trainer_state: dict, settings: dict) -> None:
    """Warns in one line about every config value of ``settings`` (key -> value) that differs from
    the one the checkpoint at ``path`` was saved with (its ``trainer_state``); a key it did not
    save (older checkpoints saved none) is not compared. The run goes on with the new values."""
    saved = trainer_state.get(SETTINGS) or {}
    changed = [
        f"{key} {saved[key]!r} -> {value!r}" for key, value in settings.items() if key in saved and saved[key] != value
    ]
    if changed:
        print(f"hybridrl: warning: resuming {path} with a changed config: {', '.join(changed)}", flush=True)


def resume_checkpoint_path(trainer_cfg) -> str | None:
    """The step folder a run resumes from (``trainer.resume_mode``): the newest intact one in
    ``default_local_dir`` (``auto``), ``resume_from_path`` (``resume_path``), or None (fresh start).

    Raises:
        CheckpointError: ``resume_from_path`` is not an intact step folder, or every checkpoint
            in ``default_local_dir`` is damaged.
    """
    if trainer_cfg.resume_mode == "disable":
        return None
    if trainer_cfg.resume_mode == "resume_path":
        path = os.path.abspath(os.path.expanduser(trainer_cfg.resume_from_path))
        require_intact_checkpoint(path)
        return path
    return find_latest_checkpoint(trainer_cfg.default_local_dir)
