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


def test_grpo_and_rloo_with_one_sample_per_prompt_run_as_verl():
    """examples/rollout_correction/*: GRPO and RLOO with rollout.n=1 run (a note): verl's group of one
    has mean 0 and std 1, so the GRPO advantage is score / (1 + epsilon), and RLOO has no leave-one-out
    baseline, so its advantage is the score - hybridrl's functions give the same; an estimator that
    needs two responses (reinforce_plus_plus_baseline) still stops."""
    import torch

    from hybridrl.algorithms.advantages import compute_grpo_outcome_advantage, compute_rloo_outcome_advantage
    from hybridrl.trainer.ppo.config_check import validate_ppo_config

    base = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=1"]
    base += ["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8"]
    base += ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"]
    cfg = typed_ppo_config(load_config(base))
    notes = validate_ppo_config(cfg)
    assert any("rollout.n=1: each prompt's group holds one response" in n and "(1 + epsilon)" in n for n in notes)
    cfg.algorithm.adv_estimator = "rloo"
    notes = validate_ppo_config(cfg)
    assert any("rollout.n=1: each prompt's group holds one response" in n and "no other response" in n for n in notes)
    cfg.algorithm.adv_estimator = "reinforce_plus_plus_baseline"
    with pytest.raises(ConfigError, match="samples one per prompt"):
        validate_ppo_config(cfg)

    rewards = torch.zeros(3, 4)
    rewards[:, 2] = torch.tensor([0.5, -1.0, 2.0])
    mask = torch.ones(3, 4)
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, index=["a", "b", "c"], epsilon=1e-6)
    expected = torch.tensor([0.5, -1.0, 2.0]) / (1.0 + 1e-6)  # verl: (score - 0) / (1 + eps)
    torch.testing.assert_close(adv, expected[:, None].expand(3, 4))
    adv, _ = compute_rloo_outcome_advantage(rewards, mask, index=["a", "b", "c"])
    torch.testing.assert_close(adv, torch.tensor([0.5, -1.0, 2.0])[:, None].expand(3, 4))  # verl: score - 0


def test_trtllm_is_an_engine_refusal():
    """examples/grpo_trainer/run_qwen2-7b_math_trtllm.sh: one line naming verl's engine (the
    benchmark counts it as an engine hybridrl does not have), not an unknown registry name."""
    with pytest.raises(
        ConfigError,
        match=r"^actor_rollout_ref.rollout.name=trtllm: verl's TensorRT-LLM rollout engine is not in hybridrl; set",
    ):
        typed_ppo_config(load_config(["actor_rollout_ref.rollout.name=trtllm"]))


def test_verl_loose_values_read_as_verl_reads_them():
    """tests/special_e2e/ppo_trainer/run_model_reward.sh (test_freq=False: verl validates only when
    test_freq > 0) and run_function_reward.sh (name=null with path=null: verl never reads the name);
    a name=null with a file still stops on the type, as verl's assert does."""
    from hybridrl.config.verl_compat import verl_values

    cfg = load_config(
        ["trainer.test_freq=False", "custom_reward_function.path=null", "custom_reward_function.name=null"]
    )
    assert cfg.trainer.test_freq == -1 and cfg.custom_reward_function.name == "compute_score"
    kept = ["custom_reward_function.path=/x.py", "custom_reward_function.name=null", "trainer.test_freq=5"]
    assert verl_values(kept) == kept
