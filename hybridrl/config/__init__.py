"""Trainer configs: the packaged Hydra YAML files, the loader and the start-up checks.

Light on import: Hydra and OmegaConf are imported inside the functions.
"""

from hybridrl.config.batch_sizes import normalize_batch_sizes
from hybridrl.config.errors import ConfigError
from hybridrl.config.loader import load_config
from hybridrl.config.schema import validate_ppo_config

__all__ = ["ConfigError", "load_config", "normalize_batch_sizes", "validate_ppo_config"]
