"""verl's own configs and flags (issue 34, item 6): ``--config-path`` / ``--config-name`` as verl's
recipes pass them, a recipe config's ``defaults:`` resolved against the packaged config, ``???``
left unset, config-group choices, ``+key`` on a key hybridrl has, did-you-mean that stays on a
misspelling."""

import pytest
from omegaconf import OmegaConf

from hybridrl.config import ConfigError, load_config
from hybridrl.config.loader import (
    closest_key,
    drop_group_choices,
    resolve_config_path,
    split_config_flags,
)
from hybridrl.config.precision import auto_dtype_keys
from hybridrl.inspection.show_config import main as config_main
from hybridrl.trainer.main_ppo import main as main_ppo

# a recipe config as verl-recipe writes them (dapo/config/dapo_trainer.yaml's head)
RECIPE_YAML = """\
hydra:
  searchpath:
    - file://verl/trainer/config

defaults:
  - ppo_trainer
  - _self_

data:
  max_prompt_length: 64
  train_batch_size: 8
algorithm:
  adv_estimator: grpo
actor_rollout_ref:
  actor:
    ppo_mini_batch_size: 4
    ppo_micro_batch_size_per_gpu: 2
  rollout:
    n: 2
"""


@pytest.fixture
def recipe_dir(tmp_path):
    (tmp_path / "my_recipe.yaml").write_text(RECIPE_YAML)
    return tmp_path


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--config-path=D", "--config-name=N", "a=1"], (["a=1"], "D", "N")),
        (["a=1", "--config-path", "D", "-cn", "N.yaml"], (["a=1"], "D", "N.yaml")),
        (["-cp", "D", "~b", "+c=2"], (["~b", "+c=2"], "D", None)),
        (["a=1"], (["a=1"], None, None)),
    ],
)
def test_config_flags_are_taken_out_of_the_overrides(argv, expected):
    assert split_config_flags(argv) == expected


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--config-name"], "--config-name needs a value"),
        (["--config-path", "--config-name=x"], "--config-path needs a value"),
        (["-cn", "a", "-cn", "b"], "-cn is given twice"),
        (["--multirun"], "--multirun: not an option of this command"),
    ],
)
def test_bad_config_flags_are_one_line(argv, message):
    with pytest.raises(ConfigError, match=message) as err:
        split_config_flags(argv)
    assert "\n" not in str(err.value)


def test_verl_config_folder_is_the_packaged_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_config_path("config") is None and resolve_config_path("./config") is None
    (tmp_path / "config").mkdir()  # a folder of the user's own beside them wins
    assert resolve_config_path("config") == str(tmp_path / "config")
    with pytest.raises(ConfigError, match=r"--config-path=nowhere: no such folder"):
        resolve_config_path("nowhere")


def test_recipe_config_composes_over_the_packaged_ppo_trainer(recipe_dir):
    cfg = load_config(["data.max_response_length=32"], config_name="my_recipe.yaml", config_dir=str(recipe_dir))
    assert cfg.data.max_prompt_length == 64 and cfg.actor_rollout_ref.rollout.prompt_length == 64
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.data.max_response_length == 32
    assert "trainer" in cfg and cfg.trainer.device == "auto"  # the rest is ppo_trainer's


def test_config_check_takes_verls_flags(recipe_dir, capsys):
    assert config_main(["--check", "--only", "data.train_batch_size", "-cp", str(recipe_dir), "-cn", "my_recipe"]) == 0
    out, err = capsys.readouterr()
    assert out == "data.train_batch_size: 8\n" and "checks passed" in err


def test_main_ppo_takes_config_path_and_name(recipe_dir, monkeypatch):
    seen = {}
    monkeypatch.setattr("hybridrl.trainer.main_ppo.run_ppo", lambda config: seen.setdefault("cfg", config))
    argv = [f"--config-path={recipe_dir}", "--config-name=my_recipe", "trainer.device=cpu"]
    assert main_ppo(argv) == 0
    assert seen["cfg"].data.max_prompt_length == 64 and seen["cfg"].trainer.device == "cpu"


