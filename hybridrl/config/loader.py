"""Compose the trainer config from the packaged YAML and verl-style command-line overrides.

Hydra is imported inside the functions so that ``import hybridrl.config`` stays light.
"""

from __future__ import annotations

import difflib
from typing import Iterable

from hybridrl.config.precision import resolve_precision
from hybridrl.config.reward_spelling import apply_reward_spelling
from hybridrl.config.verl_compat import screen_ppo_overrides
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

    overrides = screen_ppo_overrides(list(overrides or []), config_name, config_dir)  # verl's keys: one answer each
    overrides = drop_group_choices(overrides)
    parsed = _parse_overrides(overrides)
    config_name = config_name[: -len(".yaml")] if config_name.endswith(".yaml") else config_name
    refuse_engine_config(config_name, "--config-name")
    extra = []
    if config_dir is not None:
        import os

        config_dir = os.path.abspath(os.path.expanduser(config_dir))
        if not os.path.isdir(config_dir):
            raise ConfigError(f"--config-path={config_dir}: no such folder; give the folder of {config_name}.yaml")
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
                raise ConfigError(_missing_config_message(config_name, config_dir, exc)) from exc
            except (HydraException, OmegaConfBaseException) as exc:
                # Hydra's message for an unknown key has no suggestion: compose without the
                # overrides (only on this error path) and name the closest known key.
                base = compose(config_name=config_name, overrides=extra)
                _check_override_keys(parsed, base)
                adds = _adds_of_present_keys(parsed, base)
                if not adds:
                    raise ConfigError(_one_line(f"config '{config_name}': {exc}", exc)) from exc
                # verl's `+key=value` adds a key verl's config lacks; where hybridrl's has it, it sets it
                overrides = [f"+{text}" if text in adds else text for text in overrides]
                try:
                    cfg = compose(config_name=config_name, overrides=extra + overrides)
                except (HydraException, OmegaConfBaseException) as again:
                    raise ConfigError(_one_line(f"config '{config_name}': {again}", again)) from again
    finally:
        GlobalHydra.instance().clear()
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as exc:
        raise ConfigError(_one_line(f"config '{config_name}': cannot resolve an interpolation: {exc}", exc)) from exc
    _check_mandatory_values(cfg, config_name)
    if "reward" in cfg:  # verl >= 0.8's spelling of the reward settings
        apply_reward_spelling(cfg)
    if resolve_auto_dtypes:
        resolve_precision(cfg)
    return cfg


# verl's trainer configs for engines hybridrl does not have (it trains with FSDP2): name -> engine
VERL_ENGINE_CONFIGS: dict[str, str] = {
    "ppo_megatron_trainer": "Megatron-LM",
    "_generated_ppo_megatron_trainer": "Megatron-LM",
    "ppo_torchtitan_trainer": "TorchTitan",
    "_generated_ppo_torchtitan_trainer": "TorchTitan",
    "ppo_veomni_trainer": "VeOmni",
    "_generated_ppo_veomni_trainer": "VeOmni",
}
# verl's config groups whose choice picks an implementation: choice -> None (hybridrl's, FSDP2) or
# the engine hybridrl does not have
_FSDP = {"fsdp": None, "fsdp2": None, "dp": None}
_OTHERS = {"megatron": "Megatron-LM", "veomni": "VeOmni", "torchtitan": "TorchTitan", "mindspeed": "MindSpeed"}
VERL_GROUP_CHOICES: dict[str, dict[str, str | None]] = {
    "engine": {**_FSDP, **_OTHERS},
    "optim": {**_FSDP, **_OTHERS},
    "model_engine": {**_FSDP, **_OTHERS},
}
# verl's names of its own config folder (``--config-path=config`` is verl/trainer/config, next to
# verl's main_ppo.py): hybridrl's packaged configs take its place
VERL_CONFIG_DIRS = ("config", "verl/trainer/config")
_FLAGS = {"--config-path": "config_path", "-cp": "config_path", "--config-name": "config_name", "-cn": "config_name"}


