"""trainer.v1.trainer_mode=colocate_async|separate_async: fully asynchronous training.

Start-up checks (one line each); the driver's stream bookkeeping against a scripted worker group
(the staleness bound with drop and wait, oldest groups first, checkpoint state that regenerates
the untrained groups and never trains one twice, a deadline); partial rollouts on the real async
engine (every token's log-prob is under the policy that sampled it); and the tiny model end to
end: separate_async for two steps and a resume, colocate_async until its engine is killed, two
simulated Ray nodes streaming their shares, a rollout pool of its own, and a killed rollout worker.
"""

from __future__ import annotations

import collections
import copy
import functools
import importlib.util
import json
import os
import time

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from hybridrl.config import ConfigError, load_config
from hybridrl.protocol import DataProto
from hybridrl.trainer.ppo.config_check import validate_ppo_config
from hybridrl.trainer.schedules.fully_async import DataExhausted, StreamingRollout, StreamSettings
from hybridrl.workers.memory import MEMORY_METRICS
from hybridrl.workers.rollout.base import RolloutEngineError

ASYNC = [
    "trainer.v1.trainer_mode=separate_async",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.mode=async",
]
BASE = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.n=2",
]
needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="the vllm extra is not installed (pip install -e '.[vllm]')"
)


# ---------------------------------------------------------------- start-up checks (no model)


def _error(*overrides) -> str:
    with pytest.raises(ConfigError) as err:
        validate_ppo_config(load_config(BASE + list(overrides)))
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.fixture(scope="module")
def async_cfg():
    """BASE + ASYNC, composed once: the start-up checks below change keys of a copy (none of the
    keys they set is read by an interpolation, so a copy with a key set is that command line)."""
    return load_config(BASE + ASYNC)


def _error_with(cfg, changes: dict) -> str:
    """The start-up check's one line for a copy of ``cfg`` with dotted keys set."""
    cfg = copy.deepcopy(cfg)
    for key, value in changes.items():
        OmegaConf.update(cfg, key, value, merge=False)
    with pytest.raises(ConfigError) as err:
        validate_ppo_config(cfg)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_bad_settings_are_one_line_at_start_up(async_cfg):
    # from the command line, as a user types them
    assert "actor_rollout_ref.rollout.mode=async" in _error("trainer.v1.trainer_mode=separate_async")
    assert "must be one of sync, colocate_async, separate_async" in _error("trainer.v1.trainer_mode=async")
    assert "trainer.v1.sampler.max_off_policy_threshold: Value " in _error(
        *ASYNC, "trainer.v1.sampler.max_off_policy_threshold=1.5"
    )
    # each further setting on the composed BASE + ASYNC
    assert "serves async requests" in _error_with(async_cfg, {"actor_rollout_ref.rollout.mode": "sync"})
    v1 = "trainer.v1"
    for bad in (-1, 0):
        assert "must be an integer >= 1" in _error_with(async_cfg, {f"{v1}.sampler.max_off_policy_threshold": bad})
    for bad in (1.5, True):  # not an integer at all: the typed config refuses it first
        assert "trainer.v1.sampler.max_off_policy_threshold: Value " in _error_with(
            async_cfg, {f"{v1}.sampler.max_off_policy_threshold": bad}
        )
    assert "must be drop or wait" in _error_with(async_cfg, {f"{v1}.sampler.max_off_policy_strategy": "skip"})
    assert "must be an integer >= 0" in _error_with(async_cfg, {f"{v1}.separate_async.num_warmup_batches": -1})
    assert "must be 2 (verl asserts the same)" in _error_with(
        async_cfg, {f"{v1}.separate_async.parameter_sync_step": 4}
    )
    assert "choose one" in _error_with(async_cfg, {"trainer.one_step_off_policy": True})
    assert "dynamic sampling" in _error_with(async_cfg, {"algorithm.filter_groups.enable": True})
    assert "agent loops do not stream" in _error_with(async_cfg, {"actor_rollout_ref.rollout.multi_turn.enable": True})


