"""The typed ``ppo_trainer`` config: the YAML and :class:`PPOConfig` agree key for key and default
for default (interpolations included), bad keys and values are one line, and the run's structured
config takes the trainer's own writes but refuses values of the wrong type."""

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from hybridrl.config import ConfigError, load_config
from hybridrl.trainer.ppo.config import PPOConfig, ppo_config, typed_ppo_config
from hybridrl.trainer.ppo.config_check import validate_ppo_config
from hybridrl.trainer.ppo.correction_stage import share_rollout_correction


def _differences(yaml_node: dict, typed_node: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(yaml_node) | set(typed_node)):
        path = prefix + key
        if key not in typed_node:
            out.append(f"{path}: in the YAML, no field")
        elif key not in yaml_node:
            out.append(f"{path}: a field, not in the YAML")
        elif isinstance(yaml_node[key], dict) and isinstance(typed_node[key], dict):
            out += _differences(yaml_node[key], typed_node[key], path + ".")
        elif yaml_node[key] != typed_node[key] or isinstance(yaml_node[key], bool) != isinstance(typed_node[key], bool):
            out.append(f"{path}: YAML {yaml_node[key]!r}, dataclass {typed_node[key]!r}")
    return out


def yaml_differences(config_name: str, cls: type) -> list[str]:
    """Where the packaged ``<config_name>.yaml`` as written (interpolations unresolved) and the
    dataclass ``cls`` differ: a key without a field, a field without a key, a different default."""
    with initialize_config_module(config_module="hybridrl.config", version_base=None):
        raw = compose(config_name=config_name)
    yaml_tree = OmegaConf.to_container(raw, resolve=False)
    typed_tree = OmegaConf.to_container(OmegaConf.structured(cls), resolve=False)
    return _differences(yaml_tree, typed_tree)


def test_the_yaml_and_the_dataclasses_agree_key_for_key_and_default_for_default():
    assert yaml_differences("ppo_trainer", PPOConfig) == []


def test_the_typed_config_holds_the_composed_values():
    composed = load_config(
        ["data.max_prompt_length=64", "actor_rollout_ref.actor.ppo_epochs=3", "trainer.logger=console"],
        resolve_auto_dtypes=False,
    )
    typed = typed_ppo_config(composed)
    # the one value typing chooses: rollout.mode, left null (verl's async where it applies), is sync for hf
    assert composed.actor_rollout_ref.rollout.mode is None and typed.actor_rollout_ref.rollout.mode == "sync"
    composed.actor_rollout_ref.rollout.mode = "sync"
    assert OmegaConf.to_container(typed) == OmegaConf.to_container(composed)
    assert typed.actor_rollout_ref.rollout.prompt_length == 64  # the interpolation, resolved
    assert typed.critic.ppo_epochs == 3
    assert isinstance(ppo_config(composed).actor_rollout_ref.actor.optim.lr, float)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["+actor_rollout_ref.actor.clip_ratio_lo=0.1"],
            "actor_rollout_ref.actor.clip_ratio_lo is not a key of this command's config; "
            "did you mean 'actor_rollout_ref.actor.clip_ratio_low'?",
        ),
        (["+critic.optim.momentum=0.9"], "critic.optim.momentum is not a key of this command's config; remove it"),
        (["+trainer.v1.extra=1"], "trainer.v1.extra is not a key"),
        (
            ["actor_rollout_ref.rollout.n=four"],
            "actor_rollout_ref.rollout.n: Value 'four' of type 'str' could not be converted to Integer",
        ),
        (["critic.optim.lr=fast"], "critic.optim.lr: Value 'fast' of type 'str' could not be converted to Float"),
        (["reward_model.enable=maybe"], "reward_model.enable: Value 'maybe' is not a valid bool"),
    ],
)
def test_a_bad_key_or_value_is_one_line_naming_it(overrides, message):
    config = load_config(overrides, resolve_auto_dtypes=False)
    for check in (ppo_config, validate_ppo_config):
        with pytest.raises(ConfigError) as info:
            check(config)
        assert message in str(info.value) and "\n" not in str(info.value)


def test_free_form_sections_take_any_key():
    config = load_config(
        [
            "+ray_kwargs.ray_init.num_gpus=0",
            "+reward_model.reward_kwargs.max_resp_len=8",
            "+actor_rollout_ref.rollout.engine_kwargs.vllm.max_logprobs=5",
        ],
        resolve_auto_dtypes=False,
    )
    typed = typed_ppo_config(config)
    assert typed.ray_kwargs.ray_init.num_gpus == 0
    assert typed.actor_rollout_ref.rollout.engine_kwargs.vllm.max_logprobs == 5


def test_the_run_config_takes_the_trainers_one_write_and_refuses_wrong_types():
    typed = typed_ppo_config(load_config(["algorithm.rollout_correction.bypass_mode=true"], resolve_auto_dtypes=False))
    share_rollout_correction(typed)
    policy_loss = typed.actor_rollout_ref.actor.policy_loss
    assert policy_loss.loss_mode == "bypass_mode" and policy_loss.rollout_correction.bypass_mode is True
    with pytest.raises(ValidationError):
        typed.actor_rollout_ref.rollout.n = "two"
