"""verl's torch profiler tool end to end (issue 34, item 2): a PPO run with ``global_profiler.tool=torch``
writes one Chrome trace per process for each chosen step; a run without profiling writes nothing."""

import json

import pytest

from hybridrl.trainer.main_ppo import main

pytestmark = pytest.mark.slow  # trains through main()


def _overrides(data_dir, model_dir, out_dir, *extra):
    return [
        f"data.train_files={data_dir}/train.parquet",
        f"data.val_files={data_dir}/test.parquet",
        "data.train_batch_size=2",
        "data.max_prompt_length=256",
        "data.filter_overlong_prompts=True",
        "data.max_response_length=8",
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "algorithm.adv_estimator=gae",
        "critic.ppo_micro_batch_size_per_gpu=2",
        "trainer.device=cpu",
        "trainer.logger=['file']",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        f"trainer.default_local_dir={out_dir}",
        "trainer.total_training_steps=2",
        *extra,
    ]


def test_a_chosen_step_writes_a_trace_of_the_actor_and_critic(gsm8k_head, tiny_model_dir, tmp_path):
    profile = tmp_path / "profile"
    extra = [
        "global_profiler.tool=torch",
        "global_profiler.steps=[2]",
        f"global_profiler.save_path={profile}",
        "actor_rollout_ref.actor.profiler.enable=True",
        "critic.profiler.enable=True",
    ]
    assert main(_overrides(gsm8k_head(4), tiny_model_dir, tmp_path / "run", *extra)) == 0
    assert [p.name for p in profile.iterdir()] == ["step_2"]  # step 1 was not chosen
    # the local backend runs the actor and the critic in one process: one trace holds both
    (trace,) = (profile / "step_2").iterdir()
    assert trace.name == "actor_rollout+critic_rank0.json"  # the policy worker (no reference here), the critic
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(event.get("name") == "aten::mm" for event in events)


def test_without_profiling_nothing_is_written(gsm8k_head, tiny_model_dir, tmp_path):
    profile = tmp_path / "profile"
    extra = ["global_profiler.steps=[1, 2]", f"global_profiler.save_path={profile}"]  # tool null: off
    assert main(_overrides(gsm8k_head(4), tiny_model_dir, tmp_path / "run", *extra)) == 0
    assert not profile.exists()
