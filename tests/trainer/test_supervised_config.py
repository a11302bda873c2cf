"""The typed ``sft_trainer`` / ``rm_trainer`` configs: the YAML and the dataclasses agree key for
key and default for default, each rule is one line, ignored verl keys are noted when set."""

import dataclasses

import pytest
from omegaconf import OmegaConf

from hybridrl.config import ConfigError, load_config
from hybridrl.trainer.jobs.supervised_config import RMConfig, SFTConfig, ignored_notes, rm_config, sft_config


def _fields(obj, prefix=""):
    names = set()
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            names |= _fields(value, f"{prefix}{f.name}.")
        elif isinstance(value, dict) and value:  # a free-form section (verl's profiler.tool_config ...)
            names |= _keys(value, f"{prefix}{f.name}.")
        else:
            names.add(f"{prefix}{f.name}")
    return names


def _keys(node, prefix=""):
    names = set()
    for key, value in node.items():
        names |= _keys(value, f"{prefix}{key}.") if isinstance(value, dict) and value else {f"{prefix}{key}"}
    return names


@pytest.mark.parametrize(
    "name, build, cls", [("sft_trainer", sft_config, SFTConfig), ("rm_trainer", rm_config, RMConfig)]
)
def test_the_yaml_and_the_dataclass_agree(name, build, cls):
    composed = load_config([], config_name=name, resolve_auto_dtypes=False)
    assert _keys(OmegaConf.to_container(composed, resolve=True)) == _fields(cls())
    assert build(composed) == build(None)  # the dataclass defaults, interpolations resolved


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["optim.clip_grad=0"], "optim.clip_grad=0.0 must be a positive number"),
        (["optim.warmup_steps_ratio=1.5"], "optim.warmup_steps_ratio=1.5 must be a number in [0, 1]"),
        (["data.truncation=middle"], "data.truncation='middle' is not one of error, left, right"),
        (["data.train_batch_size=0"], "data.train_batch_size=0 must be a whole number >= 1"),
        (["model.lora_rank=-1"], "model.lora_rank=-1 must be 0 (full fine-tuning) or a positive whole number"),
        (["trainer.backend=slurm"], "trainer.backend='slurm' is not one of auto, local, ray"),
        (["trainer.total_epochs=0"], "trainer.total_epochs=0 must be >= 1 (or set trainer.total_training_steps)"),
        (
            ["trainer.nnodes=2", "trainer.n_gpus_per_node=3"],
            "data.train_batch_size=256 does not split over trainer.nnodes x trainer.n_gpus_per_node = 6 workers",
        ),
        (["data.train_batch_size=many"], "data.train_batch_size: Value 'many' of type 'str' could not be converted"),
    ],
)
def test_each_rule_is_one_line_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as err:
        sft_config(load_config(overrides, config_name="sft_trainer", resolve_auto_dtypes=False))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_reward_model_batch_must_divide_into_micro_batches_and_needs_a_model():
    def error(*overrides):
        with pytest.raises(ConfigError) as err:
            rm_config(load_config(list(overrides), config_name="rm_trainer", resolve_auto_dtypes=False))
        return str(err.value)

    assert "data.train_batch_size=32 is not a multiple of data.micro_batch_size_per_gpu=5" in error(
        "data.micro_batch_size_per_gpu=5"
    )
    assert "model.path is not set" in error("model.path=null")
    assert "data.truncation='right' is not one of left, drop, error" in error("data.truncation=right")


def test_ignored_verl_keys_are_noted_only_when_set():
    assert ignored_notes(sft_config(load_config([], config_name="sft_trainer", resolve_auto_dtypes=False))) == []
    typed = sft_config(
        load_config(
            ["model.use_liger=True", "use_remove_padding=True", "model.fsdp_config.wrap_policy.min_num_params=100"],
            config_name="sft_trainer",
            resolve_auto_dtypes=False,
        )
    )
    notes = ignored_notes(typed)
    assert notes == [
        "model.use_liger=True is ignored: no Liger kernels in this build",
        "model.fsdp_config.wrap_policy.min_num_params=100 is ignored: FSDP2 shards every decoder block",
        "use_remove_padding=True is ignored: micro batches are cut to their longest row instead (same results)",
    ]
