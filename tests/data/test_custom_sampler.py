"""verl's custom sampler (``data.sampler.class_path`` / ``class_name``): the user's Sampler, from a file
or a ``pkg://`` module, built as verl builds it, orders the training batches; a curriculum sampler
sees each trained batch; bad settings are one line naming the key."""

import sys

import pytest
import torch

from hybridrl.config import load_config
from hybridrl.data import create_rl_dataloader
from hybridrl.data.sampler import create_custom_sampler, curriculum_update
from hybridrl.errors import ConfigError
from hybridrl.trainer.ppo.config import typed_ppo_config

SAMPLERS = '''
from torch.utils.data import Sampler


class Backwards(Sampler):
    """Every row, last first; remembers the batches it was shown (a curriculum sampler)."""

    def __init__(self, data_source, data_config):
        self.n, self.seen, self.batch_size = len(data_source), [], data_config.train_batch_size

    def __iter__(self):
        return iter(range(self.n - 1, -1, -1))

    def __len__(self):
        return self.n

    def update(self, batch):
        self.seen.append(batch)


class Plain(Sampler):
    def __init__(self, data_source, data_config):
        self.n = len(data_source)

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.n


class NoArguments:
    def __init__(self):
        pass
'''


class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return {"index": i}


def _data(path, name, **more):
    overrides = [f"data.sampler.class_path={path}", f"data.sampler.class_name={name}", "data.train_batch_size=2"]
    overrides += [f"data.{key}={value}" for key, value in more.items()]
    return typed_ppo_config(load_config(overrides, resolve_auto_dtypes=False)).data


@pytest.fixture
def sampler_file(tmp_path):
    path = tmp_path / "my_samplers.py"
    path.write_text(SAMPLERS)
    return path


def test_a_file_samplers_order_drives_the_batches_and_its_update_sees_each_batch(sampler_file):
    data = _data(sampler_file, "Backwards")
    sampler = create_custom_sampler(data, Rows())
    assert sampler.batch_size == 2  # built with verl's data_config
    loader = create_rl_dataloader(Rows(), batch_size=2, shuffle=True, sampler=sampler)
    assert [list(batch["index"]) for batch in loader] == [[5, 4], [3, 2], [1, 0]]
    curriculum_update(loader, "batch 1")
    assert sampler.seen == ["batch 1"]
    curriculum_update(create_rl_dataloader(Rows(), batch_size=2), "ignored")  # no update method: nothing


def test_a_pkg_module_works_as_in_verl(sampler_file, monkeypatch):
    monkeypatch.syspath_prepend(str(sampler_file.parent))
    sampler = create_custom_sampler(_data("pkg://my_samplers", "Plain"), Rows())
    assert list(sampler) == list(range(6))
    sys.modules.pop("my_samplers", None)


@pytest.mark.parametrize(
    "name, more, message",
    [
        ("Backwards", {"dataloader_num_workers": 2}, "data.dataloader_num_workers=2 with the curriculum sampler"),
        ("Missing", {}, "defines no 'Missing'"),
        ("NoArguments", {}, "takes verl's two arguments"),
    ],
)
def test_bad_samplers_are_one_line(sampler_file, name, more, message):
    with pytest.raises(ConfigError, match=message) as err:
        create_custom_sampler(_data(sampler_file, name, **more), Rows())
    assert "\n" not in str(err.value)


def test_a_class_path_without_a_class_name_or_module_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="data.sampler.class_name is not set"):
        typed_ppo_config(load_config(["data.sampler.class_path=x.py"], resolve_auto_dtypes=False))
    with pytest.raises(ConfigError, match="module no_such_module_here does not import"):
        create_custom_sampler(_data("pkg://no_such_module_here", "X"), Rows())
