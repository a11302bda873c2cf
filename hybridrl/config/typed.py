"""Typed config sections: a YAML section becomes a dataclass (verl's ``omega_conf_to_dataclass``).

Each component owns the dataclass of its section (``hybridrl.algorithms.config.AlgoConfig`` for
``algorithm``, ...), with defaults equal to the packaged YAML and its single-field rules in
``__post_init__``. :func:`to_dataclass` builds one with OmegaConf's structured configs, so an
unknown key or a value of the wrong type is refused before any rule runs. Nested dataclass fields
are nested sections. Code reads the typed fields, never ``.get(key, default)``.

verl keys that are accepted but mean nothing in this build carry their reason as field metadata
(:func:`ignored`), keys of features this build lacks carry the feature (:func:`refused`);
:func:`marked_keys` lists them by dotted key for the start-up check and its notes.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import pickle
import typing
from typing import Any, Literal, TypeVar

from hybridrl.config.loader import all_keys, closest_key
from hybridrl.errors import ConfigError

T = TypeVar("T")
logger = logging.getLogger(__name__)

__all__ = ["to_dataclass", "to_structured", "ignored", "refused", "marked_keys", "IGNORED", "REFUSED"]

IGNORED = "ignored"  # field metadata: (why the key means nothing here, when: always | single | hf)
REFUSED = "refused"  # field metadata: the feature the key asks for, which this build does not have

When = Literal["always", "single", "hf", "cpu"]


def same_as(interpolation: str) -> Any:
    """The default of a field that copies another key (an OmegaConf ``${...}`` interpolation,
    resolved when the config is composed): typed ``Any`` so that a field of another type may hold
    the string until then."""
    return interpolation


def ignored(
    default=dataclasses.MISSING,
    reason: str = "",
    when: When = "always",
    *,
    factory=dataclasses.MISSING,
    subkeys: dict | None = None,
):
    """A field kept so verl command lines run; a value other than its default prints ``reason``
    once at start-up. ``when``: ``single`` notes it only with one worker (FSDP keys), ``hf`` only
    when the section's engine is the HF one (vLLM keys), ``cpu`` only when the run computes on
    the CPU (offload keys). ``subkeys`` (for a free-form mapping
    field): ``{"a.b": (reason, when)}`` for keys inside it, instead of the field itself."""
    marks = {sub: tuple(mark) for sub, mark in subkeys.items()} if subkeys else (reason, when)
    return _marked_field(IGNORED, marks, default, factory)


def refused(
    default=dataclasses.MISSING, feature: str = "", *, factory=dataclasses.MISSING, subkeys: dict | None = None
):
    """A field for a verl feature this build does not have: any value but ``default`` stops the
    run. ``subkeys`` (for a nested section): ``{"key": feature}`` for keys inside it."""
    return _marked_field(REFUSED, dict(subkeys) if subkeys else feature, default, factory)


def _marked_field(mark: str, value, default, factory):
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata={mark: value})
    return dataclasses.field(default=default, metadata={mark: value})


def marked_keys(cls: type, mark: str, prefix: str = "") -> dict[str, Any]:
    """``{dotted key: metadata}`` of every field of ``cls`` (nested sections included) marked with
    ``mark`` (:data:`IGNORED` or :data:`REFUSED`). A nested section whose default is an
    interpolation (``${...}``) copies another section, whose own keys carry the marks."""
    out = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        if mark in f.metadata:
            marks = f.metadata[mark]
            if isinstance(marks, dict):
                out.update({f"{key}.{sub}": value for sub, value in marks.items()})
            else:
                out[key] = marks
        copies = isinstance(f.default, str) and f.default.startswith("${")
        if dataclasses.is_dataclass(hints[f.name]) and not copies:
            out.update(marked_keys(hints[f.name], mark, key + "."))
    return out


def to_dataclass(cls: type[T], section: Any, prefix: str, prepare=None) -> T:
    """``section`` (a DictConfig, a mapping, or None for all defaults) as a ``cls`` instance.

    Args:
        cls: a dataclass whose fields are the section's keys (nested dataclasses for subsections).
        section: the config section; keys it lacks take the dataclass defaults.
        prefix: the section's key path, for messages (``"algorithm"``; ``""`` for a whole config).
        prepare: called with the merged DictConfig before the dataclasses are built (verl's two
            spellings of a key made one, :func:`hybridrl.config.rules.two_spellings`).

    Raises:
        ConfigError: a key the dataclass has no field for, or a value OmegaConf cannot convert
            to the field's type (one line naming ``prefix.key``). The rules of ``__post_init__``
            raise their own errors.
    """
    from omegaconf import OmegaConf

    merged = _merged(cls, section, prefix)
    if prepare is not None:
        prepare(merged)
    return OmegaConf.to_object(merged)


def to_structured(cls: type, section: Any, prefix: str, prepare=None):
    """``section`` typed as ``cls`` and kept a structured DictConfig, as a run reads it: every key
    present and typed, interpolations resolved, the ``__post_init__`` rules checked (raises as
    :func:`to_dataclass`). Faster than ``OmegaConf.structured(to_dataclass(...))``, the same result."""
    from omegaconf import OmegaConf

    merged = _merged(cls, section, prefix)
    if prepare is not None:
        prepare(merged)
    OmegaConf.to_object(merged)  # builds the dataclasses, so their rules run
    OmegaConf.resolve(merged)
    return merged


@functools.cache
def _schema(cls: type):
    """The structured config of ``cls`` (built once: merging copies it, never changes it)."""
    from omegaconf import OmegaConf

    return OmegaConf.structured(cls)


@functools.cache
def _schema_bytes(cls: type) -> bytes | None:
    """:func:`_schema` pickled, or None when it does not pickle (a class defined in a function)."""
    try:
        return pickle.dumps(_schema(cls), protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError):
        return None


def _schema_copy(cls: type):
    """A fresh copy of :func:`_schema`: unpickled, ~20x faster than the deep copy
    ``OmegaConf.merge`` makes of its first config (a PPO config's schema: 2 ms instead of 45)."""
    data = _schema_bytes(cls)
    return copy.deepcopy(_schema(cls)) if data is None else pickle.loads(data)


def _merge_into_schema(cls: type, section: Any):
    """``OmegaConf.merge(_schema(cls), section)``, the schema copied by :func:`_schema_copy`."""
    from omegaconf import OmegaConf, flag_override

    target = _schema_copy(cls)
    with flag_override(target, "readonly", False):
        target.merge_with(section)
        turned_readonly = target._get_flag("readonly") is True
    if turned_readonly:
        OmegaConf.set_readonly(target, True)
    return target


def _merged(cls: type, section: Any, prefix: str):
    from omegaconf.errors import ConfigKeyError, ValidationError

    for _ in range(_MAX_VERL_KEYS):
        try:
            return _merge_into_schema(cls, section if section is not None else {})
        except ConfigKeyError as exc:
            key = f"{prefix}.{exc.full_key}" if prefix else str(exc.full_key)
            section = _without_verl_key(section, str(exc.full_key), key)
            if section is None:
                _unknown_key(cls, prefix, exc)
        except ValidationError as exc:
            bad = f"{prefix}.{exc.full_key}" if prefix else exc.full_key
            reason = str(exc).splitlines()[0]
            raise ConfigError(f"{bad}: {reason}; set a value of the type in the packaged YAML") from None
    raise ConfigError(f"{prefix or 'the config'}: more than {_MAX_VERL_KEYS} of verl's keys this build lacks")


_MAX_VERL_KEYS = 1000


def _without_verl_key(section, key: str, full_key: str):
    """``section`` without ``key`` when it is one of verl's keys that hybridrl's config lacks and
    answers as ignored (noted in the log); None when no rule knows it.

    Raises:
        ConfigError: a refused verl key set to another value than verl's default.
    """
    from omegaconf import DictConfig, OmegaConf, open_dict

    from hybridrl.config.verl_compat import AT_DEFAULT, check_verl_only

    if not isinstance(section, DictConfig):
        section = OmegaConf.create(section)
    value = OmegaConf.select(section, key, throw_on_missing=False)
    value = OmegaConf.to_container(value, resolve=False) if isinstance(value, DictConfig) else value
    answer = check_verl_only(full_key, value)
    if answer is None:
        return None
    if answer is not AT_DEFAULT:
        logger.warning("%s is ignored: %s", full_key, answer.text)
    section = copy.deepcopy(section)
    parent, _, name = key.rpartition(".")
    node = OmegaConf.select(section, parent) if parent else section
    with open_dict(node):
        del node[name]
    return section


def _unknown_key(cls: type, prefix: str, exc) -> None:
    key = f"{prefix}.{exc.full_key}" if prefix else exc.full_key
    where = prefix or "this command's config"
    close = closest_key(exc.full_key, all_keys(_schema(cls)))
    fix = (
        f"did you mean '{prefix + '.' if prefix else ''}{close}'?"
        if close
        else "remove it (hybridrl config --show lists the keys)"
    )
    raise ConfigError(f"{key} is not a key of {where}; {fix}") from None


def _default(f: dataclasses.Field):
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _changed(value, f: dataclasses.Field) -> bool:
    """Whether ``value`` differs from the field's default (a ``${...}`` default copies another key)."""
    default = _default(f)
    return not (isinstance(default, str) and default.startswith("${")) and value != default


def ignored_notes(config, prefix: str = "") -> list[str]:
    """``"<key>=<value> is ignored: <reason>"`` for each :func:`ignored` field set to a value other
    than its default, nested sections included."""
    notes = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            notes += ignored_notes(value, f"{prefix}{f.name}.")
        elif IGNORED in f.metadata and _changed(value, f):
            reason, _ = f.metadata[IGNORED]
            notes.append(f"{prefix}{f.name}={value!r} is ignored: {reason}")
    return notes


def refused_errors(config, prefix: str = "", command: str = "hybridrl sft") -> list[str]:
    """One line for each :func:`refused` field (or refused key inside a section) set to a value
    other than its default: the key, its value and the feature ``command`` does not have."""
    errors = []
    for f in dataclasses.fields(config):
        value, key = getattr(config, f.name), f"{prefix}{f.name}"
        marks = f.metadata.get(REFUSED)
        if isinstance(marks, dict):  # refused keys inside a section
            defaults = _default(f)
            for sub, feature in marks.items():
                if getattr(value, sub) != getattr(defaults, sub):
                    errors.append(_refusal(f"{key}.{sub}", getattr(value, sub), feature, command))
        elif marks is not None and _changed(value, f):
            errors.append(_refusal(key, value, marks, command))
        elif dataclasses.is_dataclass(value):
            errors += refused_errors(value, f"{key}.", command)
    return errors


def _refusal(key: str, value, feature: str, command: str) -> str:
    return f"{key}={value!r} asks for {feature}, which {command} does not have; remove {key}"
