"""The files of a checkpoint folder: nothing in them runs code, and they are the bytes saved.

No pickled objects. DCP (``torch.distributed.checkpoint``) stores two things as pickles that
torch itself unpickles without restriction: the ``.metadata`` file (``FileSystemReader`` calls
``pickle.load``) and every non-tensor "bytes" item (``DefaultLoadPlanner.load_bytes`` calls
``torch.load(weights_only=False)``; e.g. the optimizer's ``param_groups``, or any key a crafted
``.metadata`` marks as bytes). Here ``.metadata`` is read by :class:`_MetadataUnpickler`, which
resolves only DCP's metadata classes and the torch types they hold (torch offers no restricted
reader of a plain pickle: ``torch.load(weights_only=True)`` reads only ``torch.save`` files and
its restricted unpickler is private), and bytes items with ``torch.load(weights_only=True)``
(:func:`load_bytes_item`). Tensors DCP already loads with ``weights_only=True``.
:func:`verify_dcp` reads a folder that way before anything else reads it, and
``hybridrl merge`` loads with :func:`safe_dcp_load`. A resume's workers then load the verified
folder with DCP's own reader (``workers/checkpoint_io.py``, a lower layer than this module).

Checksums. :func:`write_manifest` records the size and sha256 of every file of a step folder in
its ``checksums.json`` before the folder is renamed into place (so it appears with the
checkpoint, atomically); :func:`verify_manifest` compares them at resume and merge, which
catches what a readable-but-changed file hides (e.g. a stretch of zeros inside a shard).
Checkpoints saved before checksums were recorded have no ``checksums.json`` and are not
compared (one info log). Files added to a step folder after the save (e.g. the SFT export's
``huggingface/``) are not listed and not compared.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import logging
import os
import pathlib
import pickle
from typing import Any

import torch

from hybridrl.errors import CheckpointError
from hybridrl.protocol_ops import _refusal as _reason  # torch's weights_only refusal, in a few words

logger = logging.getLogger(__name__)

MANIFEST = "checksums.json"
METADATA = ".metadata"
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


def _inside(folder: str, relative: Any) -> str:
    """``folder/relative`` where ``relative`` is a relative path that stays inside ``folder``.

    Raises:
        ValueError: it is not one (absolute, ``..``, not a string).
    """
    if not isinstance(relative, str) or not relative or os.path.isabs(relative):
        raise ValueError(f"names the file {relative!r}, not a path inside the folder")
    if os.path.normpath(relative).split(os.sep)[0] == "..":
        raise ValueError(f"names the file {relative!r}, outside the folder")
    return os.path.join(folder, relative)


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
        paths = [_inside(folder, relative) for relative, _, _ in entries]
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


def _metadata_globals() -> dict[tuple[str, str], Any]:
    """What a DCP ``.metadata`` pickle may name: DCP's metadata dataclasses, ``torch.Size``,
    the dtypes and layouts of its tensors, and the ``pathlib`` path of ``checkpoint_id``.
    None of them runs anything when built (plain dataclasses, an enum, a tuple, a path)."""
    from torch.distributed.checkpoint import filesystem, metadata

    classes = [
        *(getattr(metadata, name) for name in metadata.__all__),
        getattr(metadata, "_MEM_FORMAT_ENCODING", None),
        getattr(filesystem, "_StorageInfo", None),
        torch.Size,
        pathlib.PurePosixPath,
        pathlib.PosixPath,
        pathlib.PureWindowsPath,
    ]
    allowed: dict[tuple[str, str], Any] = {}
    for cls in classes:
        if isinstance(cls, type):
            allowed[(cls.__module__, cls.__qualname__)] = cls
    for cls in (pathlib.PurePosixPath, pathlib.PosixPath, pathlib.PureWindowsPath):
        allowed[("pathlib", cls.__name__)] = cls  # the name pickle writes, whatever module defines it
    if hasattr(torch.serialization, "_get_layout"):  # how torch pickles a layout (a dict lookup by name)
        allowed[("torch.serialization", "_get_layout")] = torch.serialization._get_layout
    for name, value in vars(torch).items():
        if isinstance(value, (torch.dtype, torch.layout)):
            allowed[("torch", name)] = value
    return allowed


class _Refused(pickle.UnpicklingError):
    """The pickle names a global outside :func:`_metadata_globals` (it was not called)."""


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles a DCP ``.metadata`` resolving only :func:`_metadata_globals`: a pickle naming any
    other callable (``os.system``, ``builtins.eval``, ...) is refused before it is called
    (Python's "restricting globals"; persistent ids are refused by the base class)."""

    _allowed: dict[tuple[str, str], Any] | None = None

    def find_class(self, module: str, name: str) -> Any:
        if _MetadataUnpickler._allowed is None:
            _MetadataUnpickler._allowed = _metadata_globals()
        found = _MetadataUnpickler._allowed.get((module, name))
        if found is None:
            raise _Refused(f"it names {module}.{name}, which a DCP .metadata never holds")
        return found


