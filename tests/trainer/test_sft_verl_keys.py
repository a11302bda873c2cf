"""Every key of verl's SFT configs (tests/trainer/verl_sft_keys.json: verl main's fsdp_sft_trainer
and engine SFT trainer, verl 0.9.1's engine SFT trainer) gets one of three answers from
``hybridrl sft``: supported, ignored (a start-up note says why) or refused (one error line naming
the feature). verl's two spellings of one setting both work; set differently, they are one error."""

import copy
import dataclasses
import functools
import json
import os
import typing

import pytest
from omegaconf import OmegaConf

from hybridrl.config import ConfigError, load_config
from hybridrl.config.typed import IGNORED, REFUSED, marked_keys, to_dataclass
from hybridrl.trainer.jobs.supervised_config import SFTConfig, ignored_notes, sft_config

with open(os.path.join(os.path.dirname(__file__), "verl_sft_keys.json")) as f:
    SOURCES = json.load(f)["sources"]
VERL_KEYS = sorted({key for source in SOURCES for key in source["keys"]})
DEFAULTS = {key: value for source in SOURCES for key, value in source["keys"].items()}
IGNORED_KEYS = marked_keys(SFTConfig, IGNORED)
REFUSED_KEYS = marked_keys(SFTConfig, REFUSED)


def _marked(key: str, marks: dict) -> str | None:
    """The marked key that answers for ``key``: itself or the free-form section holding it."""
    parts = key.split(".")
    return next((k for k in (".".join(parts[:i]) for i in range(len(parts), 0, -1)) if k in marks), None)


def _is_field(cls, key: str) -> bool:
    """Whether ``key`` is a field of ``cls`` (or inside a free-form mapping field)."""
    for i, part in enumerate(parts := key.split(".")):
        hints = typing.get_type_hints(cls)
        if part not in hints:
            return False
        if not dataclasses.is_dataclass(hints[part]):
            return i == len(parts) - 1 or typing.get_origin(hints[part]) is dict
        cls = hints[part]
    return False


def answer(key: str) -> str | None:
    if _marked(key, REFUSED_KEYS):
        return "refused"
    if _marked(key, IGNORED_KEYS):
        return "ignored"
    return "supported" if _is_field(SFTConfig, key) else None


def test_the_key_list_names_its_sources():
    assert {(s["source"], s["config"]) for s in SOURCES} == {
        ("verl main b178a3cd (2026-01-29)", "sft_trainer.yaml"),
        ("verl main b178a3cd (2026-01-29)", "sft_trainer_engine.yaml"),
        ("verl 0.9.1 (PyPI wheel)", "sft_trainer_engine.yaml"),
    }
    assert len(VERL_KEYS) > 190 and "optim.lr_scheduler_type" in VERL_KEYS and "data.messages_key" in VERL_KEYS


def test_every_verl_sft_key_has_an_answer():
    unanswered = [key for key in VERL_KEYS if answer(key) is None]
    assert unanswered == []
    # and the packaged config accepts every one on the command line (Hydra refuses unknown keys)
    composed = load_config([], config_name="sft_trainer", resolve_auto_dtypes=False)
    from omegaconf import OmegaConf

    assert [k for k in VERL_KEYS if OmegaConf.select(composed, k, default="<absent>") == "<absent>"] == []


def _other(key: str, value):
    """A value of the key's type that is not ``value``."""
    choices = {"data.pad_mode": "right", "engine.strategy": "fsdp2"}
    if key in choices:
        return choices[key]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 3
    if isinstance(value, float):
        return value * 2 + 1
    if isinstance(value, list):
        return [] if value else [0]
    if isinstance(value, dict):
        return {}
    return "other"


def _nested(key: str, value) -> dict:
    out: dict = {}
    node = out
    *head, last = key.split(".")
    for part in head:
        node = node.setdefault(part, {})
    node[last] = value
    return out


def _set(key: str) -> dict:
    """``key`` set to another value than its packaged default (the value of a verl key inside a free-form
    mapping field changes that field)."""
    node, owner, part = SFTConfig(), None, ""
    for part in key.split("."):
        owner, node = node, node[part] if isinstance(node, dict) else getattr(node, part)
    if node is None and dataclasses.is_dataclass(owner):
        kinds = typing.get_args(typing.get_type_hints(type(owner))[part])
        if int in kinds:
            return _nested(key, 3)
        if dict in [typing.get_origin(kind) for kind in kinds]:
            return _nested(key, {"eps": 1e-6})
    return _nested(key, _other(key, node))


def _merge(into: dict, update: dict) -> dict:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
    return into


def test_every_ignored_key_is_noted_with_its_reason_when_set():
    keys = [k for k in VERL_KEYS if answer(k) == "ignored" and not str(DEFAULTS[k]).startswith("${")]
    overrides: dict = {}
    for key in keys:
        _merge(overrides, _set(key))
    notes = ignored_notes(to_dataclass(SFTConfig, overrides, ""))
    for key in keys:
        marked = _marked(key, IGNORED_KEYS)
        reason, _ = IGNORED_KEYS[marked]
        assert [n for n in notes if n.startswith(f"{marked}=") and n.endswith(f"is ignored: {reason}")], key
    assert len(keys) > 100