def test_a_valid_async_config_notes_that_nothing_corrects_for_staleness(async_cfg):
    notes = validate_ppo_config(load_config(BASE + ASYNC + ["trainer.v1.separate_async.parameter_sync_step=2"]))
    assert any(
        n.startswith("trainer.v1.trainer_mode=separate_async: samples may be several updates old") for n in notes
    )
    bypass = copy.deepcopy(async_cfg)
    OmegaConf.update(bypass, "algorithm.rollout_correction.bypass_mode", True, merge=False)
    assert not any("several updates old" in n for n in validate_ppo_config(bypass))


# ---------------------------------------------------------------- the driver's bookkeeping (scripted workers)


class ScriptedWorkers:
    """A worker group whose stream finishes the groups the test releases, in the order released."""

    world_size = 1

    def __init__(self):
        self.version, self.submitted, self.finished, self.paused = 0, {}, [], 0

    def stream_submit(self, per_rank):
        for part in per_rank:
            for start in range(0, len(part), 2):
                group = part[start : start + 2]
                self.submitted[str(group.non_tensor_batch["uid"][0])] = (group, self.version)
        return [len(self.submitted)]

    def release(self, predicate=lambda uid, version: True):
        for uid, (group, version) in list(self.submitted.items()):
            if predicate(uid, version):
                del self.submitted[uid]
                out = DataProto.from_dict(
                    {
                        "responses": torch.zeros(2, 3, dtype=torch.long),
                        "response_mask": torch.ones(2, 3, dtype=torch.long),
                        "prompts": group.batch["input_ids"],
                        "input_ids": group.batch["input_ids"],
                    },
                    non_tensors={
                        "uid": group.non_tensor_batch["uid"],
                        "param_version": np.array([version] * 2, object),
                        "param_version_end": np.array([self.version] * 2, object),
                        "rollout_resumes": np.array([self.version - version] * 2, object),
                    },
                )
                self.finished.append(out)

    def stream_collect(self, wait_s):
        out, self.finished = self.finished, []
        return [out]

    def stream_pause(self):
        self.paused += 1

    def stream_idle_s(self):
        return [0.0]

    def sync_rollout_weights(self):
        self.version += 1
        return [self.version]

    def stream_close(self):
        self.submitted.clear()


def _dataloader(n_batches, size=4):
    """Batches of ``size`` prompts; a prompt's id is its draw number; the state counts draws."""
    state = {"drawn": 0}

    def batches():
        while state["drawn"] < n_batches:
            first = state["drawn"] * size
            state["drawn"] += 1
            yield {"input_ids": torch.arange(first, first + size)[:, None], "row_id": np.arange(first, first + size)}

    def prepare(batch_dict):
        rows = DataProto.from_dict(
            non_tensors={
                "row_id": batch_dict["row_id"],
                "uid": np.array([f"u{i}" for i in batch_dict["row_id"]], dtype=object),
            }
        )
        prompts = DataProto.from_dict(
            {"input_ids": batch_dict["input_ids"]}, non_tensors={"uid": rows.non_tensor_batch["uid"]}
        )
        return rows, prompts

    return batches(), prepare, lambda: dict(state)


def _stream(workers, n_batches, threshold=2, strategy="drop", warmup=1, done_rows=None, deadline_s=5.0):
    batches, prepare, state = _dataloader(n_batches)
    settings = StreamSettings(
        "separate_async",
        groups_per_step=4,
        threshold=threshold,
        strategy=strategy,
        warmup_batches=warmup,
        deadline_s=deadline_s,
        pad_token_id=0,
    )
    return StreamingRollout(
        batches,
        prepare,
        workers,
        lambda: workers.sync_rollout_weights()[0],
        state,
        settings,
        n=2,
        version=workers.version,
        done_rows=done_rows,
    )


