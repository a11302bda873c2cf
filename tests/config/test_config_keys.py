"""validate_ppo_config: registered names, sampling temperature, rollout engines, ignored and
not-yet-supported keys."""

import copy
import functools
import sys
import types

import pytest
from omegaconf import OmegaConf

from hybridrl.config import ConfigError, load_config
from hybridrl.config.defaults import packaged_defaults
from hybridrl.trainer.ppo import config_check as schema
from hybridrl.trainer.ppo.config import typed_ppo_config
from hybridrl.trainer.ppo.config_check import validate_ppo_config

A = "actor_rollout_ref.actor"
R = "actor_rollout_ref.rollout"
BASE = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=8",
    f"{A}.ppo_mini_batch_size=4",
    f"{A}.ppo_micro_batch_size_per_gpu=2",
    f"{R}.n=2",
]


@pytest.fixture(scope="module")
def base_cfg():
    """A small valid GRPO config: 8 prompts x 2 responses, mini batch 4, micro batch 2."""
    return load_config(BASE)


def with_keys(base, changes: dict):
    """Copy of ``base`` with dotted keys set (interpolations are not re-resolved)."""
    cfg = copy.deepcopy(base)
    for key, value in changes.items():
        OmegaConf.update(cfg, key, value, merge=False)
    return cfg


def error_of(cfg) -> str:
    with pytest.raises(ConfigError) as err:
        validate_ppo_config(cfg)
    msg = str(err.value)
    assert "\n" not in msg
    return msg


# ---------------------------------------------------------------- registered names


@pytest.mark.parametrize(
    "switch, key", [(f"{A}.use_kl_loss", f"{A}.kl_loss_type"), ("algorithm.use_kl_in_reward", "algorithm.kl_penalty")]
)
def test_kl_type_is_checked_only_when_kl_is_on(base_cfg, switch, key):
    off = with_keys(base_cfg, {switch: False, key: "k9"})
    assert validate_ppo_config(off) == []  # not used, not checked
    msg = error_of(with_keys(base_cfg, {switch: True, key: "k9"}))
    assert f"{key}='k9' is unknown" in msg
    for name in ("kl", "abs", "mse", "low_var_kl"):
        assert name in msg
    assert "register_kl_penalty" in msg
    validate_ppo_config(with_keys(base_cfg, {switch: True, key: "k3"}))  # an alias of low_var_kl


@pytest.mark.parametrize(
    "key, bad, known, register",
    [
        (f"{A}.policy_loss.loss_mode", "vanila", "vanilla", "register_policy_loss"),
        ("reward_model.reward_manager", "naiive", "naive", "register_reward_manager"),
        (f"{R}.name", "vllmm", "sglang_async", "register_rollout"),
    ],
)
def test_unregistered_names(base_cfg, key, bad, known, register):
    msg = error_of(with_keys(base_cfg, {key: bad}))
    assert f"{key}={bad!r} is unknown" in msg and known in msg and register in msg


def test_non_string_name_is_one_clean_error(base_cfg):
    msg = error_of(with_keys(base_cfg, {f"{A}.policy_loss.loss_mode": ["vanilla"]}))
    assert f"{A}.policy_loss.loss_mode: Cannot convert 'ListConfig' to string" in msg and "\n" not in msg


def test_every_logger_entry_is_checked(base_cfg):
    msg = error_of(with_keys(base_cfg, {"trainer.logger": ["console", "clearml"]}))
    assert "trainer.logger=['console', 'clearml']" in msg and "'clearml' is unknown" in msg
    for name in ("console", "file", "tensorboard", "wandb", "mlflow", "swanlab"):
        assert name in msg
    msg = error_of(with_keys(base_cfg, {"trainer.logger": "clearml"}))  # verl also takes one name
    assert "trainer.logger='clearml'" in msg
    validate_ppo_config(with_keys(base_cfg, {"trainer.logger": ["console", "wandb", "swanlab"]}))
    validate_ppo_config(with_keys(base_cfg, {"trainer.logger": "file"}))