def test_main_ppo_with_a_missing_config_path_is_one_line(tmp_path, capsys):
    assert main_ppo([f"--config-path={tmp_path}/nope", "--config-name=x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hybridrl: error: --config-path=") and "no such folder" in err and "\n" not in err


def test_a_missing_defaults_entry_names_it_not_the_file(tmp_path):
    (tmp_path / "mine.yaml").write_text("defaults:\n  - ppo_trainer_v2\n  - _self_\n")
    with pytest.raises(ConfigError, match=r"mine\.yaml \(in .*\): its defaults list names 'ppo_trainer_v2'") as err:
        load_config([], config_name="mine", config_dir=str(tmp_path))
    assert "is not in" not in str(err.value)  # the file is there


@pytest.mark.parametrize("where", ["flag", "defaults"])
def test_verls_megatron_config_is_a_one_line_refusal(tmp_path, where):
    (tmp_path / "mine.yaml").write_text("defaults:\n  - ppo_megatron_trainer\n  - _self_\n")
    with pytest.raises(ConfigError, match=r"the Megatron-LM engine .* is not in hybridrl; it trains with FSDP2"):
        if where == "flag":
            load_config([], config_name="ppo_megatron_trainer.yaml")
        else:
            load_config([], config_name="mine", config_dir=str(tmp_path))


def test_a_mandatory_value_left_unset_names_the_key(tmp_path, capsys):
    # verl's rollout.yaml has `name: ???`; a config that copies verl's tree keeps it (a value merged
    # over it sets it, ??? merged over a value does not unset it)
    (tmp_path / "mine.yaml").write_text("actor_rollout_ref:\n  rollout:\n    name: ???\n    dtype: auto\n")
    with pytest.raises(ConfigError, match=r"^actor_rollout_ref\.rollout\.name has no value \('\?\?\?' in mine\.yaml"):
        load_config([], config_name="mine", config_dir=str(tmp_path))
    cfg = load_config(["actor_rollout_ref.rollout.name=hf"], "mine", str(tmp_path))
    assert cfg.actor_rollout_ref.rollout.name == "hf"
    assert main_ppo([f"--config-path={tmp_path}", "--config-name=mine"]) == 2  # not a traceback from precision.py
    err = capsys.readouterr().err.strip()
    assert err.startswith("hybridrl: error: actor_rollout_ref.rollout.name has no value") and "\n" not in err


def test_auto_dtype_keys_skips_an_unset_value():
    cfg = OmegaConf.create({"rollout": {"name": "???", "dtype": "auto"}, "model": "???"})
    assert auto_dtype_keys(cfg) == ["rollout.dtype"]


def test_verls_group_choice_of_fsdp_is_dropped_and_of_megatron_refused():
    assert drop_group_choices(["engine=fsdp", "optim=fsdp", "optim.lr=1e-5", "model_engine=dp"]) == ["optim.lr=1e-5"]
    with pytest.raises(ConfigError, match=r"^engine=megatron: the Megatron-LM engine is not in hybridrl"):
        drop_group_choices(["engine=megatron"])


def test_adding_a_key_hybridrl_already_has_sets_it():
    # verl's config lacks it, so verl's command adds it with '+'; hybridrl's config has it
    cfg = load_config(["+trainer.device=cpu", "+trainer.my_tag=abc"])
    assert cfg.trainer.device == "cpu" and cfg.trainer.my_tag == "abc"


@pytest.mark.parametrize(
    "key, known, expected",
    [
        ("r.expert_parallel_size", ["r.tensor_model_parallel_size", "r.data_parallel_size"], None),
        ("r.enable_prefix_caching", ["r.enable_chunked_prefill"], None),
        ("r.tensor_model_paralel_size", ["r.tensor_model_parallel_size"], "r.tensor_model_parallel_size"),
        ("a.ppo_minibatch_size", ["a.ppo_mini_batch_size"], "a.ppo_mini_batch_size"),
        ("a.micro_batch_size", ["a.ppo_micro_batch_size"], "a.ppo_micro_batch_size"),
    ],
)
def test_did_you_mean_suggests_a_misspelling_not_another_feature(key, known, expected):
    assert closest_key(key, known) == expected
