"""Every key of verl's PPO trainer config (the key lists kept in hybridrl/config/verl_keys_*.txt) gets
one of three answers: supported (a key of hybridrl's config), ignored with a reason, or refused naming
the feature and what to use instead; never "unknown key"."""

from __future__ import annotations

import dataclasses
import logging
import typing

import pytest

from hybridrl.config import ConfigError, load_config
from hybridrl.config.typed import IGNORED, REFUSED
from hybridrl.config.verl_compat import KEY_FILES, RULES, answer_for, verl_keys
from hybridrl.trainer.ppo.config import PPOConfig, typed_ppo_config


def _schema(cls: type, prefix: str = "") -> dict[str, str]:
    """``{dotted key: answer}`` of the typed config's fields: ``supported``, ``ignored``, ``refused``
    or ``free`` (a free-form mapping: anything below it is passed on)."""
    out: dict[str, str] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        marks = f.metadata.get(IGNORED) or f.metadata.get(REFUSED)
        kind = IGNORED if IGNORED in f.metadata else REFUSED if REFUSED in f.metadata else "supported"
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            out[key] = kind
            out.update(_schema(hint, key + "."))
        elif isinstance(marks, dict):  # a free-form mapping with some keys marked
            out[key] = "free"
            out.update({f"{key}.{sub}": kind for sub in marks})
        else:
            free = typing.get_origin(hint) in (dict, typing.Union) or hint is typing.Any
            out[key] = kind if not free or kind != "supported" else "free"
    return out


SCHEMA = _schema(PPOConfig)


def answer(key: str) -> str | None:
    """The answer hybridrl gives ``key``: its field's, the free-form mapping's above it, or a rule's."""
    if key in SCHEMA:
        return "supported" if SCHEMA[key] == "free" else SCHEMA[key]
    parts = key.split(".")
    for i in range(len(parts) - 1, 0, -1):
        above = SCHEMA.get(".".join(parts[:i]))
        if above is not None and above != "supported":  # below a free-form mapping or a marked field
            return "supported" if above == "free" else above
        if above is not None:
            break
    rule = answer_for(key)
    return rule.kind if rule else None


@pytest.mark.parametrize("name", KEY_FILES)
def test_every_verl_key_gets_one_answer(name):
    keys = verl_keys(name)
    assert len(keys) > 500
    unanswered = sorted(key for key in keys if answer(key) is None)
    assert unanswered == []


@pytest.mark.parametrize("name", KEY_FILES)
def test_the_key_lists_name_their_source(name):
    from importlib.resources import files

    head = files("hybridrl.config").joinpath(name).read_text().splitlines()[:4]
    assert any(line.startswith("# Source: ") for line in head)
    assert any(line.startswith("# Version: ") for line in head)


def test_every_rule_answers_some_verl_key_hybridrls_config_lacks():
    import fnmatch

    lacking = {k for name in KEY_FILES for k in verl_keys(name) if k not in SCHEMA}
    # keys verl's own scripts and example configs set that its config lists lack (verl accepts them unread)
    lacking |= {
        "actor_rollout_ref.rollout.sglang_rollout_mode",
        "actor_rollout_ref.rollout.server.timeout",
        "trainer.tensorboard_dir",
        "trainer.rl_logging_board_dir",
    }
    for patterns, _ in RULES:
        assert any(fnmatch.filter(lacking, p) for p in patterns), f"{patterns} answer no verl key"


def test_a_refused_subtree_is_one_line_naming_the_feature_and_the_fix():
    with pytest.raises(ConfigError) as info:
        load_config(["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"], resolve_auto_dtypes=False)
    message = str(info.value)
    assert "strategy megatron is not in hybridrl; it trains with FSDP2 - drop the megatron.* keys" in message
    assert "unknown key" not in message and "\n" not in message


@pytest.mark.parametrize(
    "override, feature",
    [
        ("actor_rollout_ref.rollout.expert_parallel_size=8", "expert parallelism"),
        ("actor_rollout_ref.rollout.data_parallel_size=2", "data parallelism inside one rollout engine"),
        ("critic.veomni.expert_parallel_size=2", "VeOmni"),
    ],
)
def test_a_refused_key_never_gets_a_did_you_mean(override, feature):
    with pytest.raises(ConfigError) as info:
        load_config([override], resolve_auto_dtypes=False)
    assert feature in str(info.value) and "did you mean" not in str(info.value)


def test_a_refused_key_at_verls_default_and_an_ignored_key_run_with_a_note(caplog):
    with caplog.at_level(logging.WARNING):
        config = load_config(
            [
                "actor_rollout_ref.rollout.expert_parallel_size=1",
                "actor_rollout_ref.rollout.prometheus.enable=true",
            ],
            resolve_auto_dtypes=False,
        )
    typed_ppo_config(config)
    notes = [r.getMessage() for r in caplog.records]
    assert any("prometheus.enable=true is ignored: no Prometheus server" in n for n in notes)
    assert not any("expert_parallel_size" in n for n in notes)


def test_verl_keys_in_a_config_file_get_the_same_answers(tmp_path, caplog):
    (tmp_path / "mine.yaml").write_text(
        "defaults: [ppo_trainer, _self_]\n"
        "actor_rollout_ref:\n  rollout:\n"
        "    prometheus: {enable: true}\n"
        "    checkpoint_engine: {backend: naive, update_weights_bucket_megabytes: 4096}\n"
        "  actor:\n    megatron: {tensor_model_parallel_size: 1, param_offload: false}\n"
    )
    with caplog.at_level(logging.WARNING):
        typed = typed_ppo_config(
            load_config([], config_name="mine", config_dir=str(tmp_path), resolve_auto_dtypes=False)
        )
    assert typed.actor_rollout_ref.rollout.n == 1
    assert typed.actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes == 4096
    assert any("prometheus is ignored" in r.getMessage() for r in caplog.records)
    (tmp_path / "bad.yaml").write_text(
        "defaults: [ppo_trainer, _self_]\nactor_rollout_ref:\n  actor:\n    megatron: {tensor_model_parallel_size: 4}\n"
    )
    with pytest.raises(
        ConfigError, match="megatron.tensor_model_parallel_size=4: strategy megatron is not in hybridrl"
    ):
        typed_ppo_config(load_config([], config_name="bad", config_dir=str(tmp_path), resolve_auto_dtypes=False))


def test_the_weight_bucket_has_verls_two_spellings():
    R = "actor_rollout_ref.rollout"

    def bucket(*overrides):
        return typed_ppo_config(load_config(list(overrides), resolve_auto_dtypes=False)).actor_rollout_ref.rollout

    assert bucket().checkpoint_engine.update_weights_bucket_megabytes == 2048  # verl main's default
    assert bucket(f"{R}.update_weights_bucket_megabytes=512").checkpoint_engine.update_weights_bucket_megabytes == 512
    with pytest.raises(ConfigError, match="are verl's two spellings of one setting"):
        bucket(f"{R}.update_weights_bucket_megabytes=512", f"{R}.checkpoint_engine.update_weights_bucket_megabytes=64")
    with pytest.raises(ConfigError, match="checkpoint_engine.update_weights_bucket_megabytes"):
        bucket(f"{R}.checkpoint_engine.update_weights_bucket_megabytes=0")
