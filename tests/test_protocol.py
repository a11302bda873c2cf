"""Tests for hybridrl.protocol.DataProto (verl semantics)."""

import ast
import pathlib
import pickle

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from hybridrl import protocol
from hybridrl.protocol import (
    BatchSizeMismatchError,
    ChunkSizeError,
    ConcatConflictError,
    DataProto,
    DataProtoError,
    DataProtoItem,
    MissingKeyError,
    UnionConflictError,
    pad_dataproto_to_divisor,
    unpad_dataproto,
)


def make(n=4, meta=None):
    """Row i: obs = [i, 10 + i], act = 100 + i, uid = "u<i>", info = {"i": i}."""
    return DataProto.from_dict(
        tensors={
            "obs": torch.stack([torch.arange(n), 10 + torch.arange(n)], dim=1),
            "act": 100 + torch.arange(n),
        },
        non_tensors={"uid": [f"u{i}" for i in range(n)], "info": [{"i": i} for i in range(n)]},
        meta_info=meta if meta is not None else {"temperature": 1.0},
    )


def rows(d):
    """The `act` column as a python list: identifies which rows a DataProto holds."""
    return d.batch["act"].tolist()


def assert_same(a, b):
    assert len(a) == len(b)
    assert sorted(a.batch.keys()) == sorted(b.batch.keys())
    for k in a.batch.keys():
        assert torch.equal(a.batch[k], b.batch[k]), k
    assert a.non_tensor_batch.keys() == b.non_tensor_batch.keys()
    for k in a.non_tensor_batch:
        assert list(a.non_tensor_batch[k]) == list(b.non_tensor_batch[k]), k


# ----------------------------------------------------------------- construction
def test_from_dict_shapes_and_object_arrays():
    d = make(3)
    assert len(d) == 3
    assert d.batch.batch_size == torch.Size([3])
    assert d.non_tensor_batch["uid"].dtype == object
    assert d.non_tensor_batch["uid"].shape == (3,)
    assert d.meta_info == {"temperature": 1.0}


def test_equal_length_lists_stay_one_dimensional():
    d = DataProto.from_dict(non_tensors={"msgs": [[1, 2], [3, 4], [5, 6]]})
    assert d.non_tensor_batch["msgs"].shape == (3,)
    assert d.non_tensor_batch["msgs"][1] == [3, 4]
    assert d.batch is None and len(d) == 3


def test_from_dict_num_batch_dims():
    d = DataProto.from_dict({"x": torch.zeros(2, 3, 5)}, num_batch_dims=2)
    assert d.batch.batch_size == torch.Size([2, 3])


def test_from_single_dict_splits_by_type():
    d = DataProto.from_single_dict(
        {"ids": torch.ones(2, 3), "src": np.array(["a", "b"]), "gt": ["1", "2"]},
        meta_info={"k": 1},
    )
    assert list(d.batch.keys()) == ["ids"]
    assert set(d.non_tensor_batch) == {"src", "gt"}
    assert d.non_tensor_batch["src"].dtype == object
    assert d.meta_info == {"k": 1}


def test_from_single_dict_rejects_scalar():
    with pytest.raises(DataProtoError, match=r"data\['lr'\].*meta_info"):
        DataProto.from_single_dict({"ids": torch.ones(2), "lr": 0.1})


def test_tensor_batch_size_mismatch_names_key_and_sizes():
    msg = r"tensors\['b'\] has batch size \(3,\).*\(2,\)"
    with pytest.raises(BatchSizeMismatchError, match=msg):
        DataProto.from_dict({"a": torch.zeros(2, 4), "b": torch.zeros(3, 4)})


def test_non_tensor_batch_size_mismatch_names_key_and_sizes():
    msg = r"non_tensor_batch\['uid'\] has 3 rows.*has 2"
    with pytest.raises(BatchSizeMismatchError, match=msg):
        DataProto.from_dict({"a": torch.zeros(2)}, {"uid": ["x", "y", "z"]})
    with pytest.raises(BatchSizeMismatchError, match=r"\['b'\] has 1 rows"):
        DataProto.from_dict(non_tensors={"a": [1, 2], "b": [1]})