def test_choices_come_from_the_modules_that_implement_them(base_cfg, monkeypatch):
    """One list per concept: a mode added to the implementing module is accepted by the check."""
    import hybridrl.algorithms.functional as functional
    import hybridrl.data.config as data_config

    assert not hasattr(schema, "LOSS_AGG_MODES")
    cfg = with_keys(base_cfg, {f"{A}.loss_agg_mode": "seq-sum"})
    assert "loss_agg_mode='seq-sum' is not one of" in error_of(cfg)
    monkeypatch.setattr(functional, "LOSS_AGG_MODES", functional.LOSS_AGG_MODES + ("seq-sum",))
    validate_ppo_config(cfg)
    cfg = with_keys(cfg, {"data.truncation": "head"})  # the data section's list, checked when typed
    assert "data.truncation='head' is not one of error, left, right, middle" in error_of(cfg)
    monkeypatch.setattr(data_config, "TRUNCATIONS", data_config.TRUNCATIONS + ("head",))
    validate_ppo_config(cfg)


def test_strategy_and_mode_choices(base_cfg):
    assert f"{A}.strategy='megatron' is not one of fsdp, fsdp2" in error_of(
        with_keys(base_cfg, {f"{A}.strategy": "megatron"})
    )
    assert f"{R}.mode='fast' is not one of sync, async" in error_of(with_keys(base_cfg, {f"{R}.mode": "fast"}))


# ---------------------------------------------------------------- sampling temperature


@pytest.mark.parametrize("bad", [0, 0.0, -0.5])
def test_training_temperature_must_be_positive(base_cfg, bad):
    msg = error_of(with_keys(base_cfg, {f"{R}.temperature": bad}))
    assert f"{R}.temperature={float(bad)!r} must be a number > 0" in msg  # typed: a float
    assert f"{R}.val_kwargs.temperature=0" in msg  # where greedy decoding goes


def test_a_temperature_that_is_not_a_number_is_refused_by_its_type(base_cfg):
    msg = error_of(with_keys(base_cfg, {f"{R}.temperature": True}))
    assert msg.startswith(f"{R}.temperature: Value 'True' of type 'bool' could not be converted to Float")


def test_validation_may_be_greedy_but_not_negative(base_cfg):
    validate_ppo_config(with_keys(base_cfg, {f"{R}.val_kwargs.temperature": 0, f"{R}.temperature": 0.7}))
    msg = error_of(with_keys(base_cfg, {f"{R}.val_kwargs.temperature": -1}))
    assert f"{R}.val_kwargs.temperature=-1.0 must be a number >= 0" in msg


# ---------------------------------------------------------------- rollout engines


@pytest.mark.parametrize("name, display", [("sglang", "SGLang"), ("sglang_async", "SGLang")])
def test_optional_engine_note_even_when_the_package_is_installed(base_cfg, monkeypatch, name, display):
    monkeypatch.setitem(sys.modules, display.lower(), types.ModuleType(display.lower()))  # "installed"
    notes = validate_ppo_config(with_keys(base_cfg, {f"{R}.name": name}))
    assert notes == [f"{R}.name={name}: this build has no {display} engine; generating with the HF engine"]


def test_get_rollout_cls_falls_back_for_every_optional_engine(monkeypatch):
    from hybridrl.workers.rollout import OPTIONAL_ENGINES, ROLLOUT_REGISTRY, RolloutEngineError, base, get_rollout_cls

    assert not hasattr(base, "engine_available") and not hasattr(base, "_FALLBACK_TO_HF")
    for name in OPTIONAL_ENGINES:
        assert get_rollout_cls(name) is ROLLOUT_REGISTRY["hf"]
    with pytest.raises(ValueError, match="rollout.name='vllmm' is not a known rollout engine"):
        get_rollout_cls("vllmm")
    engine = type("FakeSGLang", (), {})
    monkeypatch.setitem(ROLLOUT_REGISTRY, "sglang", engine)  # a registered engine wins over the fallback
    assert get_rollout_cls("sglang") is engine
    assert get_rollout_cls("vllm").__name__ == "VLLMRollout"  # never a silent fallback to HF
    assert get_rollout_cls("vllm", "async").__name__ == "AsyncVLLMRollout"
    with pytest.raises(RolloutEngineError, match="rollout.mode=async: the 'hf' engine has no async server mode"):
        get_rollout_cls("hf", "async")


