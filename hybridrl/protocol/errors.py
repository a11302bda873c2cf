"""The errors of :mod:`hybridrl.protocol` (importable from there)."""

from __future__ import annotations

__all__ = [
    "DataProtoError",
    "BatchSizeMismatchError",
    "MissingKeyError",
    "UnionConflictError",
    "ChunkSizeError",
    "ConcatConflictError",
]


class DataProtoError(ValueError, AssertionError):
    """Base class of every DataProto error; the message is one self-contained line.

    Also an ``AssertionError``: verl checks the same inputs with ``assert``, so code written
    against verl that catches ``AssertionError`` keeps working.
    """


class BatchSizeMismatchError(DataProtoError):
    """Tensors / non-tensors / DataProtos that must share a batch size do not."""


class MissingKeyError(DataProtoError):
    """A key asked for is not in the DataProto."""


class UnionConflictError(DataProtoError):
    """``union`` found one key holding different values in the two DataProtos."""


class ChunkSizeError(DataProtoError):
    """``chunk`` / ``split`` / ``make_iterator`` / a fold got a size that does not fit the batch."""


class ConcatConflictError(DataProtoError):
    """``concat`` found one non-metric ``meta_info`` key holding different values in two parts."""
