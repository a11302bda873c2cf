"""DataProto operations added for verl's API: concat's meta_info merge, sample_level_repeat,
unfold_column_chunks, fold / unfold_batch_dim, make_iterator and save / load.

Expected values are written out by hand from small batches whose rows are easy to follow.
"""

import os
import pickle
from collections import defaultdict

import numpy as np
import pytest
import torch

from hybridrl.protocol import (
    BatchSizeMismatchError,
    ChunkSizeError,
    ConcatConflictError,
    DataProto,
    DataProtoError,
    MissingKeyError,
)
from hybridrl.protocol import ops as protocol_ops


def make(n=3, meta=None):
    """Row i: x = [10 i, 10 i + 1], id = i, name = "r<i>"."""
    return DataProto.from_dict(
        tensors={"x": torch.stack([10 * torch.arange(n), 10 * torch.arange(n) + 1], dim=1), "id": torch.arange(n)},
        non_tensors={"name": [f"r{i}" for i in range(n)]},
        meta_info={"t": 1.0} if meta is None else meta,
    )


def ids(d):
    return d.batch["id"].tolist()


def names(d):
    return list(d.non_tensor_batch["name"])


# ----------------------------------------------------------------- errors / construction
def test_errors_are_assertion_and_value_errors():
    assert issubclass(DataProtoError, AssertionError) and issubclass(DataProtoError, ValueError)
    assert issubclass(ConcatConflictError, DataProtoError)


def test_constructor_accepts_none_parts():
    d = DataProto(batch=None, non_tensor_batch=None, meta_info=None)
    assert len(d) == 0 and d.non_tensor_batch == {} and d.meta_info == {}


def test_auto_padding_true_is_refused_and_false_accepted():
    with pytest.raises(DataProtoError, match="auto_padding=True is not supported.*pad_dataproto_to_divisor"):
        DataProto.from_dict({"x": torch.zeros(2)}, auto_padding=True)
    assert len(DataProto.from_single_dict({"x": torch.zeros(2)}, auto_padding=False)) == 2


def test_row_ops_keep_the_subclass():
    class MyProto(DataProto):
        pass

    d = MyProto.from_single_dict({"x": torch.arange(4), "s": np.array(list("abcd"), dtype=object)})
    assert type(d) is MyProto
    for out in (
        d[[0, 2]],
        d[1:3],
        d.select(),
        d.sample_level_repeat([1, 0, 1, 2]),
        DataProto.concat([d, d]),
        protocol_ops.fold_batch_dim(d, 2),
    ):
        assert type(out) is MyProto


# ----------------------------------------------------------------- concat meta_info
def test_concat_joins_list_of_dict_metrics_of_every_worker():
    parts = [
        make(1, {"metrics": [{"loss": 0.1, "acc": 1.0}]}),
        make(1, {"metrics": [{"loss": 0.2, "acc": 0.0}, {"loss": 0.3}]}),
        make(1, {"metrics": [{"acc": 0.5}]}),
    ]
    out = DataProto.concat(parts)
    assert out.meta_info == {"metrics": {"loss": [0.1, 0.2, 0.3], "acc": [1.0, 0.0, 0.5]}}


def test_concat_metrics_when_first_part_has_none():
    parts = [
        make(1, {"k": 1}),
        make(1, {"k": 1, "metrics": {"loss": 2.0}}),
        make(1, {"metrics": None}),
        make(1, {"metrics": {"loss": [3.0, 4.0]}}),
    ]
    assert DataProto.concat(parts).meta_info == {"k": 1, "metrics": {"loss": [2.0, 3.0, 4.0]}}


def test_concat_without_metrics_has_no_metrics_key_but_empty_dict_stays():
    assert "metrics" not in DataProto.concat([make(1, {}), make(1, {})]).meta_info
    assert DataProto.concat([make(1, {"metrics": {}}), make(1, {})]).meta_info == {"metrics": {}}


