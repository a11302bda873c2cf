"""Fixtures of the config tests: composed configs cached for the session (composing one takes
~0.15 s, and hundreds of these tests read one)."""

import copy

import pytest
from omegaconf import OmegaConf

from hybridrl.config import load_config
from hybridrl.config.precision import resolve_precision


def set_keys(config, overrides) -> None:
    """Set ``key=value`` overrides (parsed by Hydra's override parser, as on a command line) on
    ``config`` in place.

    Equal to composing them with the config only for keys the packaged YAML has and no
    interpolation reads (an interpolation was resolved when the config was composed)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    for override in OverridesParser.create().parse_overrides(list(overrides)):
        OmegaConf.update(config, override.key_or_group, override.value(), merge=False)


@pytest.fixture(scope="session")
def composed():
    """``composed(overrides=(), changes=())``: ``load_config(overrides + changes)`` made from a copy
    of ``load_config(overrides)``, composed once per session for each list of overrides: the
    ``changes`` set by :func:`set_keys`, then the ``auto`` dtypes resolved, as ``load_config`` does
    last (``trainer.device``, ``trainer.n_gpus_per_node``, ... decide them)."""
    cache = {}

    def make(overrides=(), changes=()):
        key = tuple(overrides)
        if key not in cache:
            cache[key] = load_config(list(key), resolve_auto_dtypes=False)
        config = copy.deepcopy(cache[key])
        set_keys(config, changes)
        resolve_precision(config)
        return config

    return make
