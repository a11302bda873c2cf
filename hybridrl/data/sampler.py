"""verl's custom sampler (``data.sampler.class_path`` / ``class_name``): the user's torch ``Sampler``
orders the training prompts in place of the seeded shuffle, and a curriculum sampler (one with an
``update`` method, verl's ``AbstractCurriculumSampler``) sees every trained batch.

A sampler written for verl runs unchanged: it is constructed as verl constructs it,
``cls(data_source=<the training dataset>, data_config=<the data section>)``; its module may be a
file or ``pkg://<importable module>``.
"""

from __future__ import annotations

import abc
from collections.abc import Sized

from torch.utils.data import Sampler

from hybridrl.config.user_file import load_user_object
from hybridrl.errors import ConfigError

__all__ = ["AbstractCurriculumSampler", "AbstractSampler", "create_custom_sampler", "curriculum_update"]

KEY = "data.sampler.class_path"


class AbstractSampler(Sampler[int]):
    """A custom sampler (verl's interface): yields dataset indices; built from the dataset and the
    ``data`` config section."""

    @abc.abstractmethod
    def __init__(self, data_source: Sized, data_config) -> None: ...


class AbstractCurriculumSampler(AbstractSampler):
    """A sampler that reorders what is still to come from the batches trained so far."""

    @abc.abstractmethod
    def update(self, batch) -> None:
        """Called after every training step with the step's batch (a ``DataProto``: prompts,
        responses, ``token_level_scores``, ... and the rows' ``index`` / ``extra_info``)."""


def create_custom_sampler(data_config, dataset) -> Sampler | None:
    """The sampler of ``data.sampler`` for ``dataset`` (None when ``class_path`` is unset).

    Raises:
        ConfigError: the class cannot be loaded or built, is not a sampler (``__iter__`` and
            ``__len__``), or is a curriculum sampler while ``data.dataloader_num_workers`` > 0 (the
            loader's workers would fetch batches before the sampler saw the last one trained).
    """
    ref = data_config.sampler
    if not ref.class_path:
        return None
    cls = load_user_object(KEY, ref.class_path, ref.class_name, "your Sampler class (data.sampler.class_name)")
    try:
        sampler = cls(data_source=dataset, data_config=data_config)
    except TypeError as exc:
        raise ConfigError(
            f"{KEY}: {ref.class_name}(data_source=..., data_config=...) failed ({exc}); its constructor takes "
            "verl's two arguments"
        ) from exc
    if not (hasattr(sampler, "__iter__") and hasattr(sampler, "__len__")):
        raise ConfigError(
            f"{KEY}: {ref.class_name} is not a sampler (no __iter__ / __len__); derive it from "
            "hybridrl.data.sampler.AbstractSampler"
        )
    if callable(getattr(sampler, "update", None)) and int(data_config.dataloader_num_workers) != 0:
        raise ConfigError(
            f"data.dataloader_num_workers={data_config.dataloader_num_workers} with the curriculum sampler "
            f"{ref.class_name}: the loader's workers would draw batches before the sampler sees the last one "
            "trained; set data.dataloader_num_workers=0"
        )
    return sampler


def curriculum_update(dataloader, batch) -> None:
    """Hands a trained ``batch`` to the dataloader's curriculum sampler (nothing for the others)."""
    update = getattr(getattr(dataloader, "sampler", None), "update", None)
    if callable(update):
        update(batch=batch)