def test_concat_merges_non_metric_keys_and_checks_equal_ones():
    a = make(1, {"a": 1, "arr": np.array([1.0, np.nan]), "ten": torch.tensor([2, 3])})
    b = make(1, {"b": "x", "arr": np.array([1.0, np.nan]), "ten": torch.tensor([2, 3])})
    out = DataProto.concat([a, b])
    assert set(out.meta_info) == {"a", "b", "arr", "ten"} and out.meta_info["b"] == "x"


@pytest.mark.parametrize(
    "first, second",
    [
        (1, 2),
        ("A", "B"),
        (np.array([1, 2]), np.array([1, 3])),
        (torch.tensor([1.0]), torch.tensor([2.0])),
        ([1, 2], [1, 2, 3]),
    ],
)
def test_concat_conflicting_non_metric_key_raises(first, second):
    parts = [make(1, {"cfg": first}), make(1, {"cfg": first}), make(1, {"cfg": second})]
    with pytest.raises(ConcatConflictError, match=r"meta_info key 'cfg' in concat: item 0 has .*, item 2 has"):
        DataProto.concat(parts)


def test_concat_rejects_metrics_that_are_not_dicts():
    with pytest.raises(DataProtoError, match=r"meta_info\['metrics'\] of item 1 holds a float"):
        DataProto.concat([make(1, {"metrics": {"a": 1.0}}), make(1, {"metrics": [0.5]})])


def test_union_treats_nan_as_equal():
    d = DataProto.from_dict(non_tensors={"v": np.array([1.0, np.nan])}, meta_info={"m": float("nan")})
    d.union(DataProto.from_dict(non_tensors={"v": np.array([1.0, np.nan])}, meta_info={"m": float("nan")}))
    assert np.isnan(d.non_tensor_batch["v"][1])


# ----------------------------------------------------------------- sample_level_repeat
@pytest.mark.parametrize("counts", [[2, 0, 1], (2, 0, 1), np.array([2, 0, 1]), torch.tensor([2, 0, 1])])
def test_sample_level_repeat(counts):
    out = make(3).sample_level_repeat(counts)
    assert ids(out) == [0, 0, 2]
    assert out.batch["x"].tolist() == [[0, 1], [0, 1], [20, 21]]
    assert names(out) == ["r0", "r0", "r2"] and out.meta_info == {"t": 1.0}


def test_sample_level_repeat_without_tensors():
    d = DataProto.from_dict(non_tensors={"s": ["a", "b"]})
    assert list(d.sample_level_repeat([1, 3]).non_tensor_batch["s"]) == ["a", "b", "b", "b"]


@pytest.mark.parametrize(
    "counts, error, match",
    [
        ([1, 1], BatchSizeMismatchError, r"shape \(2,\); give one count per row, \(3,\)"),
        ([[1, 1, 1]], BatchSizeMismatchError, "one count per row"),
        ([1, -1, 1], DataProtoError, "counts must be >= 0"),
        ([1.0, 2.0, 1.0], DataProtoError, "dtype float64; give ints"),
        ("121", DataProtoError, "repeat_times is a str"),
    ],
)
def test_sample_level_repeat_errors(counts, error, match):
    with pytest.raises(error, match=match):
        make(3).sample_level_repeat(counts)


