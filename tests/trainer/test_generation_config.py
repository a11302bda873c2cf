"""The typed ``generation`` config: the YAML and :class:`GenerationConfig` agree key for key and
default for default (interpolations included), its rollout section is an engine section, and a bad
key or value is one line."""

import pytest

from hybridrl.config import ConfigError, load_config
from hybridrl.trainer.jobs.generation_config import GenerationConfig, generation_config
from hybridrl.workers.config import EngineConfig
from tests.config.test_ppo_config import yaml_differences


def test_the_yaml_and_the_dataclasses_agree_key_for_key_and_default_for_default():
    assert yaml_differences("generation", GenerationConfig) == []


def test_the_rollout_section_is_an_engine_section_with_the_composed_values():
    typed = generation_config(
        load_config(
            ["rollout.prompt_length=64", "data.n_samples=2"], config_name="generation", resolve_auto_dtypes=False
        )
    )
    assert isinstance(typed.rollout, EngineConfig)
    assert typed.data.max_prompt_length == 64  # the interpolation, resolved
    assert typed.data.n_samples == 2 and isinstance(typed.rollout.top_p, float)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["+rollout.temprature=0.5"],
            "rollout.temprature is not a key of this command's config; did you mean 'rollout.temperature'?",
        ),
        (["data.n_samples=five"], "data.n_samples: Value 'five' of type 'str' could not be converted to Integer"),
    ],
)
def test_a_bad_key_or_value_is_one_line_naming_it(overrides, message):
    config = load_config(overrides, config_name="generation", resolve_auto_dtypes=False)
    with pytest.raises(ConfigError) as info:
        generation_config(config)
    assert message in str(info.value) and "\n" not in str(info.value)
