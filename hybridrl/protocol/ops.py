"""DataProto operations beyond the row basics: folding the batch dim, per-row repeat, unfolding
column chunks, mini-batch iteration and save / load (verl's ``DataProto`` API).

The :class:`~hybridrl.protocol.DataProto` methods ``sample_level_repeat``,
``unfold_column_chunks``, ``make_iterator``, ``save_to_disk`` and ``load_from_disk`` call the
functions here; ``fold_batch_dim`` and ``unfold_batch_dim`` are importable from
:mod:`hybridrl.protocol` too. Functions that reshape return a new object of the input's class
and leave the input unchanged.
"""

from __future__ import annotations

import os
import pickle
import re
import warnings
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np
import torch
from tensordict import TensorDict

from hybridrl.protocol.errors import BatchSizeMismatchError, ChunkSizeError, DataProtoError, MissingKeyError

if TYPE_CHECKING:  # the functions build results with type(data), so DataProto subclasses keep their class
    from hybridrl.protocol.data_proto import DataProto

_FILE_FORMAT = "hybridrl.DataProto"
_FILE_VERSION = 1


# --------------------------------------------------------------------------- batch-dim folding
def fold_batch_dim(data: DataProto, new_batch_size: int) -> DataProto:
    """Group consecutive rows: ``(n, ...)`` becomes ``(new_batch_size, n // new_batch_size, ...)``.

    Tensors and non-tensors (object arrays gain a second dim) are reshaped alike; the result
    has ``new_batch_size`` rows, row ``i`` holding old rows ``i*k .. i*k + k - 1``
    (``k = n // new_batch_size``). Undo with :func:`unfold_batch_dim` (``batch_dims=2``).

    Raises:
        ChunkSizeError: ``new_batch_size < 1`` or it does not divide ``len(data)``.
    """
    n = len(data)
    if new_batch_size < 1 or n % new_batch_size != 0:
        raise ChunkSizeError(
            f"fold_batch_dim: {n} rows cannot be folded into {new_batch_size} rows; "
            f"new_batch_size must divide {n} (pad with pad_dataproto_to_divisor first)"
        )
    batch = None
    if data.batch is not None:
        tensors = {k: t.reshape(new_batch_size, -1, *t.shape[1:]) for k, t in data.batch.items()}
        batch = TensorDict(tensors, batch_size=[new_batch_size], device=data.batch.device)
    non_tensor = {k: v.reshape(new_batch_size, -1, *v.shape[1:]) for k, v in data.non_tensor_batch.items()}
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(data.meta_info))


def unfold_batch_dim(data: DataProto, batch_dims: int = 2) -> DataProto:
    """Merge the first ``batch_dims`` dims of every tensor and non-tensor into one batch dim.

    ``(a, b, ...)`` becomes ``(a * b, ...)`` for ``batch_dims=2``: the inverse of
    :func:`fold_batch_dim`.

    Raises:
        DataProtoError: ``batch_dims < 1`` or a value has fewer than ``batch_dims`` dims.
        BatchSizeMismatchError: values disagree on the first ``batch_dims`` dims.
    """
    if batch_dims < 1:
        raise DataProtoError(f"unfold_batch_dim: batch_dims={batch_dims}; it must be >= 1")
    values = dict(data.batch.items()) if data.batch is not None else {}
    values.update(data.non_tensor_batch)
    lead = None
    for key, value in values.items():
        if value.ndim < batch_dims:
            raise DataProtoError(f"unfold_batch_dim: '{key}' has {value.ndim} dims, fewer than batch_dims={batch_dims}")
        if lead is None:
            lead, lead_key = tuple(value.shape[:batch_dims]), key
        elif tuple(value.shape[:batch_dims]) != lead:
            raise BatchSizeMismatchError(
                f"unfold_batch_dim: '{key}' starts with {tuple(value.shape[:batch_dims])} but "
                f"'{lead_key}' with {lead}; the first {batch_dims} dims must agree"
            )
    rows = int(np.prod(lead)) if lead is not None else 0
    batch = None
    if data.batch is not None:
        tensors = {k: t.reshape(rows, *t.shape[batch_dims:]) for k, t in data.batch.items()}
        batch = TensorDict(tensors, batch_size=[rows], device=data.batch.device)
    non_tensor = {k: v.reshape(rows, *v.shape[batch_dims:]) for k, v in data.non_tensor_batch.items()}
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(data.meta_info))