# ----------------------------------------------------------------- unfold_column_chunks
def test_unfold_column_chunks_splits_tensors_and_repeats_the_rest():
    d = DataProto.from_dict(
        tensors={
            "cols": torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]]),
            "id": torch.tensor([0, 1]),
            "cube": torch.arange(16).reshape(2, 4, 2),
        },
        non_tensors={
            "name": ["a", "b"],
            "grid": np.array([["p", "q"], ["r", "s"]], dtype=object),
            "turns": [[1, 2, 3, 4], ["u", "v", "w", "x"]],
        },
        meta_info={"m": 1},
    )
    out = d.unfold_column_chunks(2, split_keys=["cols", "cube", "grid", "turns"])
    assert len(out) == 4 and out.meta_info == {"m": 1}
    assert out.batch["cols"].tolist() == [[1, 2], [3, 4], [5, 6], [7, 8]]
    assert out.batch["id"].tolist() == [0, 0, 1, 1]
    assert out.batch["cube"].shape == (4, 2, 2)
    assert out.batch["cube"][1].tolist() == [[4, 5], [6, 7]]  # row 0, columns 2-3
    assert names(out) == ["a", "a", "b", "b"]
    assert out.non_tensor_batch["grid"].tolist() == [["p"], ["q"], ["r"], ["s"]]
    assert out.non_tensor_batch["turns"].shape == (4, 2)  # equal-length slices: verl's 2-D form
    assert out.non_tensor_batch["turns"].tolist() == [[1, 2], [3, 4], ["u", "v"], ["w", "x"]]


def test_unfold_column_chunks_list_column_compares_like_verls():
    """verl's test: a list of equal-length lists split in 2 equals [[a1], [a2], ...] element-wise."""
    d = DataProto.from_dict(
        tensors={"obs": torch.arange(12).reshape(3, 4)},
        non_tensors={"labels": [["a1", "a2"], ["b1", "b2"], ["c1", "c2"]]},
    )
    out = d.unfold_column_chunks(2, split_keys=["obs", "labels"])
    labels = out.non_tensor_batch["labels"]
    assert labels.shape == (6, 1) and (labels == [["a1"], ["a2"], ["b1"], ["b2"], ["c1"], ["c2"]]).all()
    assert isinstance(labels[0], np.ndarray) and labels[0].tolist() == ["a1"]


def test_unfold_column_chunks_uneven_slices_stay_one_dimensional():
    d = DataProto.from_dict(non_tensors={"turns": [[1, 2, 3, 4], [5, 6]]})
    out = d.unfold_column_chunks(2, split_keys=["turns"])
    assert out.non_tensor_batch["turns"].shape == (4,)
    assert out.non_tensor_batch["turns"].tolist() == [[1, 2], [3, 4], [5], [6]]


def test_unfold_column_chunks_without_split_keys_repeats_every_key():
    out = make(2).unfold_column_chunks(3)
    assert ids(out) == [0, 0, 0, 1, 1, 1] and out.batch["x"].shape == (6, 2)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"n_split": 3, "split_keys": ["x"]}, ChunkSizeError, "'x' has 2 columns, not a multiple of n_split=3"),
        ({"n_split": 2, "split_keys": ["id"]}, DataProtoError, r"'id' has shape \(2,\), no dim 1"),
        ({"n_split": 2, "split_keys": ["name"]}, DataProtoError, r"\['name'\]\[0\] is a str, not a sequence"),
        ({"n_split": 2, "split_keys": ["nope"]}, MissingKeyError, "split key 'nope'"),
        ({"n_split": 0}, ChunkSizeError, "n_split=0"),
    ],
)
def test_unfold_column_chunks_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        make(2).unfold_column_chunks(**kwargs)


def test_unfold_column_chunks_uneven_list_element():
    d = DataProto.from_dict(non_tensors={"turns": [[1, 2], [1, 2, 3]]})
    with pytest.raises(ChunkSizeError, match=r"\['turns'\]\[1\] has 3 items"):
        d.unfold_column_chunks(2, split_keys=["turns"])


