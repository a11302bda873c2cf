"""DataProto: the batch passed between the driver and the workers (verl's protocol).

A DataProto holds ``n`` rows in three parts:

* ``batch``: a ``tensordict.TensorDict`` with ``batch_size=[n]`` (tensors of shape ``(n, ...)``),
* ``non_tensor_batch``: ``dict[str, np.ndarray]`` of object arrays with ``shape[0] == n``
  (strings, dicts, ragged lists: anything a tensor cannot hold),
* ``meta_info``: a plain dict that belongs to the whole batch (temperature, metrics, ...).

Row operations (index, slice, chunk, split, repeat, concat, reorder) act on ``batch`` and
``non_tensor_batch`` together and carry ``meta_info`` along. Everything is picklable, so the
Ray backend can ship it as is. Reshaping (``fold_batch_dim``, ``unfold_column_chunks``),
mini-batch iteration, save / load and padding to a divisor live in :mod:`hybridrl.protocol.ops`
(the DataProto methods call into it; ``fold_batch_dim``, ``unfold_batch_dim``,
``pad_dataproto_to_divisor`` and ``unpad_dataproto`` are importable from here too); value comparison and the
``meta_info`` merge of ``concat`` in :mod:`hybridrl.protocol.meta`; the errors in
:mod:`hybridrl.protocol.errors`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch
from tensordict import TensorDict

from hybridrl.protocol import ops
from hybridrl.protocol.errors import (
    BatchSizeMismatchError,
    ChunkSizeError,
    DataProtoError,
    MissingKeyError,
    UnionConflictError,
)
from hybridrl.protocol.meta import arrays_equal, merge_meta_info, values_equal


def _as_object_array(key: str, value: Any) -> np.ndarray:
    """Turn a list / ndarray into an object ndarray whose first dim is the batch dim.

    Lists are filled element by element so a list of equal-length lists stays 1-D
    (``np.array(..., dtype=object)`` would make it 2-D).
    """
    if isinstance(value, np.ndarray):
        return value if value.dtype == object else value.astype(object)
    if isinstance(value, (list, tuple)):
        out = np.empty(len(value), dtype=object)
        for i, v in enumerate(value):
            out[i] = v
        return out
    raise DataProtoError(
        f"non_tensor_batch['{key}'] is a {type(value).__name__}; give a list or np.ndarray with one entry per row"
    )


def _to_index(idxs: Any) -> tuple[torch.Tensor, np.ndarray]:
    """Normalise a list / ndarray / tensor index into (torch index, numpy index)."""
    if isinstance(idxs, torch.Tensor):
        t = idxs.detach().cpu()
    else:
        t = torch.as_tensor(np.asarray(idxs))
    if t.dtype != torch.bool:
        t = t.long()
    return t, t.numpy()


@dataclass
class DataProtoItem:
    """One row of a DataProto, as returned by ``DataProto[int]``.

    ``batch`` is a TensorDict with ``batch_size=[]`` (each tensor without its batch dim),
    ``non_tensor_batch`` maps keys to the row's element, ``meta_info`` is the parent's.
    """

    batch: TensorDict | None = None
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)


@dataclass
class DataProto:
    """A batch of ``n`` rows: tensors, non-tensor object arrays and batch-wide meta_info.

    Construct with :meth:`from_dict` or :meth:`from_single_dict`. The constructor runs
    :meth:`check_consistency` and raises :class:`BatchSizeMismatchError` on a bad batch.
    """

    batch: TensorDict | None = None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)

    def __post_init__(self):
        self.non_tensor_batch = {k: _as_object_array(k, v) for k, v in (self.non_tensor_batch or {}).items()}
        self.meta_info = {} if self.meta_info is None else self.meta_info
        self.check_consistency()

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Any] | None = None,
        meta_info: dict | None = None,
        num_batch_dims: int = 1,
        auto_padding: bool = False,
    ) -> DataProto:
        """Build from ``tensors`` (each ``(n, ...)``), ``non_tensors`` (lists / arrays of len n).

        The first ``num_batch_dims`` dims of every tensor form the batch size and must agree.
        Raises :class:`BatchSizeMismatchError` naming the key and both sizes when they do not.
        ``auto_padding`` is verl's switch for uneven chunks; only ``False`` is supported
        (pad explicitly with :func:`pad_dataproto_to_divisor`), ``True`` raises DataProtoError.
        """
        tensors = dict(tensors or {})
        non_tensors = dict(non_tensors or {})
        if num_batch_dims < 1:
            raise DataProtoError(f"num_batch_dims={num_batch_dims}; it must be >= 1")
        if auto_padding:
            raise DataProtoError(
                "auto_padding=True is not supported; pad with pad_dataproto_to_divisor(data, n) "
                "before chunk(n) and drop the pad with unpad_dataproto after"
            )
        batch = None
        if tensors:
            first_key = next(iter(tensors))
            batch_size = tuple(tensors[first_key].shape[:num_batch_dims])
            for key, t in tensors.items():
                if not isinstance(t, torch.Tensor):
                    raise DataProtoError(
                        f"tensors['{key}'] is a {type(t).__name__}, not a torch.Tensor; put it in non_tensors instead"
                    )
                if tuple(t.shape[:num_batch_dims]) != batch_size:
                    raise BatchSizeMismatchError(
                        f"tensors['{key}'] has batch size {tuple(t.shape[:num_batch_dims])} "
                        f"but tensors['{first_key}'] has {batch_size}; all must share it"
                    )
            batch = TensorDict(tensors, batch_size=list(batch_size))
        return cls(batch=batch, non_tensor_batch=non_tensors, meta_info=dict(meta_info or {}))

    @classmethod
    def from_single_dict(
        cls, data: dict[str, Any], meta_info: dict | None = None, auto_padding: bool = False
    ) -> DataProto:
        """Split a mixed dict: ``torch.Tensor`` values go to ``batch``, ndarrays / lists to
        ``non_tensor_batch`` (as object arrays). Any other value type raises DataProtoError.
        Returns an instance of ``cls``; ``auto_padding`` as in :meth:`from_dict`."""
        tensors, non_tensors = {}, {}
        for key, val in data.items():
            if isinstance(val, torch.Tensor):
                tensors[key] = val
            elif isinstance(val, (np.ndarray, list, tuple)):
                non_tensors[key] = val
            else:
                raise DataProtoError(
                    f"data['{key}'] is a {type(val).__name__}; from_single_dict takes "
                    "torch.Tensor, np.ndarray or list values (put scalars in meta_info)"
                )
        return cls.from_dict(tensors, non_tensors, meta_info, auto_padding=auto_padding)

    def check_consistency(self) -> None:
        """Check every tensor and non-tensor has the same number of rows.

        Raises :class:`BatchSizeMismatchError` naming the offending key and both sizes.
        """
        n, ref = None, None
        if self.batch is not None:
            if self.batch.batch_dims < 1:
                raise BatchSizeMismatchError(
                    "batch has batch_size=[]; build it with batch_size=[n] (one row per sample)"
                )
            n, ref = self.batch.batch_size[0], "batch"
        for key, val in self.non_tensor_batch.items():
            if val.ndim == 0:
                raise BatchSizeMismatchError(f"non_tensor_batch['{key}'] is 0-d; give one entry per row")
            if n is None:
                n, ref = val.shape[0], f"non_tensor_batch['{key}']"
            elif val.shape[0] != n:
                raise BatchSizeMismatchError(
                    f"non_tensor_batch['{key}'] has {val.shape[0]} rows but {ref} has {n}; "
                    "all must have the same number of rows"
                )

    # ----------------------------------------------------------------- basic access
    def __len__(self) -> int:
        if self.batch is not None:
            return int(self.batch.batch_size[0])
        for val in self.non_tensor_batch.values():
            return int(val.shape[0])
        return 0

    def __getitem__(self, item):
        """``int`` → :class:`DataProtoItem` (one row, batch dim dropped);
        ``slice`` / list / ndarray / long or bool tensor → DataProto of the selected rows."""
        if isinstance(item, slice):
            return self.slice(item.start, item.stop, item.step)
        if isinstance(item, (int, np.integer)) and not isinstance(item, (bool, np.bool_)):
            i = int(item)
            return DataProtoItem(
                batch=self.batch[i] if self.batch is not None else None,
                non_tensor_batch={k: v[i] for k, v in self.non_tensor_batch.items()},
                meta_info=self.meta_info,
            )
        if isinstance(item, (list, tuple, np.ndarray, torch.Tensor)):
            t_idx, np_idx = _to_index(item)
            return type(self)(
                batch=self.batch[t_idx] if self.batch is not None else None,
                non_tensor_batch={k: v[np_idx] for k, v in self.non_tensor_batch.items()},
                meta_info=dict(self.meta_info),
            )
        raise DataProtoError(
            f"cannot index a DataProto with {type(item).__name__}; use an int, a slice, "
            "a list, an np.ndarray or a torch tensor of indices / booleans"
        )

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None):
        """Rows ``start:end:step`` as a new DataProto (tensors are views, meta_info copied)."""
        s = slice(start, end, step)
        return type(self)(
            batch=self.batch[s] if self.batch is not None else None,
            non_tensor_batch={k: v[s] for k, v in self.non_tensor_batch.items()},
            meta_info=dict(self.meta_info),
        )

    def __repr__(self) -> str:
        parts = []
        if self.batch is not None:
            for k, v in self.batch.items():
                parts.append(f"{k}: {tuple(v.shape)} {str(v.dtype).replace('torch.', '')}")
        nt = ", ".join(self.non_tensor_batch)
        return (
            f"DataProto(len={len(self)}, batch={{{', '.join(parts)}}}, "
            f"non_tensor=[{nt}], meta_info=[{', '.join(map(str, self.meta_info))}])"
        )

    # ----------------------------------------------------------------- key operations
    def _check_keys(self, batch_keys, non_tensor_batch_keys, meta_info_keys) -> None:
        have = set(self.batch.keys()) if self.batch is not None else set()
        for where, keys, avail in (
            ("batch", batch_keys, have),
            ("non_tensor_batch", non_tensor_batch_keys, set(self.non_tensor_batch)),
            ("meta_info", meta_info_keys, set(self.meta_info)),
        ):
            missing = [k for k in (keys or []) if k not in avail]
            if missing:
                raise MissingKeyError(f"{where} has no key {missing[0]!r}; available: {sorted(avail)}")

    def select(
        self,
        batch_keys: Sequence[str] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
        deepcopy: bool = False,
    ) -> DataProto:
        """A new DataProto with only the named keys (``None`` keeps all of that part).

        Without ``deepcopy`` the tensors and arrays are shared with ``self``; with it, every
        part is copied. Raises :class:`MissingKeyError` for an unknown key.
        """
        self._check_keys(batch_keys, non_tensor_batch_keys, meta_info_keys)
        batch = self.batch
        if batch is not None and batch_keys is not None:
            batch = batch.select(*batch_keys)
        nkeys = self.non_tensor_batch if non_tensor_batch_keys is None else non_tensor_batch_keys
        non_tensor = {k: self.non_tensor_batch[k] for k in nkeys}
        mkeys = self.meta_info if meta_info_keys is None else meta_info_keys
        meta = {k: self.meta_info[k] for k in mkeys}
        if deepcopy:
            batch = batch.clone() if batch is not None else None
            non_tensor, meta = copy.deepcopy(non_tensor), copy.deepcopy(meta)
        elif batch is self.batch and batch is not None:
            batch = batch.select(*batch.keys())  # new container, same tensors
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def pop(
        self,
        batch_keys: Sequence[str] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
    ) -> DataProto:
        """Remove the named keys from ``self`` and return them as a new DataProto.

        ``None`` pops nothing from that part. Raises :class:`MissingKeyError` (before
        removing anything) for an unknown key.
        """
        self._check_keys(batch_keys, non_tensor_batch_keys, meta_info_keys)
        tensors = {k: self.batch.pop(k) for k in (batch_keys or [])}
        non_tensors = {k: self.non_tensor_batch.pop(k) for k in (non_tensor_batch_keys or [])}
        meta = {k: self.meta_info.pop(k) for k in (meta_info_keys or [])}
        batch = None
        if tensors:
            batch = TensorDict(tensors, batch_size=self.batch.batch_size)
        return DataProto(batch=batch, non_tensor_batch=non_tensors, meta_info=meta)

    def rename(self, old_keys: str | Sequence[str], new_keys: str | Sequence[str]) -> DataProto:
        """Rename batch keys in place (a str or equal-length lists); returns ``self``."""
        old = [old_keys] if isinstance(old_keys, str) else list(old_keys)
        new = [new_keys] if isinstance(new_keys, str) else list(new_keys)
        if len(old) != len(new):
            raise DataProtoError(f"rename got {len(old)} old keys and {len(new)} new keys; give one new per old")
        self._check_keys(old, None, None)
        for o, n in zip(old, new):
            self.batch.rename_key_(o, n)
        return self

    def union(self, other: DataProto) -> DataProto:
        """Merge ``other`` into ``self`` in place and return ``self``.

        Both must have the same length. A key present in both must hold equal values
        (``torch.equal`` / element-wise equal / ``==``), else :class:`UnionConflictError`.
        """
        if len(self) != len(other):
            raise BatchSizeMismatchError(
                f"union of DataProtos with {len(self)} and {len(other)} rows; lengths must match"
            )
        if other.batch is not None:
            if self.batch is None:
                self.batch = other.batch.select(*other.batch.keys())
            else:
                for k, v in other.batch.items():
                    if k in self.batch.keys() and not torch.equal(self.batch[k], v):
                        raise UnionConflictError(f"union: batch['{k}'] differs between the two DataProtos")
                    self.batch[k] = v
        for k, v in other.non_tensor_batch.items():
            if k in self.non_tensor_batch and not arrays_equal(self.non_tensor_batch[k], v):
                raise UnionConflictError(f"union: non_tensor_batch['{k}'] differs between the two DataProtos")
            self.non_tensor_batch[k] = v
        for k, v in other.meta_info.items():
            if k in self.meta_info and not values_equal(self.meta_info[k], v):
                raise UnionConflictError(f"union: meta_info['{k}'] differs between the two")
            self.meta_info[k] = v
        return self

    # ----------------------------------------------------------------- row operations
    def chunk(self, chunks: int) -> list[DataProto]:
        """Split into ``chunks`` equal parts (``len(self) % chunks`` must be 0).

        Raises :class:`ChunkSizeError`; pad first with :func:`pad_dataproto_to_divisor`.
        """
        n = len(self)
        if chunks < 1 or n % chunks != 0:
            raise ChunkSizeError(
                f"chunk: {n} rows cannot be split into {chunks} equal chunks; pad with "
                f"pad_dataproto_to_divisor(data, {chunks}) first and unpad_dataproto after"
            )
        return self.split(n // chunks)

    def split(self, split_size: int) -> list[DataProto]:
        """Consecutive parts of ``split_size`` rows; the last one may be smaller."""
        if split_size < 1:
            raise ChunkSizeError(f"split: split_size={split_size}; it must be >= 1")
        return [self.slice(i, i + split_size) for i in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: Sequence[DataProto]) -> DataProto:
        """Concatenate DataProtos row-wise (all must have the same keys); returns ``type(data[0])``.

        ``meta_info`` is merged as in verl:

        * non-metric keys of every part are kept; a key in several parts must hold equal values
          there (tensors / arrays compared element-wise, NaN equal to NaN), else
          :class:`ConcatConflictError`;
        * ``meta_info['metrics']`` of every part that has one (a dict, or a list of dicts, e.g.
          one per worker) becomes one dict ``{name: [values]}``: values are appended in part
          order, list values extended, so ``reduce_metrics`` averages over every worker. The
          key is absent when no part has metrics.
        """
        if not data:
            raise DataProtoError("concat got an empty list; give at least one DataProto")
        first = data[0]
        keys0 = sorted(first.batch.keys()) if first.batch is not None else None
        nkeys0 = sorted(first.non_tensor_batch)
        for i, d in enumerate(data[1:], start=1):
            keys = sorted(d.batch.keys()) if d.batch is not None else None
            if keys != keys0 or sorted(d.non_tensor_batch) != nkeys0:
                raise DataProtoError(
                    f"concat: item {i} has keys {keys}/{sorted(d.non_tensor_batch)} but item 0 "
                    f"has {keys0}/{nkeys0}; all items need the same keys"
                )
        batch = torch.cat([d.batch for d in data], dim=0) if keys0 is not None else None
        non_tensor = {k: np.concatenate([d.non_tensor_batch[k] for d in data], axis=0) for k in nkeys0}
        meta = merge_meta_info([d.meta_info for d in data])
        return type(first)(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> DataProto:
        """Repeat every row ``repeat_times`` times.

        ``interleave=True``: ``[a, b] → [a, a, b, b]`` (each prompt's samples together, as
        GRPO needs); ``False``: ``[a, b] → [a, b, a, b]``.
        """
        if repeat_times < 1:
            raise DataProtoError(f"repeat: repeat_times={repeat_times}; it must be >= 1")
        n = len(self)
        if interleave:
            idx = np.repeat(np.arange(n), repeat_times)
        else:
            idx = np.tile(np.arange(n), repeat_times)
        return self[idx]

    def sample_level_repeat(self, repeat_times: Sequence[int] | np.ndarray | torch.Tensor) -> DataProto:
        """Repeat row ``i`` ``repeat_times[i]`` times, each row's copies kept together.

        ``repeat_times``: list / tuple / 1-D ndarray / 1-D tensor of ``len(self)`` ints >= 0;
        e.g. ``[3, 1, 2]`` on rows ``[a, b, c]`` gives ``[a, a, a, b, c, c]`` (0 drops a row).
        Raises :class:`BatchSizeMismatchError` for a wrong length, DataProtoError otherwise.
        """
        return ops.sample_level_repeat(self, repeat_times)

    def unfold_column_chunks(self, n_split: int, split_keys: Sequence[str] | None = None) -> DataProto:
        """Cut each row's dim 1 of ``split_keys`` into ``n_split`` rows; repeat the other keys.

        ``(n, c, ...)`` becomes ``(n * n_split, c // n_split, ...)``; see
        :func:`hybridrl.protocol.ops.unfold_column_chunks` for non-tensors and errors.
        """
        return ops.unfold_column_chunks(self, n_split, split_keys)

    def make_iterator(
        self,
        mini_batch_size: int,
        epochs: int,
        seed: int | None = None,
        dataloader_kwargs: dict | None = None,
    ):
        """Iterator over ``epochs`` passes of mini-batches of ``mini_batch_size`` rows.

        A ``torch.utils.data.DataLoader`` picks the rows (``dataloader_kwargs`` go to it, e.g.
        ``{"shuffle": True}``; ``seed`` seeds its generator). Each item is a DataProto with
        ``self``'s meta_info; see :func:`hybridrl.protocol.ops.make_iterator`.
        """
        return ops.make_iterator(self, mini_batch_size, epochs, seed, dataloader_kwargs)

    def save_to_disk(self, filepath) -> None:
        """Write to ``filepath`` with ``torch.save``; read back with :meth:`load_from_disk`.

        No pickled code: values must be tensors, ndarrays, numbers, strings, None or
        lists / tuples / dicts of them (see :func:`hybridrl.protocol.ops.save_to_disk`).
        """
        ops.save_to_disk(self, filepath)

    @classmethod
    def load_from_disk(cls, filepath) -> DataProto:
        """Read a file of :meth:`save_to_disk` with ``torch.load(weights_only=True)``: a file
        that would run code on load is refused (see :func:`hybridrl.protocol.ops.load_from_disk`)."""
        return ops.load_from_disk(filepath, cls)

    def reorder(self, indices: torch.Tensor | np.ndarray | Sequence[int]) -> None:
        """Permute rows in place: row ``i`` becomes old row ``indices[i]`` (as in verl)."""
        t_idx, np_idx = _to_index(indices)
        if self.batch is not None:
            self.batch = self.batch[t_idx]
        self.non_tensor_batch = {k: v[np_idx] for k, v in self.non_tensor_batch.items()}

    def to(self, device: str | torch.device) -> DataProto:
        """Move the tensors to ``device`` in place; returns ``self``."""
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self
