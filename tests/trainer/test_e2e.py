"""End-to-end: GRPO and PPO (GAE + critic) runs on a tiny random-init model with the real
SmolLM2 tokenizer and real GSM8K prompts, through the same entry point users call."""

import json
import os

import pytest

from hybridrl.trainer.main_ppo import main


# The tiny random model never solves GSM8K: a custom reward that varies with the response gives
# the update a signal (and exercises custom_reward_function.path/name).
REWARD_FILE = """
def length_reward(data_source, solution_str, ground_truth, extra_info=None):
    return (len(solution_str) % 7) / 7.0
"""


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("reward") / "my_reward.py"
    path.write_text(REWARD_FILE)
    return path


def _overrides(data_dir, model_dir, out_dir, *extra):
    return [
        f"data.train_files={data_dir}/train.parquet",
        f"data.val_files={data_dir}/test.parquet",
        "data.train_batch_size=4",
        "data.val_batch_size=8",
        "data.max_prompt_length=256",
        "data.filter_overlong_prompts=True",
        "data.max_response_length=12",
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "trainer.device=cpu",
        "trainer.logger=['console','file']",
        f"trainer.default_local_dir={out_dir}",
        "trainer.total_training_steps=2",
        "trainer.test_freq=2",
        *extra,
    ]


def _read_metrics(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


GRPO = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.actor.entropy_coeff=0.01"]


def test_grpo_two_steps_write_verl_metrics(gsm8k_parquet, tiny_model_dir, tmp_path, reward_file, capsys):
    out = tmp_path / "run"
    custom = [f"custom_reward_function.path={reward_file}", "custom_reward_function.name=length_reward"]
    assert main(_overrides(gsm8k_parquet, tiny_model_dir, out, *GRPO, *custom, "trainer.save_freq=2")) == 0
    # the run ends by saying where everything is and what to do next
    summary = capsys.readouterr().out.split("hybridrl: done after step 2. Run folder: ")[1]
    assert f"{out / 'metrics.jsonl'}   (plot: hybridrl plot {out}" in summary and "config.yaml" in summary
    assert f"checkpoint:  {out / 'global_step_2'}" in summary and "hybridrl merge --local_dir" in summary
    rows = _read_metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2]  # validation before training, then two steps
    assert "val-core/openai/gsm8k/reward/mean@1" in rows[0]
    for row in rows[1:]:
        for key in ("critic/score/mean", "critic/rewards/mean", "critic/advantages/mean", "actor/pg_loss",
                    "actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy", "actor/grad_norm", "actor/lr",
                    "actor/kl_loss", "response_length/mean", "response_length/clip_ratio",
                    "prompt_length/mean", "timing_s/gen", "timing_s/update_actor", "timing_s/ref",
                    "perf/throughput", "perf/time_per_step"):
            assert key in row, key
        assert row["actor/grad_norm"] > 0
        assert row["critic/advantages/max"] > 0 > row["critic/advantages/min"]
        assert 0 < row["response_length/mean"] <= 12
    assert "val-core/openai/gsm8k/reward/mean@1" in rows[2]
    assert not any(k.startswith("critic/values") for k in rows[1])


def test_ppo_with_critic_two_steps(gsm8k_parquet, tiny_model_dir, tmp_path, reward_file):
    out = tmp_path / "run"
    extra = [f"custom_reward_function.path={reward_file}", "custom_reward_function.name=length_reward",
             "algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=True", "trainer.val_before_train=False",
             "critic.ppo_micro_batch_size_per_gpu=2", "critic.optim.lr=1e-3"]
    assert main(_overrides(gsm8k_parquet, tiny_model_dir, out, *extra)) == 0
    rows = _read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["critic/score/mean"] > 0  # the custom reward was used
    for key in ("critic/values/mean", "critic/vf_loss", "critic/vf_clipfrac", "critic/returns/mean",
                "critic/vf_explained_var", "actor/reward_kl_penalty", "timing_s/values", "timing_s/update_critic"):
        assert key in rows[0], key
    # the zero-initialised value head has been trained after the first critic update
    assert rows[0]["critic/values/mean"] == 0.0
    assert rows[0]["critic/vf_loss"] > 0
    assert rows[1]["critic/values/mean"] != 0.0


def test_resume_continues_at_the_next_step_as_if_never_stopped(gsm8k_parquet, tiny_model_dir, tmp_path, reward_file):
    custom = [f"custom_reward_function.path={reward_file}", "custom_reward_function.name=length_reward"]
    common = [*GRPO, *custom, "trainer.val_before_train=False", "trainer.test_freq=-1"]
    out = tmp_path / "run"
    base = _overrides(gsm8k_parquet, tiny_model_dir, out, *common, "trainer.save_freq=1")
    assert main(base) == 0
    assert (out / "global_step_2" / "actor").is_dir()
    assert (out / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert main(base + ["trainer.total_training_steps=3"]) == 0
    rows = _read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert (out / "global_step_3").is_dir()

    # The same three steps without stopping: step 3 sees the same batch, weights, optimizer
    # state and sampling RNG, so it produces the same numbers.
    straight = tmp_path / "straight"
    assert main(_overrides(gsm8k_parquet, tiny_model_dir, straight, *common, "trainer.total_training_steps=3")) == 0
    expected = _read_metrics(straight)[2]
    for key in ("critic/score/mean", "response_length/mean", "prompt_length/mean", "actor/entropy",
                "actor/pg_loss", "actor/grad_norm", "actor/lr"):
        assert rows[2][key] == pytest.approx(expected[key], rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize("bad, message", [
    (["data.train_files=/nonexistent/train.parquet"], "data.train_files"),
    (["algorithm.adv_estimator=nope"], "algorithm.adv_estimator"),
    (["actor_rollout_ref.actor.ppo_mini_batch_size=3"], "ppo_mini_batch_size"),
    (["custom_reward_function.path=/nonexistent/reward.py"], "custom_reward_function.path"),
])
def test_bad_input_gets_one_line(gsm8k_parquet, tiny_model_dir, tmp_path, capsys, bad, message):
    assert main(_overrides(gsm8k_parquet, tiny_model_dir, tmp_path, "algorithm.adv_estimator=grpo", *bad)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hybridrl: error:") and message in err[0], err


def test_data_without_ground_truth_stops_at_start_up(tiny_model_dir, tmp_path, capsys):
    import pandas as pd

    data = tmp_path / "no_rm.parquet"
    pd.DataFrame({"prompt": [[{"role": "user", "content": "1+1?"}]] * 4, "data_source": ["x"] * 4}).to_parquet(data)
    args = [f"data.train_files={data}", "data.val_files=null", f"actor_rollout_ref.model.path={tiny_model_dir}",
            "data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2", "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2",
            "trainer.device=cpu", f"trainer.default_local_dir={tmp_path / 'run'}"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hybridrl: error: data.train_files: row 0 of ") and "has no reward_model column" in err
    assert "\n" not in err and not (tmp_path / "run").exists()  # before any model or run folder