def test_async_mode_needs_an_engine_that_has_one(base_cfg):
    msg = error_of(with_keys(base_cfg, {f"{R}.mode": "async"}))
    assert msg.startswith(f"{R}.mode=async: the 'hf' engine has no async server mode") and f"{R}.name=vllm" in msg
    assert validate_ppo_config(with_keys(base_cfg, {f"{R}.mode": "async", f"{R}.name": "vllm"}), world_size=2) == []


def test_registered_engine_gets_no_note(base_cfg, monkeypatch):
    from hybridrl.workers.rollout import ROLLOUT_REGISTRY

    monkeypatch.setitem(ROLLOUT_REGISTRY, "sglang", type("FakeSGLang", (), {}))
    assert validate_ppo_config(with_keys(base_cfg, {f"{R}.name": "sglang"})) == []


# ---------------------------------------------------------------- ignored / not-yet-supported keys


@functools.cache
def _typed_default():
    """The typed default config (read only: the field types of its keys), made once."""
    return typed_ppo_config(load_config())


def _other_value(key, value):
    """A value different from ``value`` that passes the other checks and has the key's type."""
    if value is None:  # an Optional field: a value of its type
        parent, _, leaf = key.rpartition(".")
        ref_type = str(OmegaConf.select(_typed_default(), parent)._get_node(leaf)._metadata.ref_type)
        if "bool" in ref_type:
            return True
        return 1 if "int" in ref_type or "float" in ref_type else "x"
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value)
    special = {f"{A}.strategy": "fsdp2", "actor_rollout_ref.ref.strategy": "fsdp2", "critic.strategy": "fsdp2"}
    if key in special:
        return special[key]
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, list):
        return value[:1]
    if isinstance(value, dict):
        return {"address": "auto"}
    return f"{value}_x" if isinstance(value, str) else "x"


@pytest.fixture(scope="module")
def all_ignored_notes(base_cfg):
    """The start-up notes of one config with every ignored key set away from its default (one
    check for all of them: a config check per key made this walk a quarter of the fast tier)."""
    changes = {key: _other_value(key, OmegaConf.select(base_cfg, key)) for key in schema.IGNORED_KEYS}
    return validate_ppo_config(with_keys(base_cfg, changes), world_size=1)


@pytest.mark.parametrize("key", sorted(schema.IGNORED_KEYS))
def test_every_ignored_key_is_noted_by_name(base_cfg, all_ignored_notes, key):
    mine = [n for n in all_ignored_notes if n.startswith(f"{key}=")]
    if not mine:  # a key that copies another one (an interpolation) is noted under that one when both change
        value = _other_value(key, OmegaConf.select(base_cfg, key))
        notes = validate_ppo_config(with_keys(base_cfg, {key: value}), world_size=1)
        mine = [n for n in notes if n.startswith(f"{key}=")]
    assert len(mine) == 1 and " is ignored: " in mine[0]


def test_an_ignored_key_alone_is_noted_alone(base_cfg):
    """The combined walk above cannot tell which key a note came from; one key set alone gives
    exactly its own note."""
    key = sorted(schema.IGNORED_KEYS)[0]
    notes = validate_ppo_config(with_keys(base_cfg, {key: _other_value(key, OmegaConf.select(base_cfg, key))}))
    assert [n.split("=")[0] for n in notes] == [key]