# --------------------------------------------------------------------------- per-row repeat
def sample_level_repeat(data: DataProto, repeat_times: Any) -> DataProto:
    """Row ``i`` repeated ``repeat_times[i]`` times, copies together (see the DataProto method)."""
    counts = _repeat_counts(repeat_times, len(data))
    return data[np.repeat(np.arange(len(data)), counts)]


def _repeat_counts(repeat_times: Any, n: int) -> np.ndarray:
    """Validate sample_level_repeat's counts into an int ndarray of shape (n,)."""
    if isinstance(repeat_times, torch.Tensor):
        counts = repeat_times.detach().cpu().numpy()
    elif isinstance(repeat_times, (list, tuple, np.ndarray)):
        counts = np.asarray(repeat_times)
    else:
        raise DataProtoError(
            f"sample_level_repeat: repeat_times is a {type(repeat_times).__name__}; give a list, "
            "tuple, np.ndarray or torch tensor of ints"
        )
    if counts.ndim != 1 or counts.shape[0] != n:
        raise BatchSizeMismatchError(
            f"sample_level_repeat: repeat_times has shape {counts.shape}; give one count per row, ({n},)"
        )
    if n and counts.dtype.kind not in "iu":
        raise DataProtoError(f"sample_level_repeat: repeat_times has dtype {counts.dtype}; give ints")
    if n and counts.min() < 0:
        raise DataProtoError(f"sample_level_repeat: repeat_times has {counts.min()}; counts must be >= 0")
    return counts.astype(np.int64)


# --------------------------------------------------------------------------- column chunks
def unfold_column_chunks(data: DataProto, n_split: int, split_keys: Sequence[str] | None = None) -> DataProto:
    """Cut dim 1 of each ``split_keys`` value into ``n_split`` pieces, one new row per piece.

    A split tensor or ≥2-D array ``(n, c, ...)`` becomes ``(n * n_split, c // n_split, ...)``,
    so row ``i`` turns into rows ``i*n_split .. i*n_split + n_split - 1``. A 1-D object array of
    sequences (e.g. lists, hybridrl's form of lists of lists) has each element cut into
    ``n_split`` consecutive slices; when every slice has the same length ``k`` the result is a
    2-D object array ``(n * n_split, k)``, as verl gives for a list of equal-length lists (its
    ``from_dict`` makes that column ``(n, c)``), so ``out[key] == [["a1"], ["a2"], ...]`` and
    each row is an array; slices of different lengths stay a 1-D array of slices. Every other
    key is repeated ``n_split`` times per row
    (as ``repeat(n_split, interleave=True)``). ``split_keys=None`` splits nothing.

    Raises:
        MissingKeyError: a split key is neither a batch nor a non-tensor key.
        ChunkSizeError: ``n_split < 1``, or a split value's dim 1 (or an element's length) is
            not a multiple of ``n_split``.
        DataProtoError: a split tensor has no dim 1.
    """
    if n_split < 1:
        raise ChunkSizeError(f"unfold_column_chunks: n_split={n_split}; it must be >= 1")
    split = set(split_keys or ())
    batch_keys = set(data.batch.keys()) if data.batch is not None else set()
    unknown = sorted(split - batch_keys - set(data.non_tensor_batch))
    if unknown:
        raise MissingKeyError(
            f"unfold_column_chunks: split key {unknown[0]!r} is not in the batch; available: "
            f"{sorted(batch_keys | set(data.non_tensor_batch))}"
        )
    batch = None
    if data.batch is not None:
        tensors = {
            k: _split_columns(k, t, n_split) if k in split else t.repeat_interleave(n_split, dim=0)
            for k, t in data.batch.items()
        }
        batch = TensorDict(tensors, batch_size=[len(data) * n_split], device=data.batch.device)
    non_tensor = {}
    for key, value in data.non_tensor_batch.items():
        if key not in split:
            non_tensor[key] = np.repeat(value, n_split, axis=0)
        elif value.ndim >= 2:
            non_tensor[key] = _split_columns(key, value, n_split)
        else:
            non_tensor[key] = _split_elements(key, value, n_split)
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(data.meta_info))


