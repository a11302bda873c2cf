"""Run configs: the packaged Hydra YAML files, the loader, the single-key rules the sections share, the
batch-size arithmetic and the ``auto`` precision. The checks of a whole run against the registered
components (estimators, engines, reward managers, ...) sit above them, in
:mod:`hybridrl.trainer.ppo.config_check`.

Light on import: Hydra, OmegaConf and torch are imported inside the functions.
"""

from hybridrl.config.batch_sizes import normalize_batch_sizes, worker_batch_sizes
from hybridrl.config.loader import load_config
from hybridrl.errors import ConfigError

__all__ = ["ConfigError", "load_config", "normalize_batch_sizes", "worker_batch_sizes"]
