"""collate_fn and the resumable, seeded dataloader."""

import numpy as np
import pytest
import torch

from hybridrl.data import DataError, RLHFDataset, collate_fn, create_rl_dataloader


class Rows(torch.utils.data.Dataset):
    """Tiny dataset: item i has a tensor, an index and a fixed-length list."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"input_ids": torch.tensor([i, i + 1]), "index": i, "raw_prompt_ids": [i, i], "info": {"i": i}}


def test_collate_stacks_tensors_and_keeps_objects_whole():
    batch = collate_fn([Rows(5)[i] for i in (0, 3, 4)])
    assert torch.equal(batch["input_ids"], torch.tensor([[0, 1], [3, 4], [4, 5]]))
    for key in ("index", "raw_prompt_ids", "info"):
        assert batch[key].dtype == object and batch[key].shape == (3,)
    assert batch["raw_prompt_ids"][1] == [3, 3]  # equal-length lists stay lists, not a 2-D array
    assert batch["info"][2] == {"i": 4} and list(batch["index"]) == [0, 3, 4]


def test_collate_rejects_mismatched_keys():
    with pytest.raises(ValueError, match="item 1 has keys"):
        collate_fn([{"a": 1}, {"b": 2}])


def indices(loader, k):
    """Index lists of the next k batches, running on into new epochs as a trainer does."""
    out = []
    while len(out) < k:
        for batch in loader:
            out.append(list(batch["index"]))
            if len(out) == k:
                break
    return out


@pytest.mark.parametrize("taken", [2, 4, 5])  # 4: at the epoch end; 5: inside the second epoch
def test_resume_mid_epoch_matches_uninterrupted_run(taken):
    ds = Rows(64)
    reference = indices(create_rl_dataloader(ds, 16, seed=3), taken + 1)
    loader = create_rl_dataloader(ds, 16, seed=3)
    assert indices(loader, taken) == reference[:taken]
    state = loader.state_dict()
    fresh = create_rl_dataloader(ds, 16, seed=3)
    fresh.load_state_dict(state)
    assert indices(fresh, 1) == reference[taken:]
    if taken >= 4:
        assert reference[4] != reference[0]  # the second epoch is reshuffled


def test_seeded_order_and_sequential_without_shuffle():
    ds = Rows(20)
    a, b = indices(create_rl_dataloader(ds, 5, seed=1), 4), indices(create_rl_dataloader(ds, 5, seed=1), 4)
    c = indices(create_rl_dataloader(ds, 5, seed=2), 4)
    assert a == b and a != c and sorted(sum(a, [])) == list(range(20))
    assert indices(create_rl_dataloader(ds, 5, shuffle=False), 2) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert len(create_rl_dataloader(Rows(23), 5)) == 4  # drop_last


def test_batch_size_larger_than_dataset_names_the_key():
    with pytest.raises(DataError, match=r"data\.train_batch_size=8 is larger than the dataset \(5 rows"):
        create_rl_dataloader(Rows(5), 8)


def test_real_dataset_batches(tokenizer, gsm8k_parquet):
    ds = RLHFDataset(str(gsm8k_parquet / "test.parquet"), tokenizer, {"max_prompt_length": 256})
    loader = create_rl_dataloader(ds, 8, seed=0)
    batches = list(loader)
    assert len(batches) == 4
    batch = batches[0]
    assert batch["input_ids"].shape == batch["attention_mask"].shape == batch["position_ids"].shape == (8, 256)
    assert batch["reward_model"].dtype == object and batch["reward_model"].shape == (8,)
    seen = np.concatenate([b["index"] for b in batches]).astype(int)
    assert sorted(seen.tolist()) == list(range(32))


def test_building_a_loader_prints_no_torch_deprecation_warning():
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        create_rl_dataloader(Rows(4), batch_size=2)
    assert not [w for w in caught if "set_vital" in str(w.message)]
