"""End-to-end: GRPO and PPO (GAE + critic) runs on a tiny random-init model with the real
SmolLM2 tokenizer and real GSM8K prompts, through the same entry point users call."""

import json
import os

import pytest

from hybridrl.trainer.main_ppo import main
from hybridrl.workers.memory import MEMORY_METRICS

# End to end through the CLI's main(): every test builds the workers or trains (the slow tier).
pytestmark = [pytest.mark.slow, pytest.mark.cuda]

# The tiny random model never solves GSM8K: a custom reward that varies with the response gives
# the update a signal (and exercises custom_reward_function.path/name).
REWARD_FILE = """
def length_reward(data_source, solution_str, ground_truth, extra_info=None):
    return (len(solution_str) % 7) / 7.0


def flaky_reward(data_source, solution_str, ground_truth, extra_info=None):
    if len(solution_str) % 2:
        raise ValueError("the judge could not parse this response")
    return (len(solution_str) % 7) / 7.0


def parts_reward(data_source, solution_str, ground_truth, extra_info=None):
    parts = {"length": (len(solution_str) % 7) / 7.0, "vowels": float(sum(c in "aeiou" for c in solution_str) % 3)}
    return {"score": parts["length"] + parts["vowels"], **parts}
"""


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("reward") / "my_reward.py"
    path.write_text(REWARD_FILE)
    return path


def _overrides(device, data_dir, model_dir, out_dir, *extra):
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
        f"trainer.device={device}",
        "trainer.logger=['console','file']",
        f"trainer.default_local_dir={out_dir}",
        "trainer.total_training_steps=2",
        "trainer.test_freq=2",
        *extra,
    ]


def _read_metrics(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


GRPO = [
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.entropy_coeff=0.01",
]


def test_grpo_two_steps_write_verl_metrics(gsm8k_parquet, tiny_model_dir, tmp_path, reward_file, capsys, device):
    out = tmp_path / "run"
    custom = [f"custom_reward_function.path={reward_file}", "custom_reward_function.name=length_reward"]
    assert main(_overrides(device, gsm8k_parquet, tiny_model_dir, out, *GRPO, *custom, "trainer.save_freq=2")) == 0
    # the run ends by saying where everything is and what to do next
    summary = capsys.readouterr().out.split("hybridrl: done after step 2. Run folder: ")[1]
    assert f"{out / 'metrics.jsonl'}   (plot: hybridrl plot {out}" in summary and "config.yaml" in summary
    assert f"checkpoint:  {out / 'global_step_2'}" in summary and "hybridrl merge --local_dir" in summary
    rows = _read_metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2]  # validation before training, then two steps
    assert "val-core/openai/gsm8k/reward/mean@1" in rows[0]
    for row in rows[1:]:
        for key in (
            "critic/score/mean",
            "critic/rewards/mean",
            "critic/advantages/mean",
            "actor/pg_loss",
            "actor/pg_clipfrac",
            "actor/ppo_kl",
            "actor/entropy",
            "actor/grad_norm",
            "actor/lr",
            "actor/kl_loss",
            "response_length/mean",
            "response_length/clip_ratio",
            "prompt_length/mean",
            "timing_s/gen",
            "timing_s/update_actor",
            "timing_s/ref",
            "perf/throughput",
            "perf/time_per_step",
            *MEMORY_METRICS,
        ):
            assert key in row, key
        peak, used = row["perf/max_memory_allocated_gb"], row["perf/cpu_memory_used_gb"]
        if device == "cpu":  # both peaks are the process's peak resident memory (the local backend: the driver's own)
            assert peak == row["perf/max_memory_reserved_gb"] >= used > 0
        else:  # the GPU's allocator: what it reserved holds what it allocated
            assert row["perf/max_memory_reserved_gb"] >= peak > 0 and used > 0
        assert row["actor/grad_norm"] > 0
        assert row["critic/advantages/max"] > 0 > row["critic/advantages/min"]
        assert 0 < row["response_length/mean"] <= 12
    assert "val-core/openai/gsm8k/reward/mean@1" in rows[2]
    assert not any(k.startswith("critic/values") for k in rows[1])


