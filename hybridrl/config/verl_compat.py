"""verl's config keys that hybridrl's own config lacks, each with its one answer.

The keys of verl's PPO trainer config (main of 2026-01-29 and 0.9.1, flattened with their defaults in
``verl_keys_*.txt`` next to this file) are all known here: a key of ``ppo_trainer.yaml`` is supported
(or marked ``ignored`` / ``refused`` on its field, :mod:`hybridrl.config.typed`); every other one
matches a rule of :data:`RULES`, which says in one line either why it means nothing here (the key is
accepted, one note) or which feature it asks for that hybridrl lacks and what to use instead (a value
other than verl's default stops the run). A whole subtree (``*.megatron.*``) has one rule.

:func:`screen_overrides` applies the answers to a command line before Hydra composes it, so a verl
key never gets "unknown key"; :func:`answer_for` serves the typed config's check of a YAML file.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import logging
from importlib.resources import files
from typing import Any

from hybridrl.config.verl_rules import RULES, Answer
from hybridrl.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = [
    "Answer",
    "RULES",
    "KEY_FILES",
    "AT_DEFAULT",
    "answer_for",
    "check_verl_only",
    "verl_keys",
    "screen_overrides",
    "screen_ppo_overrides",
    "verl_values",
]

KEY_FILES = ("verl_keys_main_2026-01-29.txt", "verl_keys_0.9.1.txt")


def answer_for(key: str) -> Answer | None:
    """The answer of the first rule that matches ``key`` (a dotted key), or None."""
    for patterns, answer in RULES:
        if any(fnmatch.fnmatchcase(key, pattern) for pattern in patterns):
            return answer
    return None


@functools.cache
def verl_keys(name: str) -> dict[str, Any]:
    """``{dotted key: default}`` of one key list (a name in :data:`KEY_FILES`)."""
    out = {}
    for line in files("hybridrl.config").joinpath(name).read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, default = line.partition(" = ")
            out[key] = json.loads(default)
    return out


def _verl_defaults(key: str) -> list:
    return [keys[key] for keys in map(verl_keys, KEY_FILES) if key in keys]


def _is_default(key: str, value: Any) -> bool:
    """Whether ``value`` is verl's default of ``key`` (in one of the key lists), or an empty value."""
    defaults = _verl_defaults(key)
    return value in defaults or (not defaults and value in (None, False, 0, "", [], {}))


# the answer to a refused key at verl's default: it asks for nothing, so it runs without a note
AT_DEFAULT = Answer("ignored", "verl's default, which asks for nothing")


def packaged_keys() -> set[str]:
    """Every dotted key of the packaged ``ppo_trainer.yaml`` (inner nodes too)."""
    from hybridrl.config.defaults import packaged_defaults

    def walk(node: dict, prefix: str):
        for name, value in node.items():
            yield prefix + name
            if isinstance(value, dict):
                yield from walk(value, f"{prefix}{name}.")

    return set(walk(packaged_defaults(resolved=False), ""))


def screen_ppo_overrides(overrides: list[str], config_name: str, config_dir: str | None) -> list[str]:
    """:func:`screen_overrides` for a PPO run (``config_name`` ppo_trainer, or a user's config folder,
    whose config starts from ppo_trainer); other commands' overrides as they are."""
    if config_name != "ppo_trainer" and config_dir is None:
        return overrides
    return screen_overrides(verl_values(overrides), packaged_keys())


# verl values of a key hybridrl types more strictly, written as the value hybridrl reads the same way
_FALSE = ("false", "False")
_NULL = ("null", "~", "None", "none", "")


def verl_values(overrides: list[str]) -> list[str]:
    """``overrides`` with two of verl's loose values (its config is an untyped DictConfig) written as
    hybridrl's typed config reads them, each with a note in the log:

    - ``trainer.test_freq=False``: verl validates in the loop only when ``test_freq > 0`` (False is
      0), so no validation during training - hybridrl's ``-1``;
    - ``custom_reward_function.name=null`` with ``custom_reward_function.path`` null on the same
      command line: verl's ``get_custom_reward_fn`` returns before it reads the name (no file, the
      default scorers), so the override is dropped.
    """
    path_null = any(_split(text) in [("custom_reward_function.path", v) for v in _NULL] for text in overrides)
    out = []
    for text in overrides:
        key, value = _split(text)
        if key == "trainer.test_freq" and value in _FALSE:
            logger.warning("%s: verl validates only when test_freq > 0; trainer.test_freq=-1 (never)", text)
            out.append("trainer.test_freq=-1")
        elif key == "custom_reward_function.name" and value in _NULL and path_null:
            logger.warning(
                "%s is ignored: custom_reward_function.path is null, so no function is loaded (verl reads "
                "the name only with a path)",
                text,
            )
        else:
            out.append(text)
    return out


def _split(text: str) -> tuple[str, str | None]:
    """``key=value`` of a plain override (no ``+``/``~`` prefix), else ``(text, None)``."""
    key, eq, value = text.partition("=")
    return (key.strip(), value.strip().strip("'\"")) if eq else (text, None)


def refusal(key: str, value: Any, answer: Answer) -> str:
    """The one line that stops the run for a refused verl key."""
    return f"{key}={value!r}: {answer.text}"


def check_verl_only(key: str, value: Any) -> Answer | None:
    """The answer to a verl key ``key`` set to ``value`` that hybridrl's config lacks: None when no
    rule knows it; an ``ignored`` answer (for a refused key at verl's default too: it asks for nothing).

    Raises:
        ConfigError: a refused key set to another value than verl's default (one line: the key, the
            feature, what to use instead).
    """
    if isinstance(value, dict) and value:  # a subtree (from a YAML file): each of its keys answers
        answers = [check_verl_only(f"{key}.{sub}", sub_value) for sub, sub_value in value.items()]
        if None in answers:
            return None
        return next((a for a in answers if a is not AT_DEFAULT), AT_DEFAULT)
    answer = answer_for(key)
    if answer is None:
        return None
    if answer.kind == "refused":
        if not _is_default(key, value):
            raise ConfigError(refusal(key, value, answer))
        return AT_DEFAULT
    return answer


def screen_overrides(overrides: list[str], known_keys: set[str]) -> list[str]:
    """``overrides`` without those that set a verl key hybridrl's config lacks (``known_keys``) and
    that a rule answers: an ignored key is dropped with one note in the log, a refused one stops.

    Raises:
        ConfigError: a refused verl key set to a value other than verl's default.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    kept = []
    for text in overrides:
        try:
            (override,) = parser.parse_overrides([text])
        except OverrideParseException:  # a bad override is the loader's to report
            kept.append(text)
            continue
        key = override.key_or_group
        if key in known_keys or override.is_delete():
            kept.append(text)
            continue
        answer = check_verl_only(key, override.value())
        if answer is None:
            kept.append(text)
        elif answer is not AT_DEFAULT:
            logger.warning("%s is ignored: %s", text, answer.text)
    return kept
