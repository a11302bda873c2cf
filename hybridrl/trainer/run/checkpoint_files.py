"""The files of a checkpoint folder: nothing in them runs code, and they are the bytes saved.

No pickled objects. DCP's ``.metadata`` and its non-tensor "bytes" items are pickles that torch
itself unpickles without restriction; ``workers/dcp_safe.py`` (a lower layer, so the workers'
own load on resume uses the same code) reads them restricted to plain data. :func:`verify_dcp`
reads a folder that way before a resume or ``hybridrl merge`` trusts it (its ``.metadata``,
shard lengths, bytes items); the workers and ``hybridrl merge`` then load it with
``dcp_safe.safe_dcp_load``, which reads the files that way again (a file swapped in between is
refused, not run).

Checksums. :func:`write_manifest` records the size and sha256 of every file of a step folder in
its ``checksums.json`` before the folder is renamed into place (so it appears with the
checkpoint, atomically); :func:`verify_manifest` compares them at resume and merge, which
catches what a readable-but-changed file hides (e.g. a stretch of zeros inside a shard).
Checkpoints saved before checksums were recorded have no ``checksums.json`` and are not
compared (one info log). Files added to a step folder after the save (e.g. the SFT export's
``huggingface/``) are not listed and not compared.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os

from hybridrl.errors import CheckpointError
from hybridrl.workers.dcp_safe import inside_folder, read_dcp_metadata, safe_dcp_load

logger = logging.getLogger(__name__)

MANIFEST = "checksums.json"
_CHUNK = 1 << 22


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(folder: str) -> None:
    """Writes ``<folder>/checksums.json``: the size and sha256 of every file under ``folder``
    (relative paths with ``/``). Called on the temporary step folder, last, before its rename."""
    files = {}
    for parent, _, names in os.walk(folder):
        for name in sorted(names):
            path = os.path.join(parent, name)
            relative = os.path.relpath(path, folder).replace(os.sep, "/")
            if relative != MANIFEST:
                files[relative] = {"size": os.path.getsize(path), "sha256": _sha256(path)}
    path = os.path.join(folder, MANIFEST)
    with open(path, "w") as f:
        json.dump({"algorithm": "sha256", "files": dict(sorted(files.items()))}, f, indent=0)
        f.flush()
        os.fsync(f.fileno())


def verify_manifest(folder: str, under: str | None = None) -> bool:
    """Compares every file listed in ``<folder>/checksums.json`` (only those below ``under``, a
    subfolder, when given) with its recorded size and sha256. Returns False, with an info log,
    when the folder has no ``checksums.json`` (saved before checksums were recorded).

    Raises:
        CheckpointError: one line naming a file that is missing, of another size or of other
            content than at the save, or an unreadable ``checksums.json``.
    """
    manifest = os.path.join(folder, MANIFEST)
    if not os.path.exists(manifest):
        logger.info("%s: no %s (saved before checksums were recorded): its files are not compared", folder, MANIFEST)
        return False
    try:
        with open(manifest) as f:
            files = json.load(f)["files"]
        entries = [(relative, int(entry["size"]), str(entry["sha256"])) for relative, entry in files.items()]
        paths = [inside_folder(folder, relative) for relative, _, _ in entries]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{manifest}: unreadable ({type(exc).__name__}: {exc})") from None
    prefix = under.strip("/") + "/" if under else ""
    for (relative, size, sha256), path in zip(entries, paths):
        if not relative.startswith(prefix):
            continue
        if not os.path.isfile(path):
            raise CheckpointError(f"{path}: missing, the save wrote it ({MANIFEST})")
        actual = os.path.getsize(path)
        if actual != size:
            raise CheckpointError(
                f"{path}: {actual} bytes, the save wrote {size} ({MANIFEST}): truncated or changed since"
            )
        if _sha256(path) != sha256:
            raise CheckpointError(
                f"{path}: its sha256 checksum differs from the one recorded at the save ({MANIFEST}): "
                "the file was damaged or changed since"
            )
    return True


def verify_dcp(folder: str) -> None:
    """The DCP checkpoint in ``folder`` reads without running code: its ``.metadata`` is DCP
    metadata (:func:`read_dcp_metadata`), every shard is as long as the ``.metadata`` says, and
    every bytes item loads with ``weights_only=True`` (``dcp_safe``).

    Raises:
        CheckpointError: one line naming the damaged or refused file or item.
    """
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    metadata = read_dcp_metadata(folder)
    needed: dict[str, int] = {}
    for info in metadata.storage_data.values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for relative, size in sorted(needed.items()):
        file = os.path.join(folder, relative)
        actual = os.path.getsize(file) if os.path.isfile(file) else None
        if actual is None or actual < size:
            raise CheckpointError(
                f"{file}: {'missing' if actual is None else f'{actual} bytes'}, "
                f"its .metadata needs {size}: the shard is truncated"
            )
    items = [fqn for fqn, md in metadata.state_dict_metadata.items() if isinstance(md, BytesStorageMetadata)]
    if items:
        safe_dcp_load(dict.fromkeys(items), folder)
