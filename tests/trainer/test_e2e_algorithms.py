"""Every advantage estimator and every policy-loss mode trains for a step through the CLI entry
point on the tiny model (issue: the algorithm library). Runs are paired (estimator i with loss
i mod 7) so that each name is covered once without a 9 x 7 grid; the KL forms and the loss
aggregation modes ride along on some of the runs."""

import json
import math
import os

import pytest

from hybridrl.algorithms import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY
from hybridrl.trainer.main_ppo import main

ESTIMATORS = [
    "gae",
    "grpo",
    "grpo_passk",
    "rloo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "opo",
    "gpg",
]
LOSSES = ["vanilla", "gspo", "gpg", "clip_cov", "kl_cov", "geo_mean", "cispo"]
A, ALGO = "actor_rollout_ref.actor", "algorithm"
# Extra settings per run index: KL in the reward (full / k3 / adaptive), KL losses incl. the
# straight-through and full forms, the four loss_agg_modes, Dr. GRPO.
EXTRAS = {
    0: [f"{ALGO}.use_kl_in_reward=True", f"{ALGO}.kl_penalty=full", f"{ALGO}.kl_ctrl.type=adaptive"],
    1: [f"{A}.use_kl_loss=True", f"{A}.kl_loss_type=k3+", f"{A}.loss_agg_mode=seq-mean-token-mean"],
    2: [f"{ALGO}.norm_adv_by_std_in_grpo=False", f"{A}.loss_agg_mode=seq-mean-token-sum-norm"],
    3: [f"{A}.use_kl_loss=True", f"{A}.kl_loss_type=full", f"{A}.loss_agg_mode=seq-mean-token-sum"],
    4: [f"{ALGO}.use_kl_in_reward=True", f"{ALGO}.kl_penalty=low_var_kl", f"{A}.entropy_coeff=0.01"],
    5: [f"{A}.use_kl_loss=True", f"{A}.kl_loss_type=mse"],
}
RUNS = [(i, est, LOSSES[i % len(LOSSES)]) for i, est in enumerate(ESTIMATORS)]

REWARD_FILE = """
def length_reward(data_source, solution_str, ground_truth, extra_info=None):
    return (len(solution_str) % 7) / 7.0
"""


def test_the_runs_cover_every_registered_name():
    assert set(ESTIMATORS) <= set(ADV_ESTIMATOR_REGISTRY)
    assert set(LOSSES) <= set(POLICY_LOSS_REGISTRY)
    assert {est for _, est, _ in RUNS} == set(ESTIMATORS) and {loss for *_, loss in RUNS} == set(LOSSES)


@pytest.mark.slow
@pytest.mark.cuda
@pytest.mark.parametrize("index, estimator, loss_mode", RUNS, ids=[f"{e}-{m}" for _, e, m in RUNS])
def test_one_training_step(index, estimator, loss_mode, gsm8k_parquet, tiny_model_dir, tmp_path, device):
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD_FILE)
    out = tmp_path / "run"
    overrides = [
        f"data.train_files={gsm8k_parquet}/train.parquet",
        "data.val_files=null",
        "data.train_batch_size=4",
        "data.max_prompt_length=256",
        "data.filter_overlong_prompts=True",
        "data.max_response_length=8",
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        f"{A}.ppo_mini_batch_size=2",
        f"{A}.ppo_micro_batch_size_per_gpu=4",
        f"{A}.optim.lr=1e-3",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
        f"critic.model.path={tiny_model_dir}",
        "critic.ppo_micro_batch_size_per_gpu=4",
        f"{ALGO}.adv_estimator={estimator}",
        f"{A}.policy_loss.loss_mode={loss_mode}",
        f"custom_reward_function.path={reward}",
        "custom_reward_function.name=length_reward",
        f"trainer.device={device}",
        "trainer.logger=['file']",
        f"trainer.default_local_dir={out}",
        "trainer.total_training_steps=1",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.val_before_train=False",
        *EXTRAS.get(index, []),
    ]
    assert main(overrides) == 0
    with open(os.path.join(out, "metrics.jsonl")) as f:
        (row,) = [json.loads(line) for line in f]
    for key in (
        "actor/pg_loss",
        "actor/pg_clipfrac",
        "actor/ppo_kl",
        "actor/grad_norm",
        "critic/advantages/mean",
        "critic/score/mean",
    ):
        assert math.isfinite(row[key]), key
    assert row["actor/grad_norm"] > 0
    if estimator == "gae":
        assert "critic/vf_loss" in row and "critic/vf_explained_var" in row
        assert "actor/reward_kl_penalty" in row and "actor/reward_kl_penalty_coeff" in row
    if estimator == "remax":
        assert "timing_s/gen_max" in row
    if any("use_kl_loss=True" in extra for extra in EXTRAS.get(index, [])):
        assert row["actor/kl_loss"] >= 0


USER_ESTIMATOR = """
import torch
from hybridrl.algorithms import register_adv_est

@register_adv_est("score_minus_half")
def score_minus_half(token_level_rewards, response_mask, **kwargs):
    adv = (token_level_rewards.sum(-1, keepdim=True) - 0.5) * response_mask
    return adv, adv
"""


@pytest.mark.slow
@pytest.mark.cuda
def test_estimator_registered_by_external_lib_is_found_at_start_up(
    gsm8k_parquet, tiny_model_dir, tmp_path, monkeypatch, device
):
    (tmp_path / "my_algos.py").write_text(USER_ESTIMATOR)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    assert (
        main(
            [
                f"data.train_files={gsm8k_parquet}/train.parquet",
                "data.val_files=null",
                "data.train_batch_size=2",
                "data.max_prompt_length=256",
                "data.filter_overlong_prompts=True",
                "data.max_response_length=4",
                f"actor_rollout_ref.model.path={tiny_model_dir}",
                "actor_rollout_ref.model.external_lib=my_algos",
                f"{A}.ppo_mini_batch_size=2",
                f"{A}.ppo_micro_batch_size_per_gpu=2",
                "actor_rollout_ref.rollout.n=1",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
                f"{ALGO}.adv_estimator=score_minus_half",
                f"trainer.device={device}",
                "trainer.logger=['file']",
                f"trainer.default_local_dir={out}",
                "trainer.total_training_steps=1",
                "trainer.val_before_train=False",
                "trainer.test_freq=-1",
                "trainer.save_freq=-1",
            ]
        )
        == 0
    )
