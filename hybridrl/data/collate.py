"""Batch a list of dataset items the way verl's ``collate_fn`` does."""

from collections import defaultdict

import numpy as np
import torch


def collate_fn(data_list: list[dict]) -> dict:
    """Stack tensors; put every other value into an object ``np.ndarray`` of length ``bs``.

    Args:
        data_list: ``bs`` dicts as returned by ``RLHFDataset.__getitem__``; all must have the
            same keys.

    Returns:
        dict: each tensor key -> ``torch.stack`` of the items (e.g. ``input_ids`` becomes
        ``(bs, max_prompt_length)``); each other key -> ``np.ndarray`` of ``dtype=object``
        and shape ``(bs,)`` (lists and dicts stay whole, one per element).

    Raises:
        ValueError: if the items do not all have the same keys.
    """
    tensors: dict[str, list] = defaultdict(list)
    others: dict[str, list] = defaultdict(list)
    keys = set(data_list[0]) if data_list else set()
    for i, item in enumerate(data_list):
        if set(item) != keys:
            raise ValueError(
                f"collate_fn: item {i} has keys {sorted(item)} but item 0 has {sorted(keys)}; "
                "every dataset item must return the same keys"
            )
        for key, value in item.items():
            (tensors if isinstance(value, torch.Tensor) else others)[key].append(value)
    out: dict = {key: torch.stack(values) for key, values in tensors.items()}
    for key, values in others.items():
        # Fill element by element: np.array(values) would split lists into a 2-D array.
        arr = np.empty(len(values), dtype=object)
        for i, value in enumerate(values):
            arr[i] = value
        out[key] = arr
    return out