def _step(stream, workers, release=None):
    """One training step: the groups ``release(uid, version)`` selects finish after the step's
    top-up; returns the batch's row ids and metrics. Then the update's weight sync."""
    metrics, timing = {}, {}
    next(stream)
    if release is not None:
        workers.release(release)
    batch = stream.take(metrics, timing)
    stream.sync_weights(timing)
    return sorted(set(batch.non_tensor_batch["row_id"])), metrics


def _all(uid, version):
    return True


def test_groups_are_taken_as_they_finish_oldest_first_and_the_rest_stay_in_flight():
    workers = ScriptedWorkers()
    stream = _stream(workers, n_batches=6)
    rows, metrics = _step(stream, workers, lambda uid, v: uid in {"u1", "u5", "u6", "u7", "u0"})  # u2-u4 are slow
    assert len(workers.submitted) == 3 + 4  # step 1 kept two batches in flight, then topped up
    assert rows == [0, 1, 5, 6] and metrics["fully_async/queue_size"] == 1  # u7 waits for the next step
    assert metrics["fully_async/staleness/max"] == 0 and metrics["fully_async/in_flight"] == 3 + 4
    rows, metrics = _step(stream, workers, _all)
    assert rows == [2, 3, 4, 7]  # the oldest first: version 0 before the top-up's version 1
    assert metrics["fully_async/staleness/max"] == 1


def test_drop_never_trains_a_group_older_than_the_bound():
    workers = ScriptedWorkers()
    stream = _stream(workers, n_batches=10, threshold=2)
    trained, dropped = [], 0
    for _ in range(4):  # u0 hangs for four steps
        rows, metrics = _step(stream, workers, lambda uid, v: uid != "u0")
        trained += rows
        dropped += metrics["fully_async/dropped"]
        assert metrics["fully_async/staleness/max"] <= 1  # age = staleness + 1 <= max_off_policy_threshold
    rows, metrics = _step(stream, workers, _all)  # u0 finishes at last, four versions old
    trained += rows
    dropped += metrics["fully_async/dropped"]
    assert 0 not in trained and dropped >= 1 and metrics["fully_async/staleness/max"] <= 1
    assert len(set(trained)) == len(trained)  # nothing twice


def test_wait_holds_the_step_for_groups_about_to_go_over_the_bound():
    workers = ScriptedWorkers()
    stream = _stream(workers, n_batches=8, threshold=1, strategy="wait", deadline_s=1.0)
    with pytest.raises(RolloutEngineError, match=r"1 over the staleness bound awaited"):
        _step(stream, workers, lambda uid, v: uid != "u0")  # u0's age is the bound: the step may not go without it
    rows, metrics = _step(stream, workers, _all)
    assert rows == [0, 1, 2, 3] and metrics["fully_async/staleness/max"] == 0 and metrics["fully_async/dropped"] == 0


def test_a_checkpoint_regenerates_the_untrained_groups_and_trains_none_twice():
    workers = ScriptedWorkers()
    stream = _stream(workers, n_batches=5, threshold=8)
    first, _ = _step(stream, workers, lambda uid, v: uid in {"u0", "u1", "u2", "u4"})
    dataloader_state, done_rows = stream.checkpoint_state()
    assert dataloader_state == {"drawn": 0} and done_rows == [[0, 1, 2], [0], []]  # u3, u5-u11 not trained
    straight = [first] + [_step(stream, workers, _all)[0] for _ in range(4)]
    # a resumed run: the dataloader back at the saved position, the done rows skipped
    resumed_workers = ScriptedWorkers()
    resumed = _stream(resumed_workers, n_batches=5, threshold=8, done_rows=done_rows)
    after = [_step(resumed, resumed_workers, _all)[0] for _ in range(4)]
    assert [first] + after == straight
    assert sorted(r for rows in straight for r in rows) == list(range(20))  # none lost, none twice
    with pytest.raises(StopIteration):
        next(resumed)