def read_dcp_metadata(folder: str):
    """The DCP ``Metadata`` of ``folder``, read without running anything, whose storage entries
    all name files inside ``folder``.

    Raises:
        CheckpointError: one line naming the ``.metadata`` file and what is wrong: empty, cut,
            not DCP metadata, or refused (it names a callable; nothing was run).
    """
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import Metadata

    path = os.path.join(folder, METADATA)
    try:
        with open(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
        if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
            raise ValueError(f"holds a {type(metadata).__name__}, not DCP metadata")
        for info in metadata.storage_data.values():
            if not isinstance(info, _StorageInfo):
                raise ValueError(f"a storage entry is a {type(info).__name__}")
            _inside(folder, info.relative_path)
            if not (isinstance(info.offset, int) and isinstance(info.length, int)) or min(info.offset, info.length) < 0:
                raise ValueError(f"a storage entry of {info.relative_path!r} has offset {info.offset!r}")
    except _Refused as exc:
        raise CheckpointError(f"{path}: refused, not read ({exc}); nothing in it was run") from None
    except EOFError:
        raise CheckpointError(f"{path}: {'empty' if os.path.getsize(path) == 0 else 'cut short'}") from None
    except Exception as exc:  # noqa: BLE001 - a damaged pickle fails in many ways
        raise CheckpointError(f"{path}: unreadable DCP metadata ({type(exc).__name__}: {exc})") from None
    return metadata


def load_bytes_item(fqn: str, value: io.BytesIO) -> Any:
    """A DCP bytes item, loaded with ``weights_only=True`` (plain values, tensors, containers).

    Raises:
        CheckpointError: it holds anything else, or is damaged (one line naming the key).
    """
    try:
        return torch.load(value, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - refused globals, cut zip and EOF all mean a bad item
        raise CheckpointError(
            f"the DCP item {fqn} is refused, not read ({_reason(exc)}); nothing in it was run"
        ) from None


@functools.cache
def _safe_dcp_classes() -> tuple[type, type]:
    """``(reader, planner)``: DCP's ``FileSystemReader`` with ``.metadata`` read by
    :func:`read_dcp_metadata`, and its ``DefaultLoadPlanner`` with bytes items read by
    :func:`load_bytes_item`. Built on first use: importing DCP costs most of a second."""
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeFileSystemReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any):
            if kwargs.get("rank") is not None:  # a rank-local __<rank>.metadata: hybridrl writes none
                raise CheckpointError(f"{self.path}: no {METADATA}")
            metadata = read_dcp_metadata(str(self.path))
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id  # as FileSystemReader.read_metadata does
            return metadata

    class SafeLoadPlanner(DefaultLoadPlanner):
        # The base class loads a bytes item with torch.load(weights_only=False); the item is loaded
        # here with weights_only=True and handed on as a torch.save of that plain value, so the base
        # class still places it (flattened keys and all) without any private DCP function.
        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            safe = io.BytesIO()
            torch.save(load_bytes_item(read_item.dest_index.fqn, value), safe)
            safe.seek(0)
            super().load_bytes(read_item, safe)

    return SafeFileSystemReader, SafeLoadPlanner


def _dcp_error(exc: BaseException, folder: str) -> CheckpointError:
    """One line for a failed ``dcp.load`` of ``folder``: DCP wraps each rank's error into a
    multi-line ``CheckpointException``; a :class:`CheckpointError` inside it keeps its words."""
    failures = getattr(exc, "failures", None) or {}
    inner = [pair[0] if isinstance(pair, tuple) else pair for pair in failures.values()] or [exc]
    for error in inner:
        if isinstance(error, CheckpointError):
            return error if str(error).startswith(folder) else CheckpointError(f"{folder}: {error}")
    first = inner[0]
    return CheckpointError(f"{folder}: the DCP checkpoint does not load ({type(first).__name__}: {_reason(first)})")


def safe_dcp_load(state: dict, folder: str, allow_partial_load: bool = False) -> None:
    """``dcp.load(state)`` from ``folder`` in this process alone, unpickling nothing but plain
    data: ``.metadata`` through :func:`read_dcp_metadata`, bytes items through
    :func:`load_bytes_item` (DCP itself loads tensors with ``weights_only=True``).

    Raises:
        CheckpointError: the folder does not load, or a file or item in it is refused (one line).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from hybridrl.workers.checkpoint_io import quiet_single_process_dcp

    reader, planner = _safe_dcp_classes()
    try:
        with quiet_single_process_dcp():
            dcp.load(
                state,
                storage_reader=reader(folder),
                planner=planner(allow_partial_load=allow_partial_load),
                no_dist=True,
            )
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - DCP wraps every rank's error
        raise _dcp_error(exc, folder) from None


def verify_dcp(folder: str) -> None:
    """The DCP checkpoint in ``folder`` reads without running code: its ``.metadata`` is DCP
    metadata (:func:`read_dcp_metadata`), every shard is as long as the ``.metadata`` says, and
    every bytes item loads with ``weights_only=True`` (so a later DCP load, whose planner reads
    them unrestricted, only meets plain values).

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