@pytest.mark.parametrize("key", [k for k in VERL_KEYS if answer(k) == "refused"])
def test_a_refused_key_stops_the_run_naming_the_feature(key):
    feature = REFUSED_KEYS[_marked(key, REFUSED_KEYS)]
    with pytest.raises(ConfigError) as err:
        to_dataclass(SFTConfig, _set(key), "")
    assert f"{key}=" in str(err.value) and feature in str(err.value) and "\n" not in str(err.value)
    assert to_dataclass(SFTConfig, _nested(key, DEFAULTS.get(key)), "") is not None  # verl's default is fine


@functools.cache
def _composed_sft_trainer():
    """The packaged sft_trainer config, composed once (tests set keys on copies)."""
    return load_config([], config_name="sft_trainer", resolve_auto_dtypes=False)


def _composed(*overrides):
    """The sft_trainer config with ``key=value`` overrides set on a copy of the composed config (none
    of these keys is read by an interpolation; test_overrides_set_are_the_command_lines checks that
    this equals composing the command line)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    config = copy.deepcopy(_composed_sft_trainer())
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        OmegaConf.update(config, override.key_or_group, override.value(), merge=False)
    return config


def _typed(*overrides):
    """``hybridrl sft``'s typed config for ``key=value`` overrides."""
    return sft_config(_composed(*overrides))


@pytest.mark.parametrize(
    "overrides",
    [
        ("optim.warmup_steps_ratio=0.05", "optim.lr_warmup_steps_ratio=0.05", "model.partial_pretrain=/m/old"),
        ("data.multiturn.enable=true", "data.multiturn.messages_key=conversation", "engine.dtype=float32"),
    ],
)
def test_overrides_set_are_the_command_lines(overrides):
    command_line = load_config(list(overrides), config_name="sft_trainer", resolve_auto_dtypes=False)
    assert _composed(*overrides) == command_line != _composed()
    assert _typed(*overrides) == sft_config(command_line)


# (older spelling, its value, current spelling, its value, where the run reads it)
SPELLINGS = [
    ("optim.warmup_steps_ratio", 0.05, "optim.lr_warmup_steps_ratio", 0.2, "optim.warmup_steps_ratio"),
    ("optim.lr_scheduler", "constant", "optim.lr_scheduler_type", "wsd", "optim.lr_scheduler"),
    ("optim.warmup_style", "constant", "optim.lr_scheduler_type", "cosine", "optim.lr_scheduler"),
    ("data.multiturn.tools_key", "t1", "data.tools_key", "t2", "data.multiturn.tools_key"),
    (
        "data.multiturn.enable_thinking_key",
        "e1",
        "data.enable_thinking_key",
        "e2",
        "data.multiturn.enable_thinking_key",
    ),
    ("model.partial_pretrain", "/m/old", "model.path", "/m/new", "model.partial_pretrain"),
    ("data.chat_template", "A", "model.custom_chat_template", "B", "data.chat_template"),
    ("model.fsdp_config.model_dtype", "bf16", "engine.model_dtype", "fp16", "model.fsdp_config.model_dtype"),
]


def _read(config, key):
    for part in key.split("."):
        config = getattr(config, part)
    return config


@pytest.mark.parametrize("old, old_value, new, new_value, read", SPELLINGS)
def test_both_spellings_work_and_disagreeing_is_one_error(old, old_value, new, new_value, read):
    assert _read(_typed(f"{old}={old_value}"), read) == old_value
    assert _read(_typed(f"{new}={new_value}"), read) == new_value
    assert _read(_typed(f"{old}={new_value}", f"{new}={new_value}"), read) == new_value
    with pytest.raises(ConfigError) as err:
        _typed(f"{old}={old_value}", f"{new}={new_value}")
    message = str(err.value)
    assert f"{old}={old_value!r}" in message and f"{new}={new_value!r}" in message and "two spellings" in message
    assert "\n" not in message


def test_messages_key_turns_on_multi_turn_rows():
    data = _typed("data.messages_key=conversation").data
    assert data.multiturn.enable and data.multiturn.messages_key == "conversation"
    old = _typed("data.multiturn.enable=true", "data.multiturn.messages_key=conversation").data
    assert old.multiturn.enable and old.multiturn.messages_key == "conversation"
    with pytest.raises(ConfigError, match="data.multiturn.messages_key='chat' and data.messages_key='conversation'"):
        _typed("data.multiturn.enable=true", "data.multiturn.messages_key=chat", "data.messages_key=conversation")
    # without multiturn.enable the older key is off in verl too: no clash
    assert _typed("data.multiturn.messages_key=chat", "data.messages_key=c").data.multiturn.messages_key == "c"


def test_verl_engine_schedule_keys_and_dtype():
    optim = _typed("optim.lr_scheduler_type=cosine", "optim.min_lr_ratio=0.1", "optim.lr_warmup_steps=5").optim
    assert (optim.lr_scheduler, optim.min_lr_ratio, optim.lr_warmup_steps) == ("cosine", 0.1, 5)
    assert _typed().optim.lr_scheduler == "cosine"  # the fsdp_sft_trainer default (verl's engine one is constant)
    assert _typed("engine.dtype=float32").model.fsdp_config.mixed_precision.param_dtype == "fp32"
    assert _typed("engine.dtype=bfloat16").model.fsdp_config.mixed_precision.param_dtype == "bf16"
    with pytest.raises(ConfigError, match="engine.dtype='float16' asks for fp16 mixed precision"):
        _typed("engine.dtype=float16")
    with pytest.raises(ConfigError, match="optim.lr_scheduler_type='linear'|optim.lr_scheduler='linear'"):
        _typed("optim.lr_scheduler_type=linear")
