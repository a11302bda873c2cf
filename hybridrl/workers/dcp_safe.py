"""Reading a DCP checkpoint folder without running anything from its files.

DCP (``torch.distributed.checkpoint``) stores two things as pickles that torch itself unpickles
without restriction: the ``.metadata`` file (``FileSystemReader`` calls ``pickle.load``) and every
non-tensor "bytes" item (``DefaultLoadPlanner.load_bytes`` calls ``torch.load(weights_only=False)``;
e.g. the optimizer's ``param_groups``, or any key a crafted ``.metadata`` marks as bytes). Here
``.metadata`` is read by :class:`_MetadataUnpickler`, which resolves only DCP's metadata classes
and the torch types they hold (torch offers no restricted reader of a plain pickle:
``torch.load(weights_only=True)`` reads only ``torch.save`` files and its restricted unpickler is
private), and bytes items with ``torch.load(weights_only=True)`` (:func:`load_bytes_item`).
Tensors DCP already loads with ``weights_only=True``.

:func:`safe_dcp_load` is ``dcp.load`` through both: the workers load a resume's model and
optimizer with it (``checkpoint_io.load_worker_state``), ``hybridrl merge`` a folder's weights,
and the driver's verification (``trainer/run/checkpoint_files.py``) the bytes items, so the check
and the load read the files the same way (a file swapped in between is refused, not run).
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import pathlib
import pickle
import warnings
from typing import Any

import torch

from hybridrl.errors import CheckpointError
from hybridrl.protocol.ops import weights_only_refusal

METADATA = ".metadata"


@contextlib.contextmanager
def quiet_single_process_dcp():
    """DCP warns on every save and load without a process group that it assumes one process,
    even with ``no_dist=True``, which asks for exactly that: that one warning is dropped."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def inside_folder(folder: str, relative: Any) -> str:
    """``folder/relative`` where ``relative`` is a relative path that stays inside ``folder``.

    Raises:
        ValueError: it is not one (absolute, ``..``, not a string).
    """
    if not isinstance(relative, str) or not relative or os.path.isabs(relative):
        raise ValueError(f"names the file {relative!r}, not a path inside the folder")
    if os.path.normpath(relative).split(os.sep)[0] == "..":
        raise ValueError(f"names the file {relative!r}, outside the folder")
    return os.path.join(folder, relative)


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
            inside_folder(folder, info.relative_path)
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
            f"the DCP item {fqn} is refused, not read ({weights_only_refusal(exc)}); nothing in it was run"
        ) from None


@functools.cache
def _safe_dcp_classes() -> tuple[type, type]:
    """``(reader, planner)``: DCP's ``FileSystemReader`` with ``.metadata`` read by
    :func:`read_dcp_metadata`, and its ``DefaultLoadPlanner`` with bytes items read by
    :func:`load_bytes_item`. Built on first use: importing DCP costs most of a second."""
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeFileSystemReader(FileSystemReader):
        # The first refusal is kept: DCP answers a failed read_metadata with a multi-line
        # AssertionError of its own, and safe_dcp_load raises this one instead.
        refusal: CheckpointError | None = None

        def read_metadata(self, *args: Any, **kwargs: Any):
            try:
                if kwargs.get("rank") is not None:  # a rank-local __<rank>.metadata: hybridrl writes none
                    raise CheckpointError(f"{self.path}: no {METADATA}")
                metadata = read_dcp_metadata(str(self.path))
            except CheckpointError as exc:
                self.refusal = self.refusal or exc
                raise
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
    return CheckpointError(
        f"{folder}: the DCP checkpoint does not load ({type(first).__name__}: {weights_only_refusal(first)})"
    )


class _DropRefusalTracebacks(logging.Filter):
    """DCP logs a failed ``read_metadata`` as a warning with its traceback (twice: it then tries a
    rank-local file) before it raises; a refusal of ours is raised as one line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], CheckpointError))


@contextlib.contextmanager
def _without_refusal_tracebacks():
    """:class:`_DropRefusalTracebacks` on the logger DCP's loader logs to (torch 2.13: the root
    logger; records of other loggers do not meet a logger's filters)."""
    from torch.distributed.checkpoint import state_dict_loader

    dcp_logger = getattr(state_dict_loader, "logger", None)
    if not isinstance(dcp_logger, logging.Logger):
        yield
        return
    drop = _DropRefusalTracebacks()
    dcp_logger.addFilter(drop)
    try:
        yield
    finally:
        dcp_logger.removeFilter(drop)


def safe_dcp_load(state: dict, folder: str, allow_partial_load: bool = False, no_dist: bool = True) -> None:
    """``dcp.load(state)`` from ``folder``, unpickling nothing but plain data: ``.metadata``
    through :func:`read_dcp_metadata`, bytes items through :func:`load_bytes_item` (DCP itself
    loads tensors with ``weights_only=True``). ``no_dist=False``: a collective of the process
    group (every rank calls it, each reading ``.metadata`` this way).

    Raises:
        CheckpointError: the folder does not load, or a file or item in it is refused (one line).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    reader_cls, planner_cls = _safe_dcp_classes()
    reader = reader_cls(folder)
    try:
        with quiet_single_process_dcp(), _without_refusal_tracebacks():
            dcp.load(
                state,
                storage_reader=reader,
                planner=planner_cls(allow_partial_load=allow_partial_load),
                no_dist=no_dist,
            )
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - DCP wraps every rank's error
        raise reader.refusal or _dcp_error(exc, folder) from None
