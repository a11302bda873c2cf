"""reward_model.launch_reward_fn_async: scoring overlaps the log-prob passes, gives the same
scores and advantages, waits with a deadline that says what it waited for; with dynamic
sampling it scores first (a start-up note); reward.num_workers is checked at start-up."""

import threading
import time

import pytest
import torch

from hybridrl.config import ConfigError, load_config
from hybridrl.protocol import DataProto
from hybridrl.rewards.manager import RewardFunctionError
from hybridrl.trainer.main_ppo import main
from hybridrl.trainer.ppo import ppo_trainer
from hybridrl.trainer.ppo.async_reward import PendingReward, reward_deadline_s, scores_async
from hybridrl.trainer.ppo.config_check import validate_ppo_config
from tests.trainer.test_e2e import _overrides, reward_file  # noqa: F401  (a fixture)

GRPO = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.n=2",
]


def tiny_batch(rows=2):
    return DataProto.from_dict(
        tensors={"responses": torch.ones(rows, 3, dtype=torch.long)}, non_tensors={"data_source": ["a"] * rows}
    )


class SlowReward:
    def __init__(self, seconds, error=None):
        self.seconds, self.error, self.thread = seconds, error, None

    def __call__(self, data, return_dict=False):
        self.thread = threading.current_thread().name
        time.sleep(self.seconds)
        if self.error:
            raise self.error
        return {"reward_tensor": torch.ones(len(data), 3), "reward_extra_info": {"acc": [1.0] * len(data)}}


def test_scoring_runs_in_a_thread_while_the_driver_works():
    reward = SlowReward(0.5)
    started = time.perf_counter()
    pending = PendingReward(tiny_batch(), reward, deadline_s=10)
    time.sleep(0.5)  # the log-prob passes
    scores, extras = pending.result()
    assert time.perf_counter() - started < 0.9 and reward.thread == "reward-async"
    assert scores.shape == (2, 3) and extras == {"acc": [1.0, 1.0]}


def test_the_wait_has_a_deadline_and_errors_reach_the_driver():
    with pytest.raises(
        RewardFunctionError,
        match=r"launch_reward_fn_async: the scores of the batch \(2 samples\) "
        r"were not ready 0.2 s after scoring started",
    ) as err:
        PendingReward(tiny_batch(), SlowReward(5), deadline_s=0.2).result()
    assert "\n" not in str(err.value)
    with pytest.raises(RewardFunctionError, match="judge down"):
        PendingReward(tiny_batch(), SlowReward(0, RewardFunctionError("judge down")), deadline_s=5).result()


def test_the_deadline_covers_every_call_at_its_timeout():
    cfg = load_config(
        GRPO
        + ["reward_model.timeout_s=10", "reward_model.on_error=retry", "reward_model.retries=1", "reward.num_workers=4"]
    )
    assert reward_deadline_s(cfg, 16) == 2 * 10 * 4 + 60
    assert reward_deadline_s(load_config(GRPO + ["reward_model.timeout_s=10"]), 16) == 10 * 16 + 60


def test_dynamic_sampling_scores_first_with_a_note():
    cfg = load_config(GRPO + ["reward_model.launch_reward_fn_async=true"])
    assert scores_async(cfg) and not any("launch_reward_fn_async" in n for n in validate_ppo_config(cfg))
    cfg = load_config(GRPO + ["reward_model.launch_reward_fn_async=true", "algorithm.filter_groups.enable=true"])
    assert not scores_async(cfg)
    notes = [n for n in validate_ppo_config(cfg) if "launch_reward_fn_async" in n]
    assert len(notes) == 1 and "scoring runs before them" in notes[0] and "DAPO" in notes[0]


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "reward.num_workers=-1",
            r"reward.num_workers=-1 must be a whole number >= 0 \(null, 0 or 1: score in the driver",
        ),
        # a value of the wrong type stops the typed config first, naming the key
        (
            "reward_model.num_workers=two",
            r"reward_model.num_workers: Value 'two' of type 'str' could not be converted "
            r"to Integer",
        ),
        (
            "reward_model.launch_reward_fn_async=maybe",
            r"reward_model.launch_reward_fn_async: Value 'maybe' is not a "
            r"valid bool",
        ),
    ],
)
def test_bad_scoring_keys_are_one_line_at_start_up(override, message):
    with pytest.raises(ConfigError, match=message) as err:
        validate_ppo_config(load_config(GRPO + [override]))
    assert "\n" not in str(err.value)