# ----------------------------------------------------------------- fold / unfold batch dim
def test_fold_and_unfold_batch_dim_round_trip():
    from hybridrl.protocol import fold_batch_dim, unfold_batch_dim

    d = make(6)
    folded = fold_batch_dim(d, 2)
    assert len(folded) == 2 and folded.batch.batch_size == torch.Size([2])
    assert folded.batch["id"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert folded.batch["x"].shape == (2, 3, 2)
    assert folded.non_tensor_batch["name"].tolist() == [["r0", "r1", "r2"], ["r3", "r4", "r5"]]
    folded.reorder([1, 0])
    back = unfold_batch_dim(folded, batch_dims=2)
    assert ids(back) == [3, 4, 5, 0, 1, 2] and names(back) == ["r3", "r4", "r5", "r0", "r1", "r2"]
    assert back.batch["x"][0].tolist() == [30, 31] and back.meta_info == {"t": 1.0}
    assert ids(d) == [0, 1, 2, 3, 4, 5]  # the input is unchanged


def test_fold_batch_dim_errors():
    with pytest.raises(ChunkSizeError, match="5 rows cannot be folded into 2"):
        protocol_ops.fold_batch_dim(make(5), 2)
    bad = DataProto.from_dict({"a": torch.zeros(2, 3), "b": torch.zeros(2, 4)}, num_batch_dims=1)
    with pytest.raises(BatchSizeMismatchError, match=r"'b' starts with \(2, 4\) but 'a' with \(2, 3\)"):
        protocol_ops.unfold_batch_dim(bad, batch_dims=2)
    with pytest.raises(DataProtoError, match="'id' has 1 dims, fewer than batch_dims=2"):
        protocol_ops.unfold_batch_dim(make(2), batch_dims=2)


def test_protocol_module_getattr_names_unknown_attribute():
    import hybridrl.protocol as p

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = p.nope


# ----------------------------------------------------------------- make_iterator
def test_make_iterator_in_order_over_epochs():
    d = make(6, meta={"m": 7})
    batches = list(d.make_iterator(mini_batch_size=2, epochs=2))
    assert [ids(b) for b in batches] == [[0, 1], [2, 3], [4, 5]] * 2
    assert names(batches[1]) == ["r2", "r3"] and batches[0].meta_info == {"m": 7}
    assert list(d.make_iterator(mini_batch_size=3, epochs=0)) == []


def test_make_iterator_shuffle_is_seeded_and_covers_every_row_each_epoch():
    d = make(8)

    def run(seed):
        return [ids(b) for b in d.make_iterator(2, epochs=3, seed=seed, dataloader_kwargs={"shuffle": True})]

    first = run(1)
    assert first == run(1) and first != run(2)
    for epoch in range(3):
        rows = sum(first[4 * epoch : 4 * epoch + 4], [])
        assert sorted(rows) == list(range(8))
    assert sum(first[0:4], []) != sum(first[4:8], [])  # a new order every epoch


def test_make_iterator_errors():
    with pytest.raises(ChunkSizeError, match="5 rows do not split into mini-batches of 2"):
        make(5).make_iterator(2, epochs=1)
    with pytest.raises(DataProtoError, match="dataloader_kwargs is a list"):
        make(4).make_iterator(2, epochs=1, dataloader_kwargs=[("shuffle", True)])


# ----------------------------------------------------------------- save / load
def test_save_load_round_trip(tmp_path):
    d = DataProto.from_dict(
        tensors={"x": torch.randn(3, 2), "mask": torch.tensor([[True], [False], [True]])},
        non_tensors={
            "name": ["a", "b", "c"],
            "info": [{"k": [1, 2]}, None, {"k": (3.5,)}],
            "arr": [np.arange(2), np.array(["u"]), np.float32(1.5)],
        },
        meta_info={"temperature": 0.7, "ids": np.array([4, 5]), "step": np.int64(3), "t": torch.ones(2)},
    )
    path = tmp_path / "d.pt"
    d.save_to_disk(path)
    back = DataProto.load_from_disk(path)
    assert torch.equal(back.batch["x"], d.batch["x"]) and back.batch["mask"].dtype == torch.bool
    assert back.non_tensor_batch["name"].dtype == object
    assert list(back.non_tensor_batch["name"]) == ["a", "b", "c"]
    assert list(back.non_tensor_batch["info"]) == [{"k": [1, 2]}, None, {"k": (3.5,)}]
    assert back.non_tensor_batch["arr"][0].tolist() == [0, 1] and back.non_tensor_batch["arr"][2] == 1.5
    assert back.meta_info["temperature"] == 0.7 and back.meta_info["ids"].tolist() == [4, 5]
    assert back.meta_info["step"] == 3 and torch.equal(back.meta_info["t"], torch.ones(2))


def test_save_load_without_tensors_and_subclass(tmp_path):
    class MyProto(DataProto):
        pass

    path = tmp_path / "n.pt"
    DataProto.from_dict(non_tensors={"s": ["a"]}).save_to_disk(path)
    back = MyProto.load_from_disk(path)
    assert type(back) is MyProto and back.batch is None and list(back.non_tensor_batch["s"]) == ["a"]


def test_save_writes_only_the_rows_of_a_slice(tmp_path):
    big = DataProto.from_dict({"x": torch.zeros(10_000, 16)})
    big[:10].save_to_disk(tmp_path / "small.pt")
    big.save_to_disk(tmp_path / "big.pt")
    assert os.path.getsize(tmp_path / "small.pt") * 50 < os.path.getsize(tmp_path / "big.pt")
    assert DataProto.load_from_disk(tmp_path / "small.pt").batch["x"].shape == (10, 16)


class _Custom:
    pass


@pytest.mark.parametrize(
    "non_tensors, meta, where",
    [
        ({"o": [_Custom()]}, {}, r"non_tensor_batch\['o'\]\[0\] is a _Custom"),
        ({"o": [1]}, {"d": defaultdict(list)}, r"meta_info\['d'\] is a defaultdict"),
        ({"o": [1]}, {"deep": {"a": [1, {2: _Custom()}]}}, r"meta_info\['deep'\]\['a'\]\[1\]\[2\] is a _Custom"),
    ],
)
def test_save_refuses_values_the_safe_loader_cannot_read(tmp_path, non_tensors, meta, where):
    path = tmp_path / "x.pt"
    with pytest.raises(DataProtoError, match=where):
        DataProto.from_dict(non_tensors=non_tensors, meta_info=meta).save_to_disk(path)
    assert not path.exists()


class _Exploit:
    def __reduce__(self):
        return (os.makedirs, (self.target,))


def test_load_refuses_files_that_would_run_code(tmp_path):
    marker = tmp_path / "pwned"
    exploit = _Exploit()
    exploit.target = str(marker)
    path = tmp_path / "evil.pt"
    torch.save(
        {
            "format": "hybridrl.DataProto",
            "version": 1,
            "batch": None,
            "non_tensor_batch": {"x": np.array([exploit], dtype=object)},
            "meta_info": {},
        },
        path,
    )
    with pytest.raises(DataProtoError, match=r"cannot read .* safely \(it would load os.makedirs\)"):
        DataProto.load_from_disk(path)
    assert not marker.exists()
    with open(tmp_path / "pickled.pt", "wb") as f:  # what verl's save_to_disk writes
        pickle.dump(make(2), f)
    with pytest.raises(DataProtoError, match="cannot read .* safely"):
        DataProto.load_from_disk(tmp_path / "pickled.pt")
    (tmp_path / "cut.pt").write_bytes((tmp_path / "evil.pt").read_bytes()[:100])
    with pytest.raises(DataProtoError, match="cannot read .*cut.pt' safely"):
        DataProto.load_from_disk(tmp_path / "cut.pt")


def test_load_refuses_other_torch_files(tmp_path):
    torch.save({"weights": torch.ones(1)}, tmp_path / "w.pt")
    with pytest.raises(DataProtoError, match="was not written by DataProto.save_to_disk"):
        DataProto.load_from_disk(tmp_path / "w.pt")
    torch.save({"format": "hybridrl.DataProto", "version": 99}, tmp_path / "v.pt")
    with pytest.raises(DataProtoError, match="format version 99; this hybridrl reads version 1"):
        DataProto.load_from_disk(tmp_path / "v.pt")
