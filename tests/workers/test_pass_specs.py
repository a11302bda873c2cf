"""Pass specs (hybridrl.workers.pass_specs) and the per-worker batch sizes they take
(hybridrl.config.batch_sizes.worker_batch_sizes): built once from the config sections, as the
workers build them in init_model, with verl's fallbacks."""

import dataclasses

import pytest
import torch

from hybridrl.config.batch_sizes import WorkerBatchSizes, worker_batch_sizes
from hybridrl.errors import ConfigError
from hybridrl.protocol import DataProto
from hybridrl.workers.pass_specs import ForwardSpec, LogProbSpec, UpdateSpec, critic_specs, policy_specs
from tests.tiny_models import ppo_section

ACTOR = {"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 2, "ppo_epochs": 3}


def _policy(actor=None, rollout=None, ref=None, model=None):
    return ppo_section(
        "actor_rollout_ref",
        {"actor": {**ACTOR, **(actor or {})}, "rollout": rollout or {}, "ref": ref or {}, "model": model or {}},
    )


# ----------------------------------------------------------------------------- worker_batch_sizes


def test_worker_batch_sizes_are_a_frozen_dataclass_of_responses_per_worker():
    actor = _policy().actor
    sizes = worker_batch_sizes(actor, rollout_n=5, dp=2)  # 4 prompts x 5 responses / 2 workers
    assert sizes == WorkerBatchSizes(ppo_mini_batch_size=10, ppo_micro_batch_size_per_gpu=2)
    assert sizes.forward_micro_batch_size_per_gpu is None  # an actor has no values pass
    with pytest.raises(dataclasses.FrozenInstanceError):
        sizes.ppo_mini_batch_size = 1
    assert actor.ppo_mini_batch_size == 4  # the section stays as configured


def test_worker_batch_sizes_dynamic_bsz_micro_batch_is_the_mini_batch():
    actor = _policy(actor={"ppo_micro_batch_size_per_gpu": None, "use_dynamic_bsz": True}).actor
    assert worker_batch_sizes(actor, 2, 1) == WorkerBatchSizes(8, 8)


def test_worker_batch_sizes_deprecated_global_micro_batch_is_divided_by_the_workers():
    actor = _policy(actor={"ppo_micro_batch_size_per_gpu": None, "ppo_micro_batch_size": 4}).actor
    assert worker_batch_sizes(actor, 2, 2).ppo_micro_batch_size_per_gpu == 2


def test_worker_batch_sizes_critic_forward_micro_batch():
    critic = ppo_section("critic", {"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 2})
    assert worker_batch_sizes(critic, 1, 1).forward_micro_batch_size_per_gpu == 2  # follows the training one
    critic = ppo_section(
        "critic", {"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 2, "forward_micro_batch_size_per_gpu": 4}
    )
    assert worker_batch_sizes(critic, 1, 1) == WorkerBatchSizes(4, 2, 4)


def test_worker_batch_sizes_keeps_the_batch_size_rules():
    with pytest.raises(ConfigError, match="do not split into micro batches of 3"):
        worker_batch_sizes(_policy(actor={"ppo_micro_batch_size_per_gpu": 3}).actor, 1, 1)


def test_with_sequence_parallelism_the_micro_batch_splits_a_groups_rows():
    # verl's run_deepseek7b_llm_sp2.sh: 8 workers, SP 2, 32 responses a worker, micro batch 64
    sizes = {"ppo_mini_batch_size": 256, "ppo_micro_batch_size_per_gpu": 64, "ulysses_sequence_parallel_size": 2}
    assert worker_batch_sizes(ppo_section("critic", sizes), 1, 8) == WorkerBatchSizes(32, 64, 64)
    with pytest.raises(ConfigError, match="8 workers x 2 = 64 responses per sequence-parallel group"):
        worker_batch_sizes(ppo_section("critic", {**sizes, "ppo_micro_batch_size_per_gpu": 48}), 1, 8)


# ----------------------------------------------------------------------------- policy_specs


def test_policy_specs_from_the_sections():
    config = _policy(
        rollout={"temperature": 0.7, "log_prob_micro_batch_size_per_gpu": 3},
        ref={"log_prob_micro_batch_size_per_gpu": 5, "log_prob_max_token_len_per_gpu": 999},
        actor={"calculate_sum_pi_squared": True, "ppo_max_token_len_per_gpu": 777},
        model={"use_remove_padding": True},
    )
    specs = policy_specs(config, worker_batch_sizes(config.actor, 2, 1), world_size=1)
    assert specs.log_prob == LogProbSpec(
        micro_batch_size=3,
        use_dynamic_bsz=False,
        max_token_len=777,  # log_prob_max_token_len_per_gpu follows the actor's budget
        max_token_len_key="actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
        use_remove_padding=True,
        temperature=0.7,
        calculate_entropy=True,
        calculate_sum_pi_squared=True,
    )
    assert specs.ref_log_prob == LogProbSpec(
        micro_batch_size=5,
        max_token_len=999,
        max_token_len_key="actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
        use_remove_padding=True,
        temperature=0.7,  # the rollout's: the reference scores the samples as they were drawn
    )
    assert specs.update == UpdateSpec(
        ppo_mini_batch_size=8,
        ppo_micro_batch_size_per_gpu=2,
        ppo_epochs=3,
        ppo_max_token_len_per_gpu=777,
        max_token_len_key="actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
        temperature=0.7,
        use_remove_padding=True,
    )


def test_log_prob_micro_batch_fallbacks():
    """log_prob_micro_batch_size_per_gpu, else the deprecated global one / workers (at least 1),
    else the actor's training micro batch."""
    config = _policy(rollout={"log_prob_micro_batch_size": 6}, ref={"log_prob_micro_batch_size": 1})
    specs = policy_specs(config, worker_batch_sizes(config.actor, 2, 2), world_size=2)
    assert specs.log_prob.micro_batch_size == 3  # 6 // 2
    assert specs.ref_log_prob.micro_batch_size == 1  # 1 // 2 is 0: at least 1
    config = _policy()
    specs = policy_specs(config, worker_batch_sizes(config.actor, 1, 1), world_size=1)
    assert specs.log_prob.micro_batch_size == specs.ref_log_prob.micro_batch_size == 2  # the actor's


def test_log_prob_dynamic_bsz_follows_the_rollout_and_ref_keys():
    config = _policy(
        actor={"use_dynamic_bsz": True, "ppo_micro_batch_size_per_gpu": None},
        rollout={"log_prob_max_token_len_per_gpu": 64},
    )
    specs = policy_specs(config, worker_batch_sizes(config.actor, 1, 1), world_size=1)
    assert specs.log_prob.use_dynamic_bsz and specs.ref_log_prob.use_dynamic_bsz and specs.update.use_dynamic_bsz
    assert specs.log_prob.max_token_len == 64
    assert specs.update.ppo_micro_batch_size_per_gpu == 4  # the whole mini batch: cut by tokens


def test_specs_are_frozen():
    config = _policy()
    specs = policy_specs(config, worker_batch_sizes(config.actor, 1, 1), world_size=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        specs.log_prob.temperature = 2.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        specs.update.ppo_epochs = 2


# ----------------------------------------------------------------------------- critic_specs


def test_critic_specs_from_the_section():
    critic = ppo_section(
        "critic",
        {
            "ppo_mini_batch_size": 4,
            "ppo_micro_batch_size_per_gpu": 1,
            "forward_micro_batch_size_per_gpu": 4,
            "forward_max_token_len_per_gpu": 50,
            "ppo_max_token_len_per_gpu": 40,
            "ppo_epochs": 2,
            "model": {"use_remove_padding": True},
        },
    )
    specs = critic_specs(critic, worker_batch_sizes(critic, 2, 2))
    assert specs.values == ForwardSpec(
        micro_batch_size=4,
        max_token_len=50,
        max_token_len_key="critic.forward_max_token_len_per_gpu",
        use_remove_padding=True,
    )
    assert specs.update == UpdateSpec(
        ppo_mini_batch_size=4,
        ppo_micro_batch_size_per_gpu=1,
        ppo_epochs=2,
        ppo_max_token_len_per_gpu=40,
        max_token_len_key="critic.ppo_max_token_len_per_gpu",
        use_remove_padding=True,
    )


# ----------------------------------------------------------------------------- micro_batches


def _rows(lengths):
    mask = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    return DataProto.from_dict(tensors={"attention_mask": mask})


def test_micro_batches_by_rows_or_by_tokens_scaled_over_the_sp_group():
    data = _rows([5, 5, 5, 5])
    micros, order = ForwardSpec(micro_batch_size=3).micro_batches(data)
    assert [len(m) for m in micros] == [3, 1] and order is None
    spec = ForwardSpec(micro_batch_size=3, use_dynamic_bsz=True, max_token_len=10, max_token_len_key="k.budget")
    assert len(spec.micro_batches(data)[0]) == 2  # 20 tokens, 10 per forward
    assert len(spec.micro_batches(data, sp_size=2)[0]) == 1  # an SP group of 2: 20 tokens per forward
    update = UpdateSpec(4, 4, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=4, max_token_len_key="k.update")
    with pytest.raises(ConfigError, match="k.update=4 is smaller than a 5-token sequence"):
        update.micro_batches(data)