def _split_columns(key: str, value, n_split: int):
    """``(n, c, ...)`` tensor / array -> ``(n * n_split, c // n_split, ...)``."""
    if value.ndim < 2:
        raise DataProtoError(
            f"unfold_column_chunks: '{key}' has shape {tuple(value.shape)}, no dim 1 to split; "
            "leave it out of split_keys"
        )
    n, c = value.shape[0], value.shape[1]
    if c % n_split != 0:
        raise ChunkSizeError(f"unfold_column_chunks: '{key}' has {c} columns, not a multiple of n_split={n_split}")
    return value.reshape(n * n_split, c // n_split, *value.shape[2:])


def _split_elements(key: str, value: np.ndarray, n_split: int) -> np.ndarray:
    """1-D object array of sequences -> each element cut into ``n_split`` consecutive slices."""
    out = np.empty(value.shape[0] * n_split, dtype=object)
    for row, element in enumerate(value):
        if not hasattr(element, "__len__") or isinstance(element, (str, bytes, dict)):
            raise DataProtoError(
                f"unfold_column_chunks: non_tensor_batch['{key}'][{row}] is a "
                f"{type(element).__name__}, not a sequence to split; leave '{key}' out of split_keys"
            )
        size, rest = divmod(len(element), n_split)
        if rest:
            raise ChunkSizeError(
                f"unfold_column_chunks: non_tensor_batch['{key}'][{row}] has {len(element)} items, "
                f"not a multiple of n_split={n_split}"
            )
        for j in range(n_split):
            out[row * n_split + j] = element[j * size : (j + 1) * size]
    sizes = {len(piece) for piece in out}
    if len(out) and len(sizes) == 1:  # verl's (n * n_split, k) object array
        table = np.empty((len(out), sizes.pop()), dtype=object)
        for i, piece in enumerate(out):
            table[i, :] = list(piece)  # one level only: elements that are lists stay lists
        return table
    return out


# --------------------------------------------------------------------------- iteration
def _collate_indices(indices: list[int]) -> np.ndarray:
    return np.asarray(indices, dtype=np.int64)


def make_iterator(
    data: DataProto,
    mini_batch_size: int,
    epochs: int,
    seed: int | None = None,
    dataloader_kwargs: dict | None = None,
) -> Iterator[DataProto]:
    """Yield ``epochs * len(data) // mini_batch_size`` mini-batches of ``mini_batch_size`` rows.

    A ``torch.utils.data.DataLoader`` over the row indices picks the rows of each mini-batch
    (in order by default; ``dataloader_kwargs={"shuffle": True}`` reshuffles every epoch, and
    ``seed`` seeds its generator so two iterators with the same seed agree). Each mini-batch
    is ``data[indices]``, carrying ``data.meta_info``.

    Raises:
        ChunkSizeError: ``mini_batch_size < 1`` or it does not divide ``len(data)``.
        DataProtoError: ``epochs < 0`` or ``dataloader_kwargs`` is not a dict.
    """
    from torch.utils.data import DataLoader

    n = len(data)
    if mini_batch_size < 1 or n % mini_batch_size != 0:
        raise ChunkSizeError(
            f"make_iterator: {n} rows do not split into mini-batches of {mini_batch_size}; "
            f"mini_batch_size must divide {n}"
        )
    if epochs < 0:
        raise DataProtoError(f"make_iterator: epochs={epochs}; it must be >= 0")
    if dataloader_kwargs is not None and not isinstance(dataloader_kwargs, dict):
        raise DataProtoError(
            f"make_iterator: dataloader_kwargs is a {type(dataloader_kwargs).__name__}; give a "
            "dict of DataLoader arguments or None"
        )
    generator = None
    if seed is not None:
        generator = torch.Generator()
        generator.manual_seed(seed)
    loader = DataLoader(
        range(n),
        batch_size=mini_batch_size,
        collate_fn=_collate_indices,
        generator=generator,
        **(dataloader_kwargs or {}),
    )

    def batches() -> Iterator[DataProto]:
        for _ in range(epochs):
            for indices in loader:
                yield data[indices]

    return batches()


# --------------------------------------------------------------------------- save / load
def _numpy_safe_globals() -> list:
    """What ``torch.load(weights_only=True)`` must accept to rebuild ndarrays and numpy scalars.

    These only build arrays, scalars and dtypes; the elements of object arrays are still read by
    torch's restricted unpickler, so a file cannot name any other callable.
    """
    core = getattr(np, "_core", None) or np.core
    dtype_classes = [getattr(np.dtypes, name) for name in getattr(np.dtypes, "__all__", ())]
    return [core.multiarray._reconstruct, core.multiarray.scalar, np.ndarray, np.dtype, *dtype_classes]


_PLAIN_TYPES = (type(None), bool, int, float, complex, str, bytes)
_ARRAY_KINDS = "biufcSU"  # bool, ints, floats, complex, bytes, str


def _check_loadable(value: Any, where: str) -> None:
    """Raise DataProtoError unless ``load_from_disk``'s restricted loader can read ``value``."""
    if type(value) in _PLAIN_TYPES or isinstance(value, torch.Tensor):
        return
    if isinstance(value, np.generic) and value.dtype.kind in _ARRAY_KINDS:
        return
    if isinstance(value, np.ndarray) and value.dtype.kind in _ARRAY_KINDS:
        return
    if isinstance(value, np.ndarray) and value.dtype == object:
        for i, element in enumerate(value.ravel()):
            _check_loadable(element, f"{where}[{i}]")
        return
    if type(value) in (list, tuple, set):
        for i, element in enumerate(value):
            _check_loadable(element, f"{where}[{i}]")
        return
    if type(value) is dict:
        for key, element in value.items():
            _check_loadable(key, f"{where} key {key!r}")
            _check_loadable(element, f"{where}[{key!r}]")
        return
    raise DataProtoError(
        f"save_to_disk: {where} is a {type(value).__name__}, which the safe loader cannot read; "
        "convert it to tensors, ndarrays, numbers, str, None, or lists / tuples / dicts of them"
    )


def _compact(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor alone: a view would make torch.save write its whole base storage."""
    t = tensor.detach().cpu()
    if t.is_nested:
        return t
    if not t.is_contiguous() or t.untyped_storage().nbytes() != t.numel() * t.element_size():
        t = t.clone(memory_format=torch.contiguous_format)
    return t


def save_to_disk(data: DataProto, filepath: str | os.PathLike) -> None:
    """Write ``data`` to ``filepath`` with ``torch.save`` as a dict of plain values.

    Unlike verl (which pickles the object), the file holds only tensors, numpy arrays and
    builtin values, so :func:`load_from_disk` reads it with ``torch.load(weights_only=True)``
    and a tampered file cannot run code. Tensors are saved on CPU.

    Raises:
        DataProtoError: a non-tensor or meta_info value (at any depth) is of another type (a
            custom class, a defaultdict, ...); nothing is written then.
    """
    for key, value in data.non_tensor_batch.items():
        _check_loadable(value, f"non_tensor_batch['{key}']")
    _check_loadable(data.meta_info, "meta_info")
    batch = None
    if data.batch is not None:
        batch = {
            "tensors": {k: _compact(t) for k, t in data.batch.items()},
            "batch_size": list(data.batch.batch_size),
        }
    payload = {
        "format": _FILE_FORMAT,
        "version": _FILE_VERSION,
        "batch": batch,
        "non_tensor_batch": dict(data.non_tensor_batch),
        "meta_info": data.meta_info,
    }
    torch.save(payload, filepath)


def weights_only_refusal(err: BaseException) -> str:
    """The reason in torch's multi-paragraph weights_only error, e.g. 'Unsupported global: ...', in
    a few words (one line); the first sentence of any other error."""
    text = str(err)
    found = re.search(r"(?:unsupported|Unsupported global:) GLOBAL (\S+)", text)
    if found:
        return f"it would load {found.group(1)}"
    found = re.search(r"WeightsUnpickler error:\s*(\S[^\n]*)", text)
    if found:
        return " ".join(found.group(1).split())[:160]
    first_line = (text.strip().splitlines() or [type(err).__name__])[0]
    return first_line.split(". ")[0][:160]


def load_from_disk(filepath: str | os.PathLike, cls: type[DataProto]) -> DataProto:
    """Read a file written by :func:`save_to_disk` into a ``cls`` (tensors on CPU).

    Uses ``torch.load(weights_only=True)``, allowing only numpy's array / scalar / dtype
    builders besides torch's defaults: no other code can run while loading.

    Raises:
        DataProtoError: the file is damaged or holds something else (e.g. a pickled verl
            DataProto, or an object the restricted loader refuses).
    """
    try:
        with torch.serialization.safe_globals(_numpy_safe_globals()), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected pickle protocol")  # a plain pickle
            payload = torch.load(filepath, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, EOFError, RuntimeError) as err:  # refused, truncated, not a zip
        raise DataProtoError(
            f"load_from_disk: cannot read {os.fspath(filepath)!r} safely ({weights_only_refusal(err)}); "
            "only files written by DataProto.save_to_disk can be read"
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != _FILE_FORMAT:
        raise DataProtoError(f"load_from_disk: {os.fspath(filepath)!r} was not written by DataProto.save_to_disk")
    if payload.get("version") != _FILE_VERSION:
        raise DataProtoError(
            f"load_from_disk: {os.fspath(filepath)!r} has format version {payload.get('version')}; "
            f"this hybridrl reads version {_FILE_VERSION}"
        )
    batch = None
    if payload["batch"] is not None:
        batch = TensorDict(payload["batch"]["tensors"], batch_size=payload["batch"]["batch_size"])
    return cls(batch=batch, non_tensor_batch=payload["non_tensor_batch"], meta_info=payload["meta_info"])


# --------------------------------------------------------------------------- padding to a divisor
def pad_dataproto_to_divisor(data: DataProto, size_divisor: int) -> tuple[DataProto, int]:
    """Pad ``data`` so its length divides by ``size_divisor``, repeating rows from the start.

    Returns ``(padded, pad_size)``; undo with :func:`unpad_dataproto`. E.g. 5 rows, divisor 4
    → rows ``0..4, 0, 1, 2`` and pad_size 3.
    """
    if size_divisor < 1:
        raise ChunkSizeError(f"pad_dataproto_to_divisor: size_divisor={size_divisor}; must be >= 1")
    n = len(data)
    pad_size = (-n) % size_divisor
    if pad_size == 0:
        return data, 0
    parts, left = [data], pad_size
    while left > 0:  # the pad may exceed n (e.g. 2 rows, divisor 8)
        take = min(left, n)
        parts.append(data[:take])
        left -= take
    return type(data).concat(parts), pad_size


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    """Drop the last ``pad_size`` rows added by :func:`pad_dataproto_to_divisor`."""
    if pad_size == 0:
        return data
    return data[:-pad_size]


# --------------------------------------------------------------------------- joining generation batches
_PROMPT_TENSORS = (
    ("prompts", None),
    ("input_ids", None),
    ("attention_mask", 0),
    ("position_ids", 0),
)  # key, fill (None: pad id)


def concat_padded(parts: list[DataProto], pad_token_id: int) -> DataProto:
    """``DataProto.concat`` after left-padding prompts to the widest part (each generation batch
    is trimmed to its own longest prompt, :func:`hybridrl.trainer.ppo.stages.trim_left_padding`) and filling non-tensor
    columns a part lacks (e.g. reward outputs) with None."""
    width = max(part.batch["prompts"].shape[1] for part in parts)
    keys = list(dict.fromkeys(key for part in parts for key in part.non_tensor_batch))
    for part in parts:
        extra = width - part.batch["prompts"].shape[1]
        for key, fill in _PROMPT_TENSORS if extra else ():
            tensor = part.batch[key]
            pad = torch.full((tensor.shape[0], extra), pad_token_id if fill is None else fill, dtype=tensor.dtype)
            part.batch[key] = torch.cat([pad, tensor], dim=-1)
        for key in keys:
            if key not in part.non_tensor_batch:
                part.non_tensor_batch[key] = np.array([None] * len(part), dtype=object)
    return type(parts[0]).concat(parts)
