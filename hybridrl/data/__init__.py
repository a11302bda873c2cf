"""Data: verl's RL parquet -> RLHFDataset -> collate_fn -> a resumable dataloader.

Names are imported lazily so that ``hybridrl.data.preprocess`` scripts do not pay for torch.
"""

import importlib

_EXPORTS = {
    "DataError": "hybridrl.data.errors",
    "RLHFDataset": "hybridrl.data.rl_dataset",
    "SFTDataset": "hybridrl.data.sft_dataset",
    "collate_fn": "hybridrl.data.collate",
    "create_rl_dataset": "hybridrl.data.rl_dataset",
    "create_rl_dataloader": "hybridrl.data.dataloader",
}
__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'hybridrl.data' has no attribute {name!r}")
