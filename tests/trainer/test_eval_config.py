"""The typed ``evaluation`` config: the YAML and :class:`EvalConfig` agree key for key and default
for default, and a bad key or value is one line naming it."""

import pytest

from hybridrl.config import ConfigError, load_config
from hybridrl.trainer.jobs.eval_config import EvalConfig, eval_config
from tests.config.test_ppo_config import yaml_differences


def test_the_yaml_and_the_dataclasses_agree_key_for_key_and_default_for_default():
    assert yaml_differences("evaluation", EvalConfig) == []
    assert eval_config(load_config([], config_name="evaluation")) == EvalConfig()


def test_the_typed_config_holds_the_composed_values():
    typed = eval_config(
        load_config(
            ["metrics.pass_k=[1,8]", "output_path=/tmp/r.json", "+custom_reward_function.reward_kwargs.scale=2"],
            config_name="evaluation",
        )
    )
    assert typed.metrics.pass_k == [1, 8] and typed.output_path == "/tmp/r.json"
    assert typed.custom_reward_function.reward_kwargs == {"scale": 2}


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["+metrics.pass_at=[1]"],
            "metrics.pass_at is not a key of this command's config; did you mean 'metrics.pass_k'?",
        ),
        (["metrics.pass_k=3"], "metrics.pass_k: "),
        (
            ["metrics.bootstrap_samples=many"],
            "metrics.bootstrap_samples: Value 'many' of type 'str' could not be converted to Integer",
        ),
        (["metrics.pass_k=[0,2]"], "metrics.pass_k=[0, 2] must be null or a list of whole numbers >= 1"),
        (["metrics.bootstrap_samples=0"], "metrics.bootstrap_samples must be >= 1"),
        (["metrics.confidence=95"], "metrics.confidence=95.0 must be between 0 and 1"),
    ],
)
def test_a_bad_key_or_value_is_one_line_naming_it(overrides, message):
    config = load_config(overrides, config_name="evaluation")
    with pytest.raises(ConfigError) as info:
        eval_config(config)
    assert message in str(info.value) and "\n" not in str(info.value)