def _record_steps(monkeypatch):
    """Each step's token_level_scores and advantages, and the batch keys when scoring starts and ends."""
    steps, windows = [], []
    original_metrics = ppo_trainer.compute_data_metrics

    def data_metrics(batch, use_critic=True):
        steps.append({k: batch.batch[k].clone() for k in ("token_level_scores", "advantages", "returns")})
        return original_metrics(batch, use_critic=use_critic)

    class RecordingPending(PendingReward):
        def __init__(self, batch, reward_fn, deadline_s):
            windows.append(("launch", set(batch.batch.keys())))
            super().__init__(batch, reward_fn, deadline_s)

    original_attach = ppo_trainer.PPOTrainer.attach_reward

    def attach(self, batch, reward, metrics):
        windows.append(("attach", set(batch.batch.keys())))
        return original_attach(self, batch, reward, metrics)

    monkeypatch.setattr(ppo_trainer, "compute_data_metrics", data_metrics)
    monkeypatch.setattr(ppo_trainer, "PendingReward", RecordingPending)
    monkeypatch.setattr(ppo_trainer.PPOTrainer, "attach_reward", attach)
    return steps, windows


@pytest.mark.slow
def test_async_scoring_in_a_pool_trains_exactly_like_serial_scoring(
    gsm8k_parquet,
    tiny_model_dir,
    tmp_path,
    reward_file,  # noqa: F811 - the fixture imported above
    monkeypatch,
):
    extra = [
        f"custom_reward_function.path={reward_file}",
        "custom_reward_function.name=parts_reward",
        "algorithm.adv_estimator=gae",
        "algorithm.use_kl_in_reward=True",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "critic.ppo_micro_batch_size_per_gpu=2",
        "critic.optim.lr=1e-3",
    ]
    runs, overlapped_in_a_pool = {}, ["reward_model.launch_reward_fn_async=True", "reward.num_workers=2"]
    for name, keys in {"serial": [], "async": overlapped_in_a_pool}.items():
        with monkeypatch.context() as patch:
            steps, windows = _record_steps(patch)
            assert main(_overrides("cpu", gsm8k_parquet, tiny_model_dir, tmp_path / name, *extra, *keys)) == 0
        runs[name] = (steps, windows)
    (serial, serial_windows), (overlapped, windows) = runs["serial"], runs["async"]
    assert len(serial) == len(overlapped) == 2
    for a, b in zip(serial, overlapped):
        for key in a:
            assert torch.equal(a[key], b[key]), key
    assert serial_windows == [("attach", serial_windows[0][1])] * 2 and "old_log_probs" not in serial_windows[0][1]
    # async: scoring starts before the old-log-prob, reference and value passes and is collected after them
    assert [event for event, _ in windows] == ["launch", "attach"] * 2
    passes = {"old_log_probs", "ref_log_prob", "values"}
    assert not passes & windows[0][1] and passes <= windows[1][1]


@pytest.mark.slow
def test_async_scoring_with_a_reward_model_combines_its_scores(tmp_path_factory, tiny_model_dir, tmp_path):
    """The reward model's forward runs before the scoring thread starts (as in verl); the thread's
    manager adds the rule score where a rule scorer exists (none for HH-RLHF: the RM score alone)."""
    import json

    from hybridrl.data.preprocess import hh_rlhf
    from tests.workers.test_reward_model import HH_DIR, make_reward_model

    data = tmp_path_factory.mktemp("hh_async")
    hh_rlhf.main(["--input_dir", HH_DIR, "--local_dir", str(data), "--train_size", "16", "--test_size", "4"])
    rm_dir = make_reward_model(tiny_model_dir, str(tmp_path_factory.mktemp("rm_async")))
    out, actor = tmp_path / "run", "actor_rollout_ref.actor"
    assert (
        main(
            [
                f"data.train_files={data}/train.parquet",
                "data.val_files=null",
                "data.train_batch_size=4",
                "data.max_prompt_length=192",
                "data.filter_overlong_prompts=True",
                "data.max_response_length=8",
                f"actor_rollout_ref.model.path={tiny_model_dir}",
                f"{actor}.ppo_mini_batch_size=2",
                f"{actor}.ppo_micro_batch_size_per_gpu=2",
                "actor_rollout_ref.rollout.n=2",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
                "algorithm.adv_estimator=grpo",
                "reward_model.enable=True",
                f"reward_model.model.path={rm_dir}",
                "reward_model.micro_batch_size_per_gpu=4",
                "reward_model.launch_reward_fn_async=True",
                "trainer.device=cpu",
                "trainer.logger=['file']",
                f"trainer.default_local_dir={out}",
                "trainer.total_training_steps=1",
                "trainer.test_freq=-1",
                "trainer.val_before_train=False",
            ]
        )
        == 0
    )
    with open(out / "metrics.jsonl") as f:
        row = [json.loads(line) for line in f][-1]
    for stat in ("mean", "max", "min"):
        assert row[f"critic/score/{stat}"] == pytest.approx(row[f"rm/score/{stat}"], abs=1e-6)
