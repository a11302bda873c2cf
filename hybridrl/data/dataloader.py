"""A resumable, seeded dataloader for RLHFDataset (torchdata's StatefulDataLoader)."""

import warnings

import torch
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import RandomSampler

from hybridrl.data.collate import collate_fn
from hybridrl.data.errors import DataError


def create_rl_dataloader(
    dataset,
    batch_size: int,
    shuffle: bool = True,
    seed: int | None = 1,
    num_workers: int = 0,
    drop_last: bool = True,
    config_key: str = "data.train_batch_size",
    sampler=None,
) -> StatefulDataLoader:
    """Build a ``StatefulDataLoader`` whose ``state_dict()`` resumes mid-epoch exactly.

    Shuffling uses torchdata's stateful ``RandomSampler`` driven by a ``torch.Generator``
    seeded with ``seed``: the same seed gives the same order, and a state dict taken after
    k batches makes a fresh loader continue with batch k+1 (also across epochs).

    Args:
        dataset: a map-style dataset (e.g. ``RLHFDataset``).
        batch_size: prompts per batch (``data.train_batch_size``).
        shuffle: random order per epoch; False keeps file order.
        seed: seed of the shuffling generator (None: 1, like ``data.seed: null``).
        num_workers: DataLoader worker processes (0: load in the caller).
        drop_last: drop the last incomplete batch.
        config_key: the key ``batch_size`` came from, named in errors.
        sampler: the order of the rows in place of ``shuffle`` / ``seed`` (``data.sampler``,
            :func:`hybridrl.data.sampler.create_custom_sampler`).

    Returns:
        StatefulDataLoader yielding ``collate_fn`` dicts (tensors ``(batch_size, ...)``,
        object arrays ``(batch_size,)``).

    Raises:
        DataError: ``batch_size`` is not positive or larger than the dataset.
    """
    n = len(dataset)
    if batch_size <= 0:
        raise DataError(f"{config_key}={batch_size} must be a positive number of prompts")
    if batch_size > n:
        raise DataError(
            f"{config_key}={batch_size} is larger than the dataset ({n} rows after filtering); "
            f"lower {config_key} or use more data"
        )
    if sampler is None and shuffle:
        sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(1 if seed is None else int(seed)))
    elif sampler is None:
        sampler = torch.utils.data.SequentialSampler(dataset)
    return stateful_dataloader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        drop_last=drop_last,
        collate_fn=collate_fn,
    )


def stateful_dataloader(dataset, **kwargs) -> StatefulDataLoader:
    """``StatefulDataLoader(dataset, **kwargs)`` without the deprecation warning torchdata's
    constructor triggers in torch (``torch.set_vital``) at every run start: it says nothing
    about the user's run."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
        return StatefulDataLoader(dataset, **kwargs)