def split_config_flags(argv: list[str]) -> tuple[list[str], str | None, str | None]:
    """verl's Hydra flags taken out of a command line: ``(overrides, config_path, config_name)``.

    ``--config-path DIR`` / ``--config-path=DIR`` / ``-cp DIR`` and ``--config-name NAME`` /
    ``--config-name=NAME`` / ``-cn NAME``, as ``python -m verl.trainer.main_ppo`` takes them; every
    other argument is a ``key=value`` override. None for a flag that is not given.

    Raises:
        ConfigError: a flag without its value, given twice, or another ``-`` option.
    """
    found: dict[str, str] = {}
    overrides: list[str] = []
    args = iter(argv)
    for arg in args:
        if not arg.startswith("-"):
            overrides.append(arg)
            continue
        flag, eq, value = arg.partition("=")
        if flag not in _FLAGS:
            raise ConfigError(
                f"{arg}: not an option of this command; it takes key=value overrides and verl's "
                "--config-path DIR / --config-name NAME"
            )
        if not eq:
            value = next(args, "")
        if not value or value.startswith("-"):
            raise ConfigError(f"{flag} needs a value, e.g. {flag}={'config' if 'path' in flag else 'ppo_trainer'}")
        name = _FLAGS[flag]
        if name in found:
            raise ConfigError(f"{flag} is given twice ({found[name]!r} and {value!r}); keep one")
        found[name] = value
    return overrides, found.get("config_path"), found.get("config_name")


def resolve_config_path(config_path: str | None) -> str | None:
    """The folder ``--config-path`` names, or None for hybridrl's packaged configs.

    A relative path is taken from the current directory when that folder exists. Otherwise
    ``config`` (also ``./config``, ``verl/trainer/config``), which verl resolves next to its own
    ``main_ppo.py``, is verl's config folder, whose place hybridrl's packaged configs take.

    Raises:
        ConfigError: any other folder that does not exist.
    """
    import os

    if config_path is None:
        return None
    path = os.path.expanduser(config_path)
    if os.path.isdir(path):
        return os.path.abspath(path)
    if not os.path.isabs(path) and os.path.normpath(path).replace(os.sep, "/") in VERL_CONFIG_DIRS:
        return None
    raise ConfigError(
        f"--config-path={config_path}: no such folder (a relative path is taken from {os.getcwd()}); "
        "give the folder of your --config-name yaml, or leave it out for the packaged configs"
    )


def refuse_engine_config(name: str, where: str) -> None:
    """One line for verl's trainer config of an engine hybridrl does not have (``ppo_megatron_trainer``, ...)."""
    engine = VERL_ENGINE_CONFIGS.get(name)
    if engine:
        raise ConfigError(
            f"{where}={name}: the {engine} engine (verl's {name}.yaml) is not in hybridrl; "
            "it trains with FSDP2 - use ppo_trainer (the default) and its fsdp keys"
        )


def _missing_config_message(config_name: str, config_dir: str | None, exc) -> str:
    """The one line for Hydra's MissingConfigException: the primary file, or a name in its ``defaults:``."""
    missing = str(getattr(exc, "missing_cfg_file", "") or "")
    missing = missing[: -len(".yaml")] if missing.endswith(".yaml") else missing
    primary = str(exc).startswith("Cannot find primary config") or missing == config_name
    if primary:
        where = f"{config_dir} nor in hybridrl/config" if config_dir else "hybridrl/config"
        return f"config '{config_name}.yaml' is not in {where}; check --config-name and --config-path"
    refuse_engine_config(missing, f"{config_name}.yaml: defaults")
    return (
        f"{config_name}.yaml (in {config_dir or 'hybridrl/config'}): its defaults list names '{missing}', which is "
        "neither beside it nor a packaged hybridrl config (ppo_trainer, sft_trainer, ...); fix the defaults entry"
    )