def test_errors_are_value_errors():
    for cls in (BatchSizeMismatchError, MissingKeyError, UnionConflictError, ChunkSizeError):
        assert issubclass(cls, ValueError)


def test_check_consistency_after_mutation():
    d = make(3)
    d.non_tensor_batch["bad"] = np.array([1, 2], dtype=object)
    with pytest.raises(BatchSizeMismatchError, match="bad"):
        d.check_consistency()


# ----------------------------------------------------------------- indexing
def test_getitem_int_returns_item():
    item = make(4)[2]
    assert isinstance(item, DataProtoItem)
    assert item.batch["obs"].tolist() == [2, 12]
    assert item.non_tensor_batch == {"uid": "u2", "info": {"i": 2}}
    assert make(4)[-1].non_tensor_batch["uid"] == "u3"
    assert make(4)[np.int64(1)].batch["act"].item() == 101


@pytest.mark.parametrize(
    "index, expected",
    [
        (slice(1, 3), [101, 102]),
        (slice(None, None, 2), [100, 102]),
        ([3, 0], [103, 100]),
        (np.array([2, 2]), [102, 102]),
        (torch.tensor([1, 3]), [101, 103]),
        (torch.tensor([True, False, False, True]), [100, 103]),
        (np.array([False, True, True, False]), [101, 102]),
    ],
)
def test_getitem_multi_returns_dataproto(index, expected):
    d = make(4)
    out = d[index]
    assert isinstance(out, DataProto)
    assert rows(out) == expected
    assert list(out.non_tensor_batch["uid"]) == [f"u{a - 100}" for a in expected]
    assert out.meta_info == d.meta_info


def test_getitem_bad_type():
    with pytest.raises(DataProtoError, match="cannot index"):
        make(2)["obs"]


def test_slice_method():
    d = make(6).slice(1, 6, 2)
    assert rows(d) == [101, 103, 105]
    assert list(d.non_tensor_batch["uid"]) == ["u1", "u3", "u5"]


# ----------------------------------------------------------------- select / pop / rename
def test_select_shares_without_deepcopy_and_copies_with_it():
    d = make(3, meta={"a": [1], "b": 2})
    s = d.select(batch_keys=["act"], non_tensor_batch_keys=["uid"], meta_info_keys=["a"])
    assert list(s.batch.keys()) == ["act"]
    assert list(s.non_tensor_batch) == ["uid"] and s.meta_info == {"a": [1]}
    s.batch["act"][0] = -1
    assert d.batch["act"][0] == -1  # shared storage
    c = d.select(deepcopy=True)
    c.batch["act"][1] = -5
    c.meta_info["a"].append(9)
    c.non_tensor_batch["info"][0]["i"] = 42
    assert d.batch["act"][1] == 101 and d.meta_info["a"] == [1]
    assert d.non_tensor_batch["info"][0] == {"i": 0}


def test_select_none_keeps_all_and_new_container():
    d = make(2)
    s = d.select()
    s.batch["new"] = torch.zeros(2)
    assert "new" not in d.batch.keys()
    assert set(s.non_tensor_batch) == {"uid", "info"}


def test_select_missing_key():
    with pytest.raises(MissingKeyError, match=r"batch has no key 'nope'"):
        make(2).select(batch_keys=["nope"])


def test_pop_removes_and_returns():
    d = make(3, meta={"m": 1, "keep": 2})
    p = d.pop(batch_keys=["obs"], non_tensor_batch_keys=["uid"], meta_info_keys=["m"])
    assert list(d.batch.keys()) == ["act"] and list(d.non_tensor_batch) == ["info"]
    assert d.meta_info == {"keep": 2}
    assert p.batch["obs"][:, 0].tolist() == [0, 1, 2]
    assert list(p.non_tensor_batch["uid"]) == ["u0", "u1", "u2"] and p.meta_info == {"m": 1}
    assert len(d.pop()) == 0  # None pops nothing


def test_pop_missing_key_changes_nothing():
    d = make(2)
    with pytest.raises(MissingKeyError, match="non_tensor_batch has no key 'x'"):
        d.pop(batch_keys=["obs"], non_tensor_batch_keys=["x"])
    assert "obs" in d.batch.keys()