@pytest.mark.parametrize("key", sorted(schema.NOT_YET_SUPPORTED))
def test_every_not_yet_supported_key_is_an_error(base_cfg, key):
    value = _other_value(key, OmegaConf.select(base_cfg, key))
    msg = error_of(with_keys(base_cfg, {key: value}))
    assert msg.startswith(f"{key}=") and "is not in this build of hybridrl yet" in msg


def test_every_not_yet_supported_key_exists_in_the_packaged_yaml():
    defaults = packaged_defaults()
    assert [
        k for k in schema.NOT_YET_SUPPORTED if OmegaConf.select(defaults, k, default="<absent>") == "<absent>"
    ] == []


def test_no_key_is_both_ignored_and_refused():
    assert set(schema.IGNORED_KEYS) & set(schema.NOT_YET_SUPPORTED) == set()


@pytest.mark.parametrize(
    "key, value, reason",
    [
        ("trainer.max_critic_ckpt_to_keep", 2, "trainer.max_actor_ckpt_to_keep governs both"),
        ("trainer.del_local_ckpt_after_load", True, "the loaded checkpoint is kept"),
        (
            f"{A}.checkpoint.save_contents",
            ["model", "optimizer", "extra", "hf_model"],
            "always hold model, optimizer and extra state",
        ),
        ("critic.checkpoint.load_contents", ["model"], "always hold model, optimizer and extra state"),
        ("data.return_raw_input_ids", True, "re-templates the chat messages"),
    ],
)
def test_notes_say_why(base_cfg, key, value, reason):
    notes = validate_ppo_config(with_keys(base_cfg, {key: value}))
    assert len(notes) == 1 and notes[0].startswith(f"{key}=") and reason in notes[0]


@pytest.mark.parametrize("key", [f"{R}.use_fire_sampling", "data.image_key"])
def test_features_that_change_results_are_refused(base_cfg, key):
    assert key in schema.NOT_YET_SUPPORTED
    assert key not in schema.IGNORED_KEYS


def test_a_key_copied_by_interpolation_is_noted_once():
    """save_contents / strategy are copied into other keys by ${...}: one note, not several."""
    cfg = load_config(BASE + [f"{A}.checkpoint.save_contents=[model]", f"{A}.strategy=fsdp2"])
    notes = validate_ppo_config(cfg)
    assert sorted(n.split("=")[0] for n in notes) == [f"{A}.checkpoint.save_contents", f"{A}.strategy"]
    # set directly to something else than its source, the copying key gets its own note
    cfg = load_config(BASE + ["actor_rollout_ref.ref.strategy=fsdp2"])
    assert [n.split("=")[0] for n in validate_ppo_config(cfg)] == ["actor_rollout_ref.ref.strategy"]


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("trainer.total_training_steps", -1, "trainer.total_training_steps=-1 must be an integer >= 1 or null"),
        (
            "trainer.total_training_steps",
            "abc",
            "trainer.total_training_steps: Value 'abc' of type 'str' could not be converted to Integer",
        ),
        ("trainer.total_epochs", 0, "trainer.total_epochs=0 must be an integer >= 1"),
        ("trainer.save_freq", "abc", "trainer.save_freq: Value 'abc' of type 'str' could not be converted to Integer"),
        ("trainer.test_freq", 1.5, "trainer.test_freq: Value '1.5' of type 'float' could not be converted to Integer"),
        (f"{A}.optim.lr", "abc", f"{A}.optim.lr: Value 'abc' of type 'str' could not be converted to Float"),
        (f"{A}.optim.lr", -1, f"{A}.optim.lr=-1.0 must be a number > 0"),
    ],
)
def test_run_length_and_learning_rate_are_checked_at_start_up(base_cfg, key, value, expected):
    """A run that would train nothing, or fail only after its first step, stops before loading a model."""
    msg = error_of(with_keys(base_cfg, {key: value}))
    assert msg.startswith(expected) and "\n" not in msg


def test_a_learning_rate_yaml_reads_as_a_string_is_accepted(base_cfg):
    assert validate_ppo_config(with_keys(base_cfg, {f"{A}.optim.lr": "1e-6"})) == []