def drop_group_choices(overrides: list[str]) -> list[str]:
    """``overrides`` without verl's config-group choices of the implementation hybridrl has
    (``engine=fsdp``, ``optim=fsdp``, ``model_engine=dp``: verl picks a YAML file of that group);
    a choice of an engine hybridrl does not have is one line.

    Raises:
        ConfigError: ``engine=megatron`` and the like.
    """
    kept = []
    for text in overrides:
        group, eq, choice = text.partition("=")
        choices = VERL_GROUP_CHOICES.get(group.lstrip("+"))
        if not eq or choices is None or choice.strip("'\"") not in choices:
            kept.append(text)
            continue
        engine = choices[choice.strip("'\"")]
        if engine is not None:
            raise ConfigError(
                f"{text}: the {engine} engine is not in hybridrl; it trains with FSDP2 - "
                f"drop {group}={choice} and the {engine} keys"
            )
    return kept


def _adds_of_present_keys(parsed: Iterable, base) -> set[str]:
    """The ``+key=value`` overrides (as typed) whose key ``base`` already has."""
    known = None
    found = set()
    for ov in parsed:
        if not ov.is_add() or ov.is_force_add() or ov.key_or_group.startswith("hydra"):
            continue
        if known is None:
            known = set(all_keys(base))
        if ov.key_or_group in known:
            found.add(ov.input_line)
    return found


def _check_mandatory_values(cfg, config_name: str) -> None:
    """A ``???`` value (verl's ``rollout.name: ???``) left unset is one line naming the key."""
    from omegaconf import OmegaConf

    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        more = f" (and {', '.join(missing[1:])})" if len(missing) > 1 else ""
        raise ConfigError(
            f"{missing[0]} has no value ('???' in {config_name}.yaml means it must be given){more}; "
            f"set it on the command line: {missing[0]}=..."
        )


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
    best, best_score = None, 0.0
    for cand in sorted(known):
        cparts = cand.split(".")
        diff = [i for i, (a, b) in enumerate(zip(parts, cparts)) if a != b]
        if len(cparts) != len(parts) or len(diff) != 1:
            continue
        score = name_similarity(parts[diff[0]], cparts[diff[0]])
        if score > best_score:
            best, best_score = cand, score
    return best


def name_similarity(name: str, other: str) -> float:
    """How likely ``name`` misspells ``other``: 0 not at all; higher is likelier.

    The words (``_``-separated) both names share at their start and end do not count: a typo
    changes a word, a different feature has different words with the same ending
    (``expert_parallel_size`` is not ``tensor_model_parallel_size``, whose shared
    ``_parallel_size`` made them look alike). Those differing words must be at least 0.6 alike,
    and such a typo (score 1.6-2.0) ranks above a name that only lacks or adds whole words
    (``micro_batch_size`` / ``ppo_micro_batch_size``), which is compared whole and needs 0.8
    (score 0.8-1.0): ``clip_ratio_lo`` means ``clip_ratio_low``, not ``clip_ratio``. Names that
    share their leading words and differ in a short ending no word of which is alike (``pass_at``
    / ``pass_k``) are compared whole too, and need 0.75.
    """
    words, owords = name.split("_"), other.split("_")
    start = 0
    while start < min(len(words), len(owords)) and words[start] == owords[start]:
        start += 1
    end = 0
    while end < min(len(words), len(owords)) - start and words[-1 - end] == owords[-1 - end]:
        end += 1
    rest, orest = "_".join(words[start : len(words) - end]), "_".join(owords[start : len(owords) - end])
    if rest and orest:
        score = difflib.SequenceMatcher(None, rest, orest).ratio()
        if score >= 0.6 - 1e-9:
            return 1.0 + score
        if not start:  # nothing shared up front: another feature's name
            return 0.0
    # the same leading words (the feature's name) and a short ending mistyped (pass_at / pass_k),
    # or whole words added or dropped: compared whole
    score = difflib.SequenceMatcher(None, name, other).ratio()
    return score if score >= (0.8 if not rest or not orest else 0.75) - 1e-9 else 0.0


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
