"""A real tiny training run that dumps its samples, shared by the plot and viewer tests."""

import contextlib
import io

import pytest

from hybridrl.trainer.main_ppo import main

# The tiny random model never solves GSM8K: a reward that varies with the response gives the
# dumps different scores to sort and filter by.
REWARD_FILE = """
def length_reward(data_source, solution_str, ground_truth, extra_info=None):
    return (len(solution_str) % 7) / 7.0
"""


@pytest.fixture(scope="session")
def dumped_run(gsm8k_parquet, tiny_model_dir, tmp_path_factory):
    """Run dir of a 2-step GRPO run (tiny random model, real GSM8K prompts) with
    `rollout/` and `validation/` sample dumps, `metrics.jsonl`, and its stdout in `stdout.txt`."""
    out = tmp_path_factory.mktemp("dumped_run")
    (out / "my_reward.py").write_text(REWARD_FILE)
    overrides = [
        f"data.train_files={gsm8k_parquet}/train.parquet",
        f"data.val_files={gsm8k_parquet}/test.parquet",
        "data.train_batch_size=2",
        "data.val_batch_size=16",
        "data.max_prompt_length=256",
        "data.filter_overlong_prompts=True",
        "data.max_response_length=8",
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "trainer.device=cpu",
        "trainer.logger=['console','file']",
        f"trainer.default_local_dir={out}",
        "trainer.total_training_steps=2",
        "trainer.test_freq=2",
        "trainer.log_val_generations=2",
        f"trainer.rollout_data_dir={out}/rollout",
        f"trainer.validation_data_dir={out}/validation",
        f"custom_reward_function.path={out}/my_reward.py",
        "custom_reward_function.name=length_reward",
    ]
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(overrides) == 0
    (out / "stdout.txt").write_text(stdout.getvalue())
    return out
