"""DataProto, the batch that travels between the driver and the workers (verl's ``verl.protocol``).

- :mod:`.data_proto`: the :class:`DataProto` class (rows of tensors, object arrays and ``meta_info``);
- :mod:`.ops`: reshaping, mini-batch iteration, save / load, padding to a divisor;
- :mod:`.meta`: value comparison and the ``meta_info`` merge of ``concat``;
- :mod:`.errors`: the errors, one :class:`DataProtoError` base.

Everything verl's protocol module offers is importable from here.
"""

from hybridrl.protocol.data_proto import DataProto, DataProtoItem
from hybridrl.protocol.errors import (
    BatchSizeMismatchError,
    ChunkSizeError,
    ConcatConflictError,
    DataProtoError,
    MissingKeyError,
    UnionConflictError,
)
from hybridrl.protocol.ops import (
    concat_padded,
    fold_batch_dim,
    pad_dataproto_to_divisor,
    unfold_batch_dim,
    unpad_dataproto,
)

__all__ = [
    "BatchSizeMismatchError",
    "ChunkSizeError",
    "ConcatConflictError",
    "DataProto",
    "DataProtoItem",
    "DataProtoError",
    "MissingKeyError",
    "UnionConflictError",
    "concat_padded",
    "fold_batch_dim",
    "pad_dataproto_to_divisor",
    "unfold_batch_dim",
    "unpad_dataproto",
]
