"""``trainer.save_freq`` / ``test_freq`` of ``hybridrl sft`` and ``hybridrl rm``: a number of steps
or verl's SFT trainer's ``after_each_epoch`` (one epoch's steps)."""

import pytest

from hybridrl.config import ConfigError, load_config
from hybridrl.trainer.jobs.supervised_config import AFTER_EACH_EPOCH, sft_config, steps_of


def test_after_each_epoch_is_one_epochs_steps_and_anything_else_is_one_line():
    overrides = ["trainer.test_freq=after_each_epoch", "trainer.save_freq=after_each_epoch"]
    trainer = sft_config(load_config(overrides, config_name="sft_trainer", resolve_auto_dtypes=False)).trainer
    assert trainer.test_freq == trainer.save_freq == AFTER_EACH_EPOCH
    assert steps_of(trainer.test_freq, 37) == 37 and steps_of(5, 37) == 5 and steps_of(-1, 37) == -1
    composed = load_config(["trainer.test_freq=weekly"], config_name="sft_trainer", resolve_auto_dtypes=False)
    with pytest.raises(ConfigError) as err:
        sft_config(composed)
    assert (
        str(err.value) == "trainer.test_freq='weekly' must be a whole number of steps (-1: never) or after_each_epoch"
    )
