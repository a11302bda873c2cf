"""Compose the trainer config from the packaged YAML and verl-style command-line overrides.

Hydra is imported inside the functions so that ``import hybridrl.config`` stays light.
"""

from __future__ import annotations

import difflib
from typing import Iterable

from hybridrl.config.precision import resolve_precision
from hybridrl.config.reward_spelling import apply_reward_spelling
from hybridrl.errors import ConfigError

CONFIG_MODULE = "hybridrl.config"


def load_config(
    overrides: list[str] | None = None,
    config_name: str = "ppo_trainer",
    config_dir: str | None = None,
    resolve_auto_dtypes: bool = True,
):
    """Compose ``<config_name>.yaml`` with Hydra overrides and return the resolved config.

    The override grammar is Hydra's, as verl's command line uses it: ``a.b=1``,
    ``trainer.logger=['console','wandb']``, ``+new.key=1`` (add), ``++a.b=1`` (add or change),
    ``~a.b`` (delete). Interpolations such as ``${data.max_prompt_length}`` are resolved after
    the overrides, so ``data.max_prompt_length=256`` also changes ``rollout.prompt_length``.

    Args:
        overrides: command-line style ``key=value`` strings; ``None`` means none.
        config_name: YAML file name without ``.yaml``; found in ``hybridrl/config`` or,
            when given, in ``config_dir`` (verl's ``--config-path``).
        config_dir: optional folder with the user's own YAML files (absolute or relative to
            the current directory). The packaged configs stay on the search path, so a user
            file may start with ``defaults: [ppo_trainer, _self_]``.
        resolve_auto_dtypes: replace every ``auto`` dtype (``mixed_precision.param_dtype``,
            ``rollout.dtype``) by bf16 or fp32 for ``trainer.device``
            (``hybridrl.config.precision.resolve_precision``); the commands do it themselves, to
            print the choice.

    Returns:
        omegaconf.DictConfig in struct mode (reading an unknown key raises), interpolations
        resolved.

    Raises:
        ConfigError: an override names a key that the config lacks (with a did-you-mean when a
            close key exists), an override does not parse, or the config file is missing.
    """
    from hydra import compose, initialize_config_dir, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException, MissingConfigException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    overrides = list(overrides or [])
    parsed = _parse_overrides(overrides)
    extra = []
    if config_dir is not None:
        import os

        config_dir = os.path.abspath(os.path.expanduser(config_dir))
        extra = [f"hydra.searchpath=[pkg://{CONFIG_MODULE}]"]
    GlobalHydra.instance().clear()
    try:
        if config_dir is None:
            ctx = initialize_config_module(config_module=CONFIG_MODULE, version_base=None)
        else:
            ctx = initialize_config_dir(config_dir=config_dir, version_base=None)
        with ctx:
            try:
                cfg = compose(config_name=config_name, overrides=extra + overrides)
            except MissingConfigException as exc:
                where = f"{config_dir} nor in hybridrl/config" if config_dir else "hybridrl/config"
                raise ConfigError(
                    f"config '{config_name}.yaml' is not in {where}; check --config-name and --config-path"
                ) from exc
            except (HydraException, OmegaConfBaseException) as exc:
                # Hydra's message for an unknown key has no suggestion: compose without the
                # overrides (only on this error path) and name the closest known key.
                _check_override_keys(parsed, compose(config_name=config_name, overrides=extra))
                raise ConfigError(_one_line(f"config '{config_name}': {exc}", exc)) from exc
    finally:
        GlobalHydra.instance().clear()
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as exc:
        raise ConfigError(_one_line(f"config '{config_name}': cannot resolve an interpolation: {exc}", exc)) from exc
    if "reward" in cfg:  # verl >= 0.8's spelling of the reward settings
        apply_reward_spelling(cfg)
    if resolve_auto_dtypes:
        resolve_precision(cfg)
    return cfg


def _parse_overrides(overrides: list[str]) -> list:
    """Parse the override strings with Hydra's own parser (one clear error line on bad syntax)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    result = []
    for text in overrides:
        try:
            result.extend(parser.parse_overrides([text]))
        except OverrideParseException as exc:
            raise ConfigError(
                f"cannot parse the override {text!r}: {_first_line(str(exc))}; write it as "
                "key=value, quote lists like 'trainer.logger=[console,file]'"
            ) from exc
    return result


def _check_override_keys(parsed: Iterable, base) -> None:
    """Reject overrides that change or delete a key the config does not have.

    Hydra would reject them too, but with a message that does not suggest the key the user
    meant; ``+key`` and ``++key`` (adding keys) and ``hydra.*`` keys are left to Hydra.
    """
    known = None
    for ov in parsed:
        key = ov.key_or_group
        if ov.is_add() or ov.is_force_add() or key == "hydra" or key.startswith("hydra."):
            continue
        if known is None:
            known = set(all_keys(base))
        if key in known:
            continue
        action = "delete" if ov.is_delete() else "set"
        raise ConfigError(unknown_key_message(key, known, action))


def unknown_key_message(key: str, known: Iterable[str], action: str = "set") -> str:
    """The one-line message for an unknown key, with the closest known key when there is one."""
    best = closest_key(key, known)
    if best:
        return f"unknown key '{key}'; did you mean '{best}'?"
    hint = f"to add a new key write '+{key}=...'" if action == "set" else "nothing to delete"
    return f"unknown key '{key}': the config has no such key; {hint}"


def closest_key(key: str, known: Iterable[str]) -> str | None:
    """The known key ``key`` most likely misspells, or None."""
    # a typo sits in one part of the path: compare keys of the same depth that differ in
    # exactly one part, by that part (whole-path similarity is dominated by the shared prefix)
    parts = key.split(".")
    best, best_score = None, 0.6 - 1e-9
    for cand in sorted(known):
        cparts = cand.split(".")
        diff = [i for i, (a, b) in enumerate(zip(parts, cparts)) if a != b]
        if len(cparts) != len(parts) or len(diff) != 1:
            continue
        score = difflib.SequenceMatcher(None, parts[diff[0]], cparts[diff[0]]).ratio()
        if score > best_score:
            best, best_score = cand, score
    return best


def all_keys(cfg, prefix: str = "") -> Iterable[str]:
    """Every dotted key path in ``cfg`` (inner nodes too), without resolving interpolations."""
    from omegaconf import DictConfig

    for name in cfg.keys():
        path = f"{prefix}{name}"
        yield path
        node = cfg._get_node(name)
        if isinstance(node, DictConfig) and not node._is_missing() and not node._is_none():
            yield from all_keys(node, path + ".")


def _first_line(text: str) -> str:
    return " ".join(line.strip() for line in str(text).strip().splitlines() if line.strip())


def _one_line(head: str, exc: BaseException) -> str:
    cause = exc.__cause__
    tail = f" ({_first_line(str(cause))})" if cause is not None and str(cause) not in head else ""
    return _first_line(head) + tail
