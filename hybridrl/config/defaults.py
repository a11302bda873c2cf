"""The packaged ``ppo_trainer.yaml`` as data, for the checks that compare a run's values with the
defaults (ignored keys, verl's reward spelling)."""

from __future__ import annotations

from typing import Any

_DEFAULTS_CACHE: dict[str, Any] = {}


def packaged_defaults(resolved: bool = True):
    """The packaged ppo_trainer.yaml (OmegaConf only: it has no Hydra directives), read once.

    ``resolved=False`` gives a plain dict with the ``${...}`` interpolations as written.
    """
    if "ppo" not in _DEFAULTS_CACHE:
        from importlib.resources import files

        from omegaconf import OmegaConf

        text = files("hybridrl.config").joinpath("ppo_trainer.yaml").read_text()
        cfg = OmegaConf.create(text)
        _DEFAULTS_CACHE["raw"] = OmegaConf.to_container(cfg, resolve=False)
        OmegaConf.resolve(cfg)
        _DEFAULTS_CACHE["ppo"] = cfg
    return _DEFAULTS_CACHE["ppo" if resolved else "raw"]
