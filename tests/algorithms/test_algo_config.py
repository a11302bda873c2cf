"""The typed ``algorithm`` section: the YAML and the dataclass agree, bad values are one line."""

import dataclasses

import pytest
from omegaconf import OmegaConf

from hybridrl.algorithms.config import AlgoConfig, algo_config
from hybridrl.algorithms.errors import AlgorithmConfigError, UnknownAlgorithmError
from hybridrl.config import ConfigError, load_config
from hybridrl.config.defaults import packaged_defaults
from hybridrl.config.typed import to_dataclass


def _fields(cls, prefix=""):
    """Dotted names of every field, nested dataclasses flattened."""
    names = set()
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            names |= _fields(type(default), f"{prefix}{f.name}.")
        else:
            names.add(f"{prefix}{f.name}")
    return names


def _keys(node, prefix=""):
    names = set()
    for key, value in node.items():
        names |= _keys(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}"}
    return names


def test_every_yaml_key_has_a_field_and_every_field_a_yaml_key():
    yaml_keys = _keys(OmegaConf.to_container(packaged_defaults().algorithm))
    assert yaml_keys == _fields(AlgoConfig)


def test_yaml_defaults_equal_the_dataclass_defaults():
    assert algo_config(packaged_defaults()) == AlgoConfig()
    assert algo_config(OmegaConf.create({})) == AlgoConfig()  # a config without the section: all defaults


def test_overrides_reach_the_typed_fields():
    algo = algo_config(
        load_config(
            [
                "algorithm.gamma=0.9",
                "algorithm.kl_ctrl.type=adaptive",
                "algorithm.rollout_correction.rollout_is=token",
                "algorithm.gdpo_reward_keys=[a,b]",
            ]
        )
    )
    assert (algo.gamma, algo.kl_ctrl.type, algo.rollout_correction.rollout_is) == (0.9, "adaptive", "token")
    assert algo.gdpo_reward_keys == ["a", "b"] and algo.rollout_correction.corrects


@pytest.mark.parametrize(
    "section, message",
    [
        ({"gamma": "high"}, "algorithm.gamma: Value 'high' of type 'str' could not be converted to Float"),
        ({"kl_ctrl": {"kl_coeff": 0.1}}, "algorithm.kl_ctrl.kl_coeff is not a key of algorithm"),
        ({"filter_groups": {"max_num_gen_batches": "ten"}}, "algorithm.filter_groups.max_num_gen_batches:"),
    ],
)
def test_a_wrong_key_or_type_is_one_config_error_line(section, message):
    with pytest.raises(ConfigError) as err:
        to_dataclass(AlgoConfig, OmegaConf.create(section), "algorithm")
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "section, error, message",
    [
        ({"gamma": 1.5}, AlgorithmConfigError, "algorithm.gamma=1.5 must be in [0, 1]"),
        ({"lam": -0.1}, AlgorithmConfigError, "algorithm.lam=-0.1 must be in [0, 1]"),
        (
            {"kl_ctrl": {"type": "pid"}},
            AlgorithmConfigError,
            "algorithm.kl_ctrl.type='pid' is not one of fixed, adaptive",
        ),
        (
            {"use_kl_in_reward": True, "kl_ctrl": {"type": "adaptive", "target_kl": 0}},
            AlgorithmConfigError,
            "target_kl",
        ),
        (
            {"rollout_correction": {"loss_type": "dpo"}},
            UnknownAlgorithmError,
            "unknown algorithm.rollout_correction.loss_type",
        ),
    ],
)
def test_the_section_rules(section, error, message):
    with pytest.raises(error, match=message.replace("[", r"\[").replace("]", r"\]")):
        algo_config(OmegaConf.create({"algorithm": section}))


def test_an_unused_kl_controller_is_not_built():
    algo = algo_config(OmegaConf.create({"algorithm": {"kl_ctrl": {"type": "adaptive", "target_kl": 0}}}))
    assert algo.kl_ctrl.target_kl == 0.0  # only use_kl_in_reward builds (and checks) the controller
