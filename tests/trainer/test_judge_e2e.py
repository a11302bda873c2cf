"""End-to-end: a GRPO step scored by an LLM judge (reward_model.reward_manager=judge), the tiny
random model being both the policy and the judge, through the entry point users call."""

import json
import os

import pytest

from hybridrl.trainer.main_ppo import main

# The random judge answers noise; this parser turns any answer into a score that varies with it.
PARSER = """
def parse_score(judge_text, **row):
    return (len(judge_text) % 5) / 4.0
"""


@pytest.mark.slow
def test_grpo_step_with_a_judge(gsm8k_parquet, tiny_model_dir, tmp_path, capsys):
    parser = tmp_path / "parser.py"
    parser.write_text(PARSER)
    out = tmp_path / "run"
    code = main(
        [
            f"data.train_files={gsm8k_parquet}/train.parquet",
            f"data.val_files={gsm8k_parquet}/test.parquet",
            "data.train_batch_size=4",
            "data.max_prompt_length=256",
            "data.filter_overlong_prompts=True",
            "data.max_response_length=8",
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
            "algorithm.adv_estimator=grpo",
            "trainer.device=cpu",
            "trainer.logger=['file']",
            f"trainer.default_local_dir={out}",
            "trainer.total_training_steps=1",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.val_before_train=False",
            "reward_model.reward_manager=judge",
            f"reward.reward_model.model_path={tiny_model_dir}",
            "reward_model.rollout.response_length=6",
            f"reward_model.judge.score_parser.path={parser}",
            "reward_model.use_reward_loop=true",
        ]
    )
    assert code == 0, capsys.readouterr()
    printed = capsys.readouterr().out
    assert "reward_model.use_reward_loop=True is ignored" in printed
    with open(os.path.join(out, "metrics.jsonl")) as f:
        metrics = [json.loads(line) for line in f][-1]
    assert 0 <= metrics["critic/score/mean"] <= 1 and "timing_s/reward" in metrics