def test_ppo_with_critic_two_steps(gsm8k_parquet, tiny_model_dir, tmp_path, reward_file, device):
    out = tmp_path / "run"
    extra = [
        f"custom_reward_function.path={reward_file}",
        "custom_reward_function.name=length_reward",
        "algorithm.adv_estimator=gae",
        "algorithm.use_kl_in_reward=True",
        "trainer.val_before_train=False",
        "critic.ppo_micro_batch_size_per_gpu=2",
        "critic.optim.lr=1e-3",
    ]
    assert main(_overrides(device, gsm8k_parquet, tiny_model_dir, out, *extra)) == 0
    rows = _read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["critic/score/mean"] > 0  # the custom reward was used
    for key in (
        "critic/values/mean",
        "critic/vf_loss",
        "critic/vf_clipfrac",
        "critic/returns/mean",
        "critic/vf_explained_var",
        "actor/reward_kl_penalty",
        "timing_s/values",
        "timing_s/update_critic",
        *MEMORY_METRICS,
    ):
        assert key in rows[0], key
    # the zero-initialised value head has been trained after the first critic update
    assert rows[0]["critic/values/mean"] == 0.0
    assert rows[0]["critic/vf_loss"] > 0
    assert rows[1]["critic/values/mean"] != 0.0


def test_resume_continues_at_the_next_step_as_if_never_stopped(
    gsm8k_parquet, tiny_model_dir, tmp_path, reward_file, capsys, device
):
    custom = [f"custom_reward_function.path={reward_file}", "custom_reward_function.name=length_reward"]
    common = [*GRPO, *custom, "trainer.val_before_train=False", "trainer.test_freq=-1"]
    out = tmp_path / "run"
    base = _overrides(device, gsm8k_parquet, tiny_model_dir, out, *common, "trainer.save_freq=1")
    assert main(base) == 0
    assert (out / "global_step_2" / "actor").is_dir()
    assert (out / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert main(base + ["trainer.total_training_steps=3"]) == 0
    rows = _read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert (out / "global_step_3").is_dir()
    # the finished run launched again, with another lr and micro batch: one line each, nothing trains
    capsys.readouterr()
    changed = ["actor_rollout_ref.actor.optim.lr=2e-3", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"]
    assert main(base + ["trainer.total_training_steps=3", *changed]) == 0
    out_text = capsys.readouterr().out
    assert "hybridrl: the run is complete: its checkpoint is at step 3 of trainer.total_training_steps=3" in out_text
    assert (
        "with a changed config: actor_rollout_ref.actor.optim.lr 0.001 -> 0.002, "
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu 2 -> 1\n"
    ) in out_text
    assert _read_metrics(out) == rows and not (out / "global_step_4").exists()

    # The same three steps without stopping: step 3 sees the same batch, weights, optimizer
    # state and sampling RNG, so it produces the same numbers.
    straight = tmp_path / "straight"
    assert (
        main(_overrides(device, gsm8k_parquet, tiny_model_dir, straight, *common, "trainer.total_training_steps=3"))
        == 0
    )
    expected = _read_metrics(straight)[2]
    rel = 1e-4 if device == "cpu" else 1e-3  # a GPU's kernels need not add in the same order each run
    for key in (
        "critic/score/mean",
        "response_length/mean",
        "prompt_length/mean",
        "actor/entropy",
        "actor/pg_loss",
        "actor/grad_norm",
        "actor/lr",
    ):
        assert rows[2][key] == pytest.approx(expected[key], rel=rel, abs=1e-6), key


# verl-recipe dapo/run_dapo_qwen2.5_32b.sh, sizes cut to the tiny model; only the module differs
DAPO = [
    "data.gen_batch_size=4",
    "data.truncation=left",
    "algorithm.adv_estimator=grpo",
    "algorithm.use_kl_in_reward=False",
    "algorithm.kl_ctrl.kl_coef=0.0",
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.actor.kl_loss_coef=0.0",
    "actor_rollout_ref.actor.clip_ratio_low=0.2",
    "actor_rollout_ref.actor.clip_ratio_high=0.28",
    "actor_rollout_ref.actor.clip_ratio_c=10.0",
    "algorithm.filter_groups.enable=True",
    "algorithm.filter_groups.max_num_gen_batches=10",
    "algorithm.filter_groups.metric=acc",
    "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=512",
    "actor_rollout_ref.actor.optim.lr_warmup_steps=1",
    "actor_rollout_ref.actor.optim.weight_decay=0.1",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.actor.grad_clip=1.0",
    "actor_rollout_ref.actor.loss_agg_mode=token-mean",
    "actor_rollout_ref.rollout.temperature=1.0",
    "actor_rollout_ref.rollout.top_p=1.0",
    "reward_model.reward_manager=dapo",
    "reward_model.overlong_buffer.enable=True",
    "reward_model.overlong_buffer.len=4",
    "reward_model.overlong_buffer.penalty_factor=1.0",
    "trainer.val_before_train=False",
    "data.train_batch_size=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
]


def test_the_dapo_recipe_trains_two_steps(gsm8k_parquet, tiny_model_dir, tmp_path, reward_file, device):
    out = tmp_path / "run"
    custom = [f"custom_reward_function.path={reward_file}", "custom_reward_function.name=length_reward"]
    assert main(_overrides(device, gsm8k_parquet, tiny_model_dir, out, *custom, *DAPO)) == 0
    rows = _read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["train/num_gen_batches"] >= 1
        # overlong shaping: the untrained model fills the 12 response tokens, the last 4 are the buffer,
        # so its responses lose up to 1 (length_reward alone is in [0, 1))
        assert row["critic/score/min"] < 0 and row["response_length/max"] > 12 - 4
        assert row["actor/grad_norm"] > 0


@pytest.mark.parametrize(
    "extra",
    [
        ["actor_rollout_ref.actor.policy_loss.loss_mode=sapo"],
        ["actor_rollout_ref.actor.policy_loss.loss_mode=dppo_tv"],
        ["actor_rollout_ref.actor.policy_loss.loss_mode=dppo_kl"],
        ["actor_rollout_ref.actor.policy_loss.loss_mode=dro", "actor_rollout_ref.actor.policy_loss.dro_beta=0.1"],
        ["actor_rollout_ref.actor.loss_agg_mode=token-sum"],
        ["algorithm.adv_estimator=grpo_vectorized"],
        ["algorithm.adv_estimator=rloo_vectorized"],
        [
            "algorithm.adv_estimator=gdpo",
            "custom_reward_function.name=parts_reward",
            "algorithm.gdpo_reward_keys=[length,vowels]",
            "algorithm.gdpo_reward_weights=[1.0,0.5]",
        ],
        ["algorithm.adv_estimator=optimal_token_baseline", "actor_rollout_ref.actor.calculate_sum_pi_squared=true"],
        ["algorithm.adv_estimator=tir_optimal_token_baseline", "actor_rollout_ref.actor.calculate_sum_pi_squared=true"],
    ],
    ids=[
        "sapo",
        "dppo_tv",
        "dppo_kl",
        "dro",
        "token_sum",
        "grpo_vectorized",
        "rloo_vectorized",
        "gdpo",
        "otb",
        "tir_otb",
    ],
)
def test_each_new_loss_and_estimator_trains_a_step(gsm8k_parquet, tiny_model_dir, tmp_path, reward_file, extra, device):
    out = tmp_path / "run"
    custom = [f"custom_reward_function.path={reward_file}", "custom_reward_function.name=length_reward"]
    args = _overrides(
        device,
        gsm8k_parquet,
        tiny_model_dir,
        out,
        *GRPO,
        *custom,
        *extra,
        "trainer.val_before_train=False",
        "trainer.total_training_steps=1",
        "trainer.test_freq=-1",
    )
    assert main(args) == 0
    (row,) = _read_metrics(out)
    assert row["actor/grad_norm"] > 0 and row["critic/advantages/max"] > 0 > row["critic/advantages/min"]


@pytest.mark.parametrize(
    "policy, metric", [("mask_sample", "reward/masked_samples"), ("drop_group", "reward/dropped_groups")]
)
def test_a_failing_reward_function_can_mask_or_drop_its_samples(
    gsm8k_parquet, tiny_model_dir, tmp_path, reward_file, policy, metric, device
):
    out = tmp_path / "run"
    args = _overrides(
        device,
        gsm8k_parquet,
        tiny_model_dir,
        out,
        *GRPO,
        f"custom_reward_function.path={reward_file}",
        "custom_reward_function.name=flaky_reward",
        f"reward_model.on_error={policy}",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
    )
    assert main(args) == 0
    rows = _read_metrics(out)
    assert sum(r["reward/error_count"] for r in rows) > 0  # the function did fail on some samples
    assert all(r[metric] > 0 for r in rows if r["reward/error_count"] > 0)


CORRECTION = "algorithm.rollout_correction"


@pytest.mark.parametrize(
    "mode, extra",
    [
        (
            "decoupled",
            [
                f"{CORRECTION}.rollout_is=token",
                f"{CORRECTION}.rollout_rs='token_k1,seq_max_k2'",
                f"{CORRECTION}.rollout_rs_threshold='0.5_2.0,0.5'",
            ],
        ),
        (
            "bypass",
            [
                f"{CORRECTION}.rollout_is=sequence",
                f"{CORRECTION}.bypass_mode=true",
                f"{CORRECTION}.loss_type=reinforce",
            ],
        ),
    ],
)
def test_grpo_with_rollout_correction_logs_its_metrics(
    gsm8k_parquet, tiny_model_dir, tmp_path, reward_file, mode, extra, device
):
    out = tmp_path / "run"
    custom = [f"custom_reward_function.path={reward_file}", "custom_reward_function.name=length_reward"]
    assert (
        main(
            _overrides(
                device, gsm8k_parquet, tiny_model_dir, out, *GRPO, *custom, *extra, "trainer.val_before_train=False"
            )
        )
        == 0
    )
    rows = _read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        for key in (
            "rollout_corr/rollout_is_mean",
            "rollout_corr/rollout_is_eff_sample_size",
            "rollout_corr/kl",
            "rollout_corr/log_ppl_abs_diff",
            "actor/pg_loss",
        ):
            assert key in row, key
        # the HF engine samples with the trained weights: the weights are ~1 and nothing is rejected
        assert row["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=0.05)
        assert row["actor/grad_norm"] > 0
        if mode == "decoupled":
            assert row["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(0.0, abs=0.05)
            assert "timing_s/old_log_prob" in row and "training/rollout_probs_diff_mean" in row
        else:  # no old-log-prob pass; the actor measured the gap of the current policy
            assert "timing_s/old_log_prob" not in row and "training/rollout_probs_diff_mean" not in row
    config = (out / "config.yaml").read_text()
    assert "rollout_correction" in config


def test_rollout_correction_needs_the_engine_log_probs(gsm8k_parquet, tiny_model_dir, tmp_path, capsys, device):
    args = _overrides(
        device,
        gsm8k_parquet,
        tiny_model_dir,
        tmp_path,
        *GRPO,
        f"{CORRECTION}.rollout_is=token",
        "actor_rollout_ref.rollout.calculate_log_probs=false",
    )
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "hybridrl: error: algorithm.rollout_correction: rollout_is=token, rollout_rs=None needs the "
        "engine's log-probs of the sampled tokens; set actor_rollout_ref.rollout.calculate_log_probs=true"
    ]


@pytest.mark.parametrize(
    "bad, message",
    [
        (["data.train_files=/nonexistent/train.parquet"], "data.train_files"),
        (["algorithm.adv_estimator=nope"], "algorithm.adv_estimator"),
        (["actor_rollout_ref.actor.ppo_mini_batch_size=3"], "ppo_mini_batch_size"),
        (["custom_reward_function.path=/nonexistent/reward.py"], "custom_reward_function.path"),
        ([f"{CORRECTION}.rollout_is=tokens"], "rollout_correction.rollout_is='tokens'; valid: token, sequence"),
        ([f"{CORRECTION}.rollout_rs=token_k9"], "rollout_rs option 'token_k9'; valid: token_k1, token_k2"),
        (
            [f"{CORRECTION}.bypass_mode=true", "actor_rollout_ref.actor.policy_loss.loss_mode=gspo"],
            "loss_mode=gspo cannot apply",
        ),
        (["actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode"], "set that instead"),
        (["data.gen_batch_size=8"], "only applies to dynamic sampling"),
        (
            ["algorithm.adv_estimator=optimal_token_baseline"],
            "set actor_rollout_ref.actor.calculate_sum_pi_squared=true",
        ),
        (["algorithm.adv_estimator=gdpo"], "needs algorithm.gdpo_reward_keys"),
        (["actor_rollout_ref.actor.policy_loss.loss_mode=dro"], "needs policy_loss.dro_beta"),
        (["reward_model.overlong_buffer.enable=True"], "set reward_model.reward_manager=dapo"),
        (["reward_model.reward_manager=dapo", "reward_model.overlong_buffer.enable=True"], "overlong_buffer.len=0"),
    ],
)
def test_bad_input_gets_one_line(gsm8k_parquet, tiny_model_dir, tmp_path, capsys, bad, message, device):
    assert main(_overrides(device, gsm8k_parquet, tiny_model_dir, tmp_path, "algorithm.adv_estimator=grpo", *bad)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hybridrl: error:") and message in err[0], err


@pytest.mark.parametrize("which", ["train", "val"])
def test_an_unknown_data_source_stops_at_start_up(gsm8k_parquet, tiny_model_dir, tmp_path, capsys, which, device):
    """A data_source without a reward function is named before any model loads or generates."""
    import pandas as pd

    rows = pd.read_parquet(f"{gsm8k_parquet}/{'train' if which == 'train' else 'test'}.parquet").head(8)
    rows["data_source"] = ["my/dataset"] * 4 + ["openai/gsm8k", "other"] * 2
    data = tmp_path / "unknown.parquet"
    rows.to_parquet(data)
    args = _overrides(device, gsm8k_parquet, tiny_model_dir, tmp_path / "run", *GRPO, f"data.{which}_files={data}")
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(
        f"hybridrl: error: data.{which}_files: no reward function for data_source 'my/dataset', 'other' "
        "(column data.reward_fn_key=data_source); known: "
    ), err
    assert "openai/gsm8k" in err[0] and "custom_reward_function.path" in err[0]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_data_without_ground_truth_stops_at_start_up(tiny_model_dir, tmp_path, capsys, device):
    import pandas as pd

    data = tmp_path / "no_rm.parquet"
    pd.DataFrame({"prompt": [[{"role": "user", "content": "1+1?"}]] * 4, "data_source": ["x"] * 4}).to_parquet(data)
    args = [
        f"data.train_files={data}",
        "data.val_files=null",
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        "data.train_batch_size=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=2",
        f"trainer.device={device}",
        f"trainer.default_local_dir={tmp_path / 'run'}",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hybridrl: error: data.train_files: row 0 of ") and "has no reward_model column" in err
    assert "\n" not in err and not (tmp_path / "run").exists()  # before any model or run folder


def test_a_second_run_on_the_same_folder_stops_at_once_with_one_line(
    gsm8k_parquet, tiny_model_dir, tmp_path, capsys, device
):
    from hybridrl.trainer.run.checkpoint_lock import run_folder_lock

    out = tmp_path / "run"
    with run_folder_lock(str(out)):  # as a running `hybridrl train` holds it
        assert main(_overrides(device, gsm8k_parquet, tiny_model_dir, out, *GRPO)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"hybridrl: error: trainer.default_local_dir={out} is in use"), err
    assert f"pid {os.getpid()}" in err[0] and not (out / "config.yaml").exists()