def test_rename():
    d = make(2).rename("obs", "observations")
    assert set(d.batch.keys()) == {"observations", "act"}
    d.rename(["observations", "act"], ["o", "a"])
    assert set(d.batch.keys()) == {"o", "a"} and d.batch["a"].tolist() == [100, 101]
    with pytest.raises(DataProtoError, match="2 old keys and 1 new"):
        d.rename(["o", "a"], ["x"])
    with pytest.raises(MissingKeyError):
        d.rename("zzz", "y")


# ----------------------------------------------------------------- union
def test_union_merges_in_place():
    d = make(2)
    other = DataProto.from_dict(
        {"act": 100 + torch.arange(2), "rew": torch.tensor([0.5, 1.0])},
        {"uid": ["u0", "u1"], "gt": ["7", "8"]},
        {"temperature": 1.0, "step": 3},
    )
    out = d.union(other)
    assert out is d
    assert d.batch["rew"].tolist() == [0.5, 1.0]
    assert list(d.non_tensor_batch["gt"]) == ["7", "8"]
    assert d.meta_info == {"temperature": 1.0, "step": 3}


def test_union_into_batchless():
    d = DataProto.from_dict(non_tensors={"uid": ["a", "b"]})
    d.union(DataProto.from_dict({"x": torch.ones(2)}))
    assert d.batch["x"].tolist() == [1.0, 1.0]


@pytest.mark.parametrize(
    "other, where",
    [
        (DataProto.from_dict({"act": torch.tensor([100, 999])}), r"batch\['act'\]"),
        (DataProto.from_dict(non_tensors={"uid": ["u0", "zz"]}), r"non_tensor_batch\['uid'\]"),
        (DataProto.from_dict(non_tensors={"x": [1, 2]}, meta_info={"temperature": 0.7}), r"meta_info\['temperature'\]"),
    ],
)
def test_union_conflicts(other, where):
    with pytest.raises(UnionConflictError, match=where):
        make(2).union(other)


def test_union_length_mismatch():
    with pytest.raises(BatchSizeMismatchError, match="2 and 3 rows"):
        make(2).union(make(3))


# ----------------------------------------------------------------- chunk / split / concat
def test_chunk_concat_round_trip_and_meta():
    d = make(6, meta={"temperature": 0.5})
    parts = d.chunk(3)
    assert [rows(p) for p in parts] == [[100, 101], [102, 103], [104, 105]]
    assert all(p.meta_info == {"temperature": 0.5} for p in parts)
    back = DataProto.concat(parts)
    assert_same(back, d)
    assert back.meta_info == {"temperature": 0.5}
    parts[0].meta_info["temperature"] = 9.0  # each chunk owns its meta_info dict
    assert d.meta_info["temperature"] == 0.5
    with pytest.raises(ConcatConflictError, match="'temperature'.*item 0 has 9.0, item 1 has 0.5"):
        DataProto.concat(parts)  # parts disagree on a non-metric key (verl raises too)


def test_chunk_not_dividing_suggests_padding():
    with pytest.raises(ChunkSizeError, match="5 rows.*3 equal chunks.*pad_dataproto_to_divisor"):
        make(5).chunk(3)


def test_split_last_smaller():
    parts = make(5).split(2)
    assert [rows(p) for p in parts] == [[100, 101], [102, 103], [104]]
    assert list(parts[2].non_tensor_batch["uid"]) == ["u4"]
    with pytest.raises(ChunkSizeError):
        make(2).split(0)


def test_concat_merges_worker_metrics():
    # lists of per-worker dicts become one {name: [values]} (verl's format since 2025).
    a = make(1, meta={"metrics": [{"loss": 1.0}], "t": 1})
    b = make(1, meta={"metrics": [{"loss": 2.0}], "t": 1, "u": 2})
    out = DataProto.concat([a, b])
    assert out.meta_info == {"metrics": {"loss": [1.0, 2.0]}, "t": 1, "u": 2}
    # {name: [values]} per worker (what update_actor returns): joined key by key, in rank order.
    r0 = make(1, meta={"metrics": {"loss": [1.0, 2.0], "lr": [0.1]}})
    r1 = make(1, meta={"metrics": {"loss": [3.0], "grad": 5.0}})
    assert DataProto.concat([r0, r1]).meta_info["metrics"] == {"loss": [1.0, 2.0, 3.0], "lr": [0.1], "grad": [5.0]}
    c = make(1, meta={"metrics": {"loss": 3.0}})
    assert DataProto.concat([c, b]).meta_info["metrics"] == {"loss": [3.0, 2.0]}  # mixed kinds


