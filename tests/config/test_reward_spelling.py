"""verl >= 0.8's reward.* keys: copied onto the keys hybridrl reads; the same setting given both
ways differently is one error naming both keys."""

import pytest

from hybridrl.config import ConfigError, load_config
from hybridrl.trainer.ppo.config_check import ignored_key_notes


def test_reward_section_values_reach_the_keys_hybridrl_reads():
    cfg = load_config(
        [
            "reward.reward_manager.name=dapo",
            "reward.custom_reward_function.path=/tmp/r.py",
            "reward.custom_reward_function.name=score",
            "+reward.reward_kwargs.max_resp_len=64",
            "reward.reward_model.enable=true",
            "reward.reward_model.model_path=/models/rm",
        ],
        resolve_auto_dtypes=False,
    )
    assert cfg.reward_model.reward_manager == "dapo"
    assert (cfg.custom_reward_function.path, cfg.custom_reward_function.name) == ("/tmp/r.py", "score")
    assert cfg.reward_model.reward_kwargs == {"max_resp_len": 64}
    assert cfg.reward_model.enable is True and cfg.reward_model.model.path == "/models/rm"


def test_the_old_spelling_alone_still_works_and_agreeing_values_are_fine():
    cfg = load_config(["reward_model.reward_manager=dapo"], resolve_auto_dtypes=False)
    assert cfg.reward_model.reward_manager == "dapo"
    cfg = load_config(
        ["reward_model.reward_manager=dapo", "reward.reward_manager.name=dapo"], resolve_auto_dtypes=False
    )
    assert cfg.reward_model.reward_manager == "dapo"


def test_the_same_setting_two_ways_differently_is_one_line():
    with pytest.raises(
        ConfigError,
        match=r"^reward.reward_manager.name='dapo' and reward_model.reward_manager="
        r"'naive2' set the same thing differently; keep one of them",
    ) as err:
        load_config(
            ["reward_model.reward_manager=naive2", "reward.reward_manager.name=dapo"], resolve_auto_dtypes=False
        )
    assert "\n" not in str(err.value)


def test_verl_09_legacy_reward_impl_nulls_are_not_a_conflict(tmp_path):
    # verl 0.9's legacy_reward_impl.yaml sets every old key to null beside the reward.* section
    (tmp_path / "verl09.yaml").write_text(
        "defaults:\n  - ppo_trainer\n  - _self_\n"
        "custom_reward_function:\n  path: null\n  name: null\n"
        "reward_model:\n  reward_manager: null\n"
        "reward:\n  custom_reward_function:\n    name: my_score\n  reward_manager:\n    name: dapo\n"
    )
    cfg = load_config([], config_name="verl09", config_dir=str(tmp_path), resolve_auto_dtypes=False)
    assert cfg.custom_reward_function.name == "my_score" and cfg.reward_model.reward_manager == "dapo"
    # a value set the old way still conflicts with a different new one
    with pytest.raises(ConfigError, match=r"custom_reward_function.name='other' set the same thing differently"):
        load_config(["custom_reward_function.name=other"], "verl09", str(tmp_path), resolve_auto_dtypes=False)


def test_reward_keys_without_machinery_here_are_noted_or_refused():
    from hybridrl.trainer.ppo.config_check import _check_not_yet_supported

    cfg = load_config(["reward.num_workers=8"], resolve_auto_dtypes=False)  # read as reward_model.num_workers
    assert cfg.reward_model.num_workers == 8 and not any("num_workers" in note for note in ignored_key_notes(cfg))
    cfg = load_config(["reward.reward_manager.module.path=/tmp/m.py"], resolve_auto_dtypes=False)
    with pytest.raises(ConfigError, match=r"reward.reward_manager.module.path='/tmp/m.py': a reward manager class"):
        _check_not_yet_supported(cfg)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("data.datagen.path", "/tmp/gen.py", "dynamic data generation"),  # distillation.*: supported since issue 32
    ],
)
def test_verl_09_machinery_that_is_not_here_is_refused(key, value, message):
    from hybridrl.trainer.ppo.config_check import _check_not_yet_supported

    with pytest.raises(ConfigError, match=rf"^{key}=.*: {message}.* is not in this build of hybridrl yet"):
        _check_not_yet_supported(load_config([f"{key}={value}"], resolve_auto_dtypes=False))


def test_verl_09_keys_that_change_nothing_here_are_noted():
    notes = ignored_key_notes(
        load_config(["trainer.use_v1=false", "transfer_queue.enable=true"], resolve_auto_dtypes=False)
    )
    assert any(n.startswith("trainer.use_v1=False") for n in notes), notes
    assert any(n.startswith("transfer_queue.enable=True") for n in notes), notes
