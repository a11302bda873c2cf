"""The start-up rules that let verl's own example commands run unchanged (issue 34): each test
loads one config and checks what verl does with the command's keys."""

from __future__ import annotations

import logging

import pytest

from hybridrl.config import ConfigError, load_config
from hybridrl.config.batch_sizes import check_batch_sizes
from hybridrl.trainer.ppo.config import typed_ppo_config
from hybridrl.workers.config.reward_model import REWARD_LOOP_MICRO_BATCH


def test_reward_loop_needs_no_micro_batch(caplog):
    """verl's validate_config skips the reward model's micro-batch rule under use_reward_loop
    (examples/grpo_trainer/run_mistral13b_skyworkrm_hhrlhf.sh); here the worker scores a default
    micro batch, noted; without the reward loop the key is still required, and a set one is kept."""
    base = [
        "reward_model.enable=true",
        "trainer.n_gpus_per_node=8",
        "data.train_batch_size=256",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    ]
    with caplog.at_level(logging.WARNING):
        loop = typed_ppo_config(load_config(base + ["reward_model.use_reward_loop=true"]))
    assert loop.reward_model.micro_batch_size_per_gpu == REWARD_LOOP_MICRO_BATCH
    assert any("reward_model.use_reward_loop=true without a micro batch" in r.message for r in caplog.records)
    check_batch_sizes(loop, 8, False)
    loop.reward_model.use_reward_loop = False
    loop.reward_model.micro_batch_size_per_gpu = None
    with pytest.raises(ConfigError, match="reward_model.micro_batch_size_per_gpu is not set"):
        check_batch_sizes(loop, 8, False)