def test_concat_errors():
    with pytest.raises(DataProtoError, match="empty list"):
        DataProto.concat([])
    with pytest.raises(DataProtoError, match="item 1 has keys"):
        DataProto.concat([make(2), make(2).select(batch_keys=["act"])])


# ----------------------------------------------------------------- repeat / reorder / to
def test_repeat_interleave_vs_tile():
    d = DataProto.from_dict({"x": torch.tensor([[1, 1], [2, 2]])}, {"p": ["a", "b"]}, {"n": 3})
    inter = d.repeat(3, interleave=True)
    assert inter.batch["x"][:, 0].tolist() == [1, 1, 1, 2, 2, 2]
    assert list(inter.non_tensor_batch["p"]) == ["a", "a", "a", "b", "b", "b"]
    tiled = d.repeat(2, interleave=False)
    assert tiled.batch["x"][:, 1].tolist() == [1, 2, 1, 2]
    assert list(tiled.non_tensor_batch["p"]) == ["a", "b", "a", "b"]
    assert tiled.meta_info == {"n": 3} and len(d.repeat()) == 4


def test_reorder_in_place():
    d = make(4)
    assert d.reorder(torch.tensor([2, 0, 3, 1])) is None
    assert rows(d) == [102, 100, 103, 101]
    assert list(d.non_tensor_batch["uid"]) == ["u2", "u0", "u3", "u1"]
    d.reorder([1, 0, 2, 3])
    assert rows(d) == [100, 102, 103, 101]


def test_to_device():
    d = make(2)
    assert d.to("cpu") is d and d.batch.device == torch.device("cpu")
    if torch.cuda.is_available():
        assert d.to("cuda").batch["act"].is_cuda


# ----------------------------------------------------------------- padding
@pytest.mark.parametrize(
    "n, div, pad, expected_tail",
    [(5, 4, 3, [100, 101, 102]), (2, 7, 5, [100, 101, 100, 101, 100]), (4, 2, 0, [])],
)
def test_pad_unpad_round_trip(n, div, pad, expected_tail):
    d = make(n)
    padded, pad_size = pad_dataproto_to_divisor(d, div)
    assert pad_size == pad and len(padded) % div == 0
    assert rows(padded)[n:] == expected_tail
    assert len(padded.non_tensor_batch["uid"]) == n + pad
    chunks = padded.chunk(div)
    assert_same(unpad_dataproto(DataProto.concat(chunks), pad_size), d)


# ----------------------------------------------------------------- misc
def test_pickle_round_trip():
    d = make(3, meta={"metrics": [1]})
    back = pickle.loads(pickle.dumps(d))
    assert_same(back, d)
    assert back.meta_info == d.meta_info


def test_repr_is_short_and_informative():
    r = repr(make(3))
    assert r.startswith("DataProto(len=3") and "obs: (3, 2) int64" in r and "uid" in r
    assert "\n" not in r and len(r) < 200


def test_constructor_accepts_tensordict():
    td = TensorDict({"x": torch.zeros(2, 1)}, batch_size=[2])
    d = DataProto(batch=td, non_tensor_batch={"s": ["a", "b"]})
    assert d.non_tensor_batch["s"].dtype == object and len(d) == 2
    with pytest.raises(BatchSizeMismatchError, match="batch_size=\\[\\]"):
        DataProto(batch=TensorDict({"x": torch.zeros(2)}, batch_size=[]))


def test_module_imports_no_heavy_libs():
    """The protocol package is imported by the driver: only numpy / torch / tensordict at top level."""
    names = set()
    for path in pathlib.Path(protocol.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        names |= {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module.split(".")[0] for n in tree.body if isinstance(n, ast.ImportFrom) and n.module}
    assert "tensordict" in names  # the files were read
    assert not names & {"transformers", "ray", "hydra", "omegaconf", "pandas"}, names
