import torch

from hybridrl.protocol import DataProto
from hybridrl.trainer.ppo_trainer import trim_left_padding


def _gen_batch(mask):
    mask = torch.tensor(mask)
    ids = torch.arange(mask.numel()).reshape(mask.shape) * mask
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask, "position_ids": pos},
                               non_tensors={"uid": ["a", "b"]})


def test_trim_left_padding_drops_only_columns_that_are_padding_everywhere():
    batch = _gen_batch([[0, 0, 0, 1, 1], [0, 0, 1, 1, 1]])
    trimmed = trim_left_padding(batch)
    assert trimmed.batch["input_ids"].shape == (2, 3)
    assert torch.equal(trimmed.batch["input_ids"], batch.batch["input_ids"][:, 2:])
    assert torch.equal(trimmed.batch["position_ids"], torch.tensor([[0, 0, 1], [0, 1, 2]]))
    assert list(trimmed.non_tensor_batch["uid"]) == ["a", "b"]


def test_trim_left_padding_keeps_a_batch_without_common_padding():
    batch = _gen_batch([[1, 1], [0, 1]])
    assert trim_left_padding(batch) is batch