def test_when_drops_leave_too_few_groups_the_run_stops_cleanly():
    workers = ScriptedWorkers()
    stream = _stream(workers, n_batches=2, threshold=1, warmup=1)
    _step(stream, workers, lambda uid, v: uid != "u0")  # u1-u4
    with pytest.raises(DataExhausted, match="0 finished groups left"):
        _step(stream, workers, _all)  # u0, u5-u7 are over the bound now


# ---------------------------------------------------------------- partial rollouts on the real engine


@needs_vllm
def test_partial_rollouts_keep_each_tokens_log_prob_under_the_policy_that_sampled_it(
    async_vllm_engine, vllm_model, tokenizer
):
    """On the session's shared async engine (max_model_len=300, tests/conftest.py); its
    ignore_eos, its weights and its running state are put back at the end."""
    from hybridrl.workers.rollout.stream import RolloutStream
    from tests.workers.vllm_helpers import actor_log_probs, make_prompts

    R, engine, stream = 250, async_vllm_engine, None
    engine.config.ignore_eos = True
    try:
        started = time.monotonic()
        stream = RolloutStream(engine, version=0)
        prompts = make_prompts(tokenizer, ["The capital of France is", "1 + 1 =", "Once upon"], n=2, response_length=R)
        prompts.non_tensor_batch["uid"] = np.array(["a", "a", "b", "b", "c", "c"], dtype=object)
        stream.submit(prompts)
        time.sleep(1.0)  # ~80 of the 250 tokens (the tiny model samples ~80 tokens/s per sequence here)
        stream.pause()
        new = copy.deepcopy(vllm_model)
        with torch.no_grad():
            for p in new.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        engine.sync_weights(new)
        stream.resume(1)
        groups = []
        while len(groups) < 3:
            groups += stream.collect(10.0)
        out = DataProto.concat(groups)
    finally:
        engine.config.ignore_eos = False
        if stream is not None:
            if stream.paused:
                stream.resume(0)
            stream.close()
        engine.sync_weights(vllm_model)
    batch = out.batch
    assert batch["response_mask"].sum().item() == 6 * R  # token-exact: every response whole, nothing doubled
    by_old = (batch["rollout_log_probs"] - actor_log_probs(vllm_model, batch)).abs() < 1e-3
    by_new = (batch["rollout_log_probs"] - actor_log_probs(new, batch)).abs() < 1e-3
    first_new = by_new.int().argmax(-1)
    for row in range(6):  # a prefix by the old policy, the rest by the new, nothing by neither
        k = int(first_new[row]) if by_new[row].any() else R
        assert by_old[row, :k].all() and by_new[row, k:].all(), row
    assert 0 < stream.idle_s() < time.monotonic() - started  # idle before the submit and since the last group
    resumed = np.asarray(out.non_tensor_batch["rollout_resumes"], dtype=int)
    assert resumed.sum() >= 1 and (np.asarray(out.non_tensor_batch["param_version_end"]) == 1).all()
    assert all(out.non_tensor_batch["param_version"][i] == (0 if by_old[i, 0] else 1) for i in range(6))


# ---------------------------------------------------------------- end to end on the tiny model


@pytest.fixture(scope="module")
def small_data(gsm8k_head):
    """32 training rows: eight batches of 4 prompts, more than the runs below draw (no prompt comes twice)."""
    return gsm8k_head(32)


def _args(data, model_dir, out, tmp_path, mode, *extra):
    from tests.workers.vllm_helpers import grpo_overrides, length_reward_file

    return grpo_overrides(
        data,
        model_dir,
        out,
        length_reward_file(tmp_path),
        f"trainer.v1.trainer_mode={mode}",
        "actor_rollout_ref.rollout.mode=async",
        "algorithm.rollout_correction.bypass_mode=true",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.total_training_steps=3",
        f"trainer.rollout_data_dir={out}/samples",
        *extra,
    )


def _rows(out):
    return [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]


def _prompts_trained(out, steps):
    return [
        sample["input"]
        for step in steps
        for sample in map(json.loads, open(os.path.join(out, "samples", f"step_{step}.jsonl")))
    ]


