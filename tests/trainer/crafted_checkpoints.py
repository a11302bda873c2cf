"""Damage and crafted files for checkpoint tests: each exploit, if ever unpickled, creates the
file ``pwned`` in the current folder (the tests chdir into a tmp folder and check it is absent)."""

import io
import os
import pickle

import torch


class Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def write_zeros(shard, size=1 << 20):
    """Writes ``size`` zero bytes into the middle of ``shard``, over bytes that are not all zeros
    (a fresh optimizer's moments are zeros), and returns the shard's name."""
    data = shard.read_bytes()
    offset = len(data) // 2
    while data[offset : offset + size] == bytes(size):
        offset -= size // 4
    assert offset >= 0
    with open(shard, "r+b") as f:
        f.seek(offset)
        f.write(bytes(size))
    return shard.name


def craft_metadata_file(dcp_dir):
    """The whole .metadata is the exploit."""
    with open(dcp_dir / ".metadata", "wb") as f:
        pickle.dump(Exploit(), f)


def craft_metadata_inside(dcp_dir):
    """A real DCP Metadata whose planner_data hides the exploit: the outer classes are allowed."""
    with open(dcp_dir / ".metadata", "rb") as f:
        metadata = pickle.load(f)  # the test's own, intact file
    metadata.planner_data = {"model.x": Exploit()}
    with open(dcp_dir / ".metadata", "wb") as f:
        pickle.dump(metadata, f)


def craft_bytes_item(dcp_dir, fqn):
    """A .metadata of DCP's own classes that marks ``fqn`` as a "bytes" item (which DCP's default
    planner reads with torch.load(weights_only=False)), stored as a torch.save'd exploit appended
    to a shard."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

    with open(dcp_dir / ".metadata", "rb") as f:
        metadata = pickle.load(f)
    shard = next(dcp_dir.glob("*.distcp"))
    payload = io.BytesIO()
    torch.save({"w": Exploit()}, payload)
    offset = shard.stat().st_size
    with open(shard, "ab") as f:
        f.write(payload.getvalue())
    metadata.state_dict_metadata[fqn] = BytesStorageMetadata()
    metadata.storage_data = {k: v for k, v in metadata.storage_data.items() if k.fqn != fqn}
    metadata.storage_data[MetadataIndex(fqn)] = _StorageInfo(shard.name, offset, len(payload.getvalue()))
    with open(dcp_dir / ".metadata", "wb") as f:
        pickle.dump(metadata, f)
