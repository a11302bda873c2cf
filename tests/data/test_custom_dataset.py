"""``data.custom_cls.{path,name}``: the user's Dataset class, loaded from a file and constructed as
verl constructs it (``data_files=, tokenizer=, processor=, config=, max_samples=``), is what the
run's dataloaders yield, through the same collate; a bad file or class is one line."""

import textwrap

import pytest

from hybridrl.config import ConfigError, load_config
from hybridrl.trainer.main_ppo import _build_dataloaders
from hybridrl.trainer.ppo.config import typed_ppo_config

# as verl users write them: a subclass of RLHFDataset that adds to each item
SUBCLASS = """
from hybridrl.data import RLHFDataset

class TaggedDataset(RLHFDataset):
    def __init__(self, data_files, tokenizer, config, processor=None, max_samples=-1):
        super().__init__(data_files, tokenizer, config, processor, max_samples)
        self.tag = config.get("prompt_key")

    def __getitem__(self, item):
        out = super().__getitem__(item)
        out["tag"] = f"{self.tag}-{item}"
        return out
"""

# a plain torch Dataset, written before verl passed max_samples
PLAIN = """
import torch
from torch.utils.data import Dataset

class TinyDataset(Dataset):
    def __init__(self, data_files, tokenizer, config, processor=None):
        self.n = 6
        self.length = config.max_prompt_length

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        ids = torch.full((self.length,), i, dtype=torch.long)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": torch.arange(self.length),
                "raw_prompt_ids": [i], "index": i, "data_source": "openai/gsm8k",
                "reward_model": {"style": "rule", "ground_truth": str(i)}, "extra_info": {}}

class NotADataset:
    def __init__(self, data_files, tokenizer, config, processor=None):
        pass

class OtherArgs(Dataset):
    def __init__(self, path, tok):
        pass
"""


def run_config(tmp_path, gsm8k_parquet, source, name, *extra):
    file = tmp_path / "my_dataset.py"
    file.write_text(textwrap.dedent(source))
    overrides = [
        f"data.train_files={gsm8k_parquet / 'train.parquet'}",
        f"data.val_files={gsm8k_parquet / 'test.parquet'}",
        "data.train_batch_size=4",
        "data.max_prompt_length=256",
        f"data.custom_cls.path={file}",
        f"data.custom_cls.name={name}",
        *extra,
    ]
    return typed_ppo_config(load_config(overrides, resolve_auto_dtypes=False))


def test_a_verl_style_subclass_of_rlhfdataset_is_what_the_dataloaders_yield(tmp_path, gsm8k_parquet, tokenizer):
    config = run_config(tmp_path, gsm8k_parquet, SUBCLASS, "TaggedDataset")
    train, val = _build_dataloaders(config, tokenizer)
    assert type(train.dataset).__name__ == "TaggedDataset" and type(val.dataset).__name__ == "TaggedDataset"
    batch = next(iter(train))
    assert batch["input_ids"].shape == (4, 256)
    assert all(tag.startswith("prompt-") for tag in batch["tag"])
    assert len(val.dataset) == 32


def test_a_plain_dataset_goes_through_the_same_collate(tmp_path, gsm8k_parquet, tokenizer):
    config = run_config(tmp_path, gsm8k_parquet, PLAIN, "TinyDataset", "data.shuffle=false", "data.max_prompt_length=8")
    train, val = _build_dataloaders(config, tokenizer)
    assert type(train.dataset).__name__ == "TinyDataset"
    batch = next(iter(train))
    assert batch["input_ids"].shape == (4, 8) and batch["input_ids"][:, 0].tolist() == [0, 1, 2, 3]
    assert list(batch["index"]) == [0, 1, 2, 3] and batch["data_source"][0] == "openai/gsm8k"
    assert next(iter(val))["input_ids"].shape == (6, 8)  # val_batch_size null: the whole set


@pytest.mark.parametrize(
    "name, message",
    [
        ("Missing", "data.custom_cls.name='Missing' is not defined in "),
        ("NotADataset", "data.custom_cls.name='NotADataset' in "),
        ("OtherArgs", "data.custom_cls.name='OtherArgs': its constructor does not take verl's arguments"),
    ],
)
def test_a_bad_class_is_one_line(tmp_path, gsm8k_parquet, tokenizer, name, message):
    config = run_config(tmp_path, gsm8k_parquet, PLAIN, name)
    with pytest.raises(ConfigError) as err:
        _build_dataloaders(config, tokenizer)
    text = str(err.value)
    assert "\n" not in text and message in text
    if name == "Missing":
        assert "TinyDataset" in text  # the classes the file does define
    if name == "NotADataset":
        assert "torch.utils.data.Dataset" in text


def test_a_missing_file_or_name_is_one_line(tmp_path, gsm8k_parquet, tokenizer):
    config = run_config(tmp_path, gsm8k_parquet, PLAIN, "TinyDataset")
    config.data.custom_cls.path = str(tmp_path / "nope.py")
    with pytest.raises(ConfigError, match=r"data.custom_cls.path=.*nope.py.* does not exist") as err:
        _build_dataloaders(config, tokenizer)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"data.custom_cls.name is not set") as err:
        run_config(tmp_path, gsm8k_parquet, PLAIN, "null")
    assert "\n" not in str(err.value)
