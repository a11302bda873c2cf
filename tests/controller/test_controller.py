import pytest
import torch

from hybridrl.controller.decorator import Dispatch, collect_outputs, dispatch_args, register
from hybridrl.controller.local import LocalWorkerGroup
from hybridrl.controller.worker import Worker
from hybridrl.protocol import DataProto


class EchoWorker(Worker):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
        self.calls = []

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, tag):
        self.calls.append(tag)
        return tag

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto) -> DataProto:
        return DataProto.from_dict(tensors={"y": data.batch["x"] * self.scale})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def get_rank(self):
        return self.rank

    def not_registered(self):
        return "plain"


def test_local_group_binds_only_registered_methods():
    group = LocalWorkerGroup(EchoWorker, scale=3)
    assert group.init_model("a") == ["a"]
    assert group.workers[0].calls == ["a"]
    out = group.double(DataProto.from_dict(tensors={"x": torch.arange(5.0)}))
    assert torch.equal(out.batch["y"], torch.arange(5.0) * 3)
    assert group.get_rank() == [0]
    assert not hasattr(group, "not_registered")


def test_dp_compute_proto_pads_splits_and_unpads_over_ranks():
    data = DataProto.from_dict(tensors={"x": torch.arange(7.0)}, non_tensors={"uid": list("abcdefg")})
    per_args, per_kwargs, pad = dispatch_args(Dispatch.DP_COMPUTE_PROTO, 3, (data,), {})
    assert pad == 2 and len(per_args) == 3
    assert [len(a[0]) for a in per_args] == [3, 3, 3]
    outputs = [a[0] for a in per_args]  # identity "workers"
    merged = collect_outputs(Dispatch.DP_COMPUTE_PROTO, outputs, pad)
    assert torch.equal(merged.batch["x"], data.batch["x"])
    assert list(merged.non_tensor_batch["uid"]) == list("abcdefg")


def test_dp_compute_requires_one_item_per_rank():
    per_args, per_kwargs, _ = dispatch_args(Dispatch.DP_COMPUTE, 2, ([1, 2],), {"b": [3, 4]})
    assert per_args == [(1,), (2,)] and per_kwargs == [{"b": 3}, {"b": 4}]
    with pytest.raises(ValueError, match="world_size=2"):
        dispatch_args(Dispatch.DP_COMPUTE, 2, ([1, 2, 3],), {})


def test_register_rejects_bad_modes():
    with pytest.raises(TypeError, match="dispatch_mode"):
        register(dispatch_mode="one_to_all")


class MutatingWorker(Worker):
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def touch(self, data: DataProto) -> DataProto:
        data.meta_info["worker_private"] = 1
        data.to("meta")
        return DataProto.from_dict(tensors={"y": torch.zeros(len(data))})


def test_local_workers_cannot_mutate_the_drivers_batch():
    group = LocalWorkerGroup(MutatingWorker)
    data = DataProto.from_dict(tensors={"x": torch.arange(3.0)}, meta_info={"a": 1})
    group.touch(data)
    assert data.meta_info == {"a": 1}
    assert data.batch["x"].device.type == "cpu"