@pytest.mark.slow
@needs_vllm
def test_two_steps_then_a_resume_that_trains_nothing_twice(small_data, vllm_model_dir, tmp_path):
    from hybridrl.trainer.main_ppo import main

    out = tmp_path / "run"
    args = _args(
        small_data,
        vllm_model_dir,
        out,
        tmp_path,
        "separate_async",
        "trainer.save_freq=1",
        "trainer.total_training_steps=2",
        "trainer.v1.sampler.max_off_policy_threshold=2",
    )
    assert main(args) == 0
    rows = _rows(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["fully_async/staleness/max"] <= 1 and r["actor/grad_norm"] > 0 for r in rows)
    assert [r["fully_async/count/current_param_version"] for r in rows] == [0, 1]
    for key in (
        "timing_s/gen",
        "timing_s/sync_rollout_weights",
        "fully_async/queue_size",
        "fully_async/in_flight",
        "fully_async/dropped",
        "fully_async/partial/partial_ratio",
        "fully_async/trainer/idle_ratio",
        "fully_async/rollouter/idle_ratio",
        *MEMORY_METRICS,
    ):
        assert key in rows[-1], key
    assert "timing_s/old_log_prob" not in rows[-1]  # bypass mode: the rollout log-probs are the old ones
    # resume from step 1's checkpoint: its groups in flight are generated again, nothing trains twice
    trained_before = _prompts_trained(out, (1,))
    os.remove(out / "metrics.jsonl")
    assert main(args + ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={out}/global_step_1"]) == 0
    assert [r["step"] for r in _rows(out)] == [2]
    later = _prompts_trained(out, (2,))
    assert not set(later) & set(trained_before)
    assert set(collections.Counter(later + trained_before).values()) == {2}  # rollout.n samples, in one step only


@pytest.mark.slow
@needs_vllm
def test_colocated_two_steps_then_a_killed_engine_stops_the_run_with_one_line(
    small_data, vllm_model_dir, tmp_path, monkeypatch, capsys
):
    """colocate_async (generation paused while the trainer trains) runs its steps; then the engine
    process dies while groups stream: the step's wait ends with the engine's one-line error (not a
    hang, not a traceback)."""
    from hybridrl.trainer.main_ppo import main
    from hybridrl.workers.fsdp_workers import ActorRolloutRefWorker

    submit, calls = ActorRolloutRefWorker.stream_submit, []

    @functools.wraps(submit)  # keeps its @register dispatch
    def kill_at_the_fourth(worker, prompts):  # steps 1 and 2 (two batches, then a top-up), then step 3's
        calls.append(prompts)
        if len(calls) == 4:
            process = worker.rollout.llm.engine_core.resources.engine_manager.processes[0]
            process.kill()
            process.join(30)
        return submit(worker, prompts)

    monkeypatch.setattr(ActorRolloutRefWorker, "stream_submit", kill_at_the_fourth)
    out = tmp_path / "run"
    args = _args(
        small_data,
        vllm_model_dir,
        out,
        tmp_path,
        "colocate_async",
        "trainer.save_freq=-1",
        "actor_rollout_ref.rollout.engine_timeout_s=60",
    )
    assert main(args) == 2
    error = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hybridrl: error:")]
    assert len(error) == 1 and "vLLM async engine: its process died" in error[0], error
    rows = _rows(out)
    assert 1 <= len(rows) < 3 and all(r["actor/grad_norm"] > 0 and "fully_async/queue_size" in r for r in rows)


@pytest.mark.slow
@needs_vllm
def test_on_two_simulated_ray_nodes_each_worker_streams_its_share(ray_cluster, small_data, vllm_model_dir, tmp_path):
    """trainer.backend=ray, 2 nodes x 1 worker: each worker streams the groups sent to it on its own
    async engine; the driver takes finished groups from both."""
    from hybridrl.trainer.main_ppo import main

    out = tmp_path / "run"
    args = _args(
        small_data,
        vllm_model_dir,
        out,
        tmp_path,
        "separate_async",
        "trainer.backend=ray",
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=1",
        "trainer.v1.sampler.max_off_policy_threshold=2",
        "trainer.total_training_steps=2",
    )
    assert main(args) == 0
    rows = _rows(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["actor/grad_norm"] > 0 and r["fully_async/staleness/max"] <= 1 for r in rows)
    trained = _prompts_trained(out, (1, 2))
    assert set(collections.Counter(trained).values()) == {2}


@pytest.mark.slow
@needs_vllm
def test_a_rollout_pool_of_its_own_generates_while_the_trainer_trains(
    ray_cluster, small_data, vllm_model_dir, tmp_path
):
    """actor_rollout_ref.rollout.nnodes=1: one trainer worker without an engine, one rollout worker
    with one (verl's standalone rollout), each on a simulated node of its own; the actor's weights
    reach the rollout worker after every update (bypass mode: in fp32 the first step's rollout
    log-probs are the actor's), and validation generates on the rollout pool."""
    from hybridrl.trainer.main_ppo import main

    out = tmp_path / "run"
    args = _args(
        small_data,
        vllm_model_dir,
        out,
        tmp_path,
        "separate_async",
        "trainer.backend=ray",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.rollout.n_gpus_per_node=1",
        "trainer.v1.sampler.max_off_policy_threshold=1",
        "trainer.test_freq=2",
        "trainer.total_training_steps=2",
    )
    assert main(args) == 0
    rows = _rows(out)
    assert [r["step"] for r in rows] == [1, 2]
    # threshold 1: only groups the current weights started are trained, so every step's samples
    # are on policy and the pushed weights must be the actor's (else ppo_kl would move off 0)
    assert all(r["fully_async/staleness/max"] == 0 for r in rows)
    assert all(abs(r["actor/ppo_kl"]) < 1e-4 for r in rows), [r["actor/ppo_kl"] for r in rows]
    assert "val-core/openai/gsm8k/reward/mean@1" in rows[-1]
    assert all(r[key] > 0 for r in rows for key in MEMORY_METRICS)  # the trainer's and the pool's workers (max)


def test_a_rollout_pool_needs_separate_async_ray_and_workers():
    pool = ["actor_rollout_ref.rollout.nnodes=1"]
    assert "only trainer.v1.trainer_mode=separate_async does" in _error(*pool)
    assert "leaves the rollout pool no workers" in _error(*ASYNC, *pool, "actor_rollout_ref.rollout.n_gpus_per_node=0")
    assert "runs on Ray workers" in _error(*ASYNC, *pool, "trainer.backend=local")


@pytest.mark.slow
@needs_vllm
def test_a_killed_rollout_worker_is_a_worker_error_naming_it(
    ray_cluster, small_data, vllm_model_dir, tmp_path, monkeypatch
):
    """The rollout pool's worker process dies after step 1: the next call on it fails at once with
    a WorkerError naming the RolloutWorker, instead of a wait for groups that never come."""
    import ray

    from hybridrl.controller.ray import WorkerError
    from hybridrl.trainer.main_ppo import main

    sync = StreamingRollout.sync_weights

    def kill_after_the_first_update(stream, timing_raw):
        version = sync(stream, timing_raw)
        if version == 1:
            ray.kill(stream.wg._hosts[0], no_restart=True)
        return version

    monkeypatch.setattr(StreamingRollout, "sync_weights", kill_after_the_first_update)
    out = tmp_path / "run"
    args = _args(
        small_data,
        vllm_model_dir,
        out,
        tmp_path,
        "separate_async",
        "trainer.backend=ray",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.rollout.n_gpus_per_node=1",
    )
    started = time.monotonic()
    with pytest.raises(WorkerError, match=r"^RolloutWorker worker process of rank 0 died"):
        main(args)
    assert time.monotonic() - started < 300 and [r["step"] for r in _rows(out)] == [1]
