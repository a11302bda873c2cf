"""trainer.one_step_off_policy: verl's one-step-off schedule with the vLLM engine on the tiny model.

Three steps on the local backend: batch t+1 is generated in a driver thread, with the weights
from before update t, while the actor trains on batch t (timestamps of the worker calls show
the overlap); every sample records its param_version and the steps log the staleness. The
worker's engine lock makes a weight sync wait for an in-flight generation; the prefetch thread's
waits have deadlines and its errors reach the driver as one line; resume trains the batches an
uninterrupted run trains (across an epoch boundary); the async engine runs it with bypass mode,
and a killed engine stops the run with one line. Bad combinations are one line at start-up.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from hybridrl.config import ConfigError, load_config
from hybridrl.protocol import DataProto
from hybridrl.trainer.ppo.config_check import validate_ppo_config
from hybridrl.trainer.schedules.one_step_off import OneStepOffRollout, PendingGeneration, staleness_metrics
from hybridrl.workers.memory import MEMORY_METRICS
from hybridrl.workers.rollout.base import RolloutEngineError
from tests.tiny_models import ppo_section

ONE_STEP_OFF = "trainer.one_step_off_policy=true"
PREFETCH_SECONDS = 3.0  # the prefetched generations are made this much longer: they visibly overlap the update
BASE = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.n=2",
]


# ---------------------------------------------------------------- start-up checks (no model)


def _error(*overrides) -> str:
    with pytest.raises(ConfigError) as err:
        validate_ppo_config(load_config(BASE + list(overrides)))
    assert "\n" not in str(err.value)
    return str(err.value)


def test_bad_combinations_are_one_line_at_start_up():
    assert "actor_rollout_ref.rollout.name=vllm" in _error(ONE_STEP_OFF)  # hf: generates with the actor's module
    assert "its own copy of the weights" in _error(ONE_STEP_OFF, "actor_rollout_ref.rollout.name=sglang")
    vllm = [ONE_STEP_OFF, "actor_rollout_ref.rollout.name=vllm"]
    assert "dynamic sampling" in _error(*vllm, "algorithm.filter_groups.enable=true")
    assert "adv_estimator=remax: its greedy baselines" in _error(
        *vllm, "algorithm.adv_estimator=remax", "actor_rollout_ref.rollout.n=1"
    )
    assert "trainer.one_step_off_policy: Value 'maybe' is not a valid bool" in _error(
        "trainer.one_step_off_policy=maybe"
    )
    assert "choose one" in _error(
        *vllm, "trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.rollout.mode=async"
    )


def test_without_correction_a_note_recommends_verls_setting():
    vllm = BASE + [ONE_STEP_OFF, "actor_rollout_ref.rollout.name=vllm"]
    notes = validate_ppo_config(load_config(vllm))
    assert any("bypass_mode=true" in n and n.startswith("trainer.one_step_off_policy=true") for n in notes)
    for extra in ("algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.rollout_is=token"):
        assert not any("one_step_off" in n for n in validate_ppo_config(load_config(vllm + [extra])))


def test_the_old_log_prob_pass_always_runs():
    from hybridrl.algorithms.config import algo_config
    from hybridrl.trainer.ppo.step_plan import reuses_update_log_probs

    on_policy = ["actor_rollout_ref.actor.ppo_mini_batch_size=8"]  # one update per batch: the pass could be skipped
    config = load_config(BASE + on_policy)
    assert reuses_update_log_probs(config, algo_config(config))
    config = load_config(BASE + on_policy + [ONE_STEP_OFF])
    assert not reuses_update_log_probs(config, algo_config(config))


# ---------------------------------------------------------------- the prefetch machinery (no model)


def test_the_schedule_syncs_then_launches_the_next_batch_and_saves_the_position_before_it():
    events, state = [], {"drawn": 0}

    def batches():
        for i in range(1, 4):
            state["drawn"] = i
            yield {"id": i}

    def generate(batch_dict):
        events.append(("gen", batch_dict["id"], threading.current_thread() is threading.main_thread()))
        return batch_dict["id"]

    def sync():
        events.append(("sync",))
        return 7

    prefetch = OneStepOffRollout(batches(), generate, sync, lambda: {"drawn": state["drawn"]}, deadline_s=10)
    taken = []
    for step, batch_dict in enumerate(prefetch, start=1):
        metrics, timing = {}, {}
        result, version = prefetch.take(step, step == 3, metrics, timing)
        taken.append((batch_dict["id"], result, version))
        assert {"gen", "generate_async", "sync_rollout_weights"} <= set(timing)
        if step < 3:
            assert prefetch.dataloader_state() == {"drawn": step}  # before batch step+1 was drawn
            assert 0 <= metrics["fully_async/rollouter/idle_ratio"] <= 1
            prefetch.settle("a checkpoint")
        else:
            assert prefetch.dataloader_state() == {"drawn": 3} and "fully_async/rollouter/idle_ratio" not in metrics
    assert taken == [(1, 1, 7), (2, 2, 7), (3, 3, 7)]
    assert [e[:2] for e in events] == [("gen", 1), ("sync",), ("gen", 2), ("sync",), ("gen", 3), ("sync",)]
    assert [e[2] for e in events if e[0] == "gen"] == [False, False, False]  # each in a thread of its own


def test_prefetch_errors_reach_the_driver_as_they_were_and_waits_have_deadlines():
    def dead_engine(batch_dict):
        raise RolloutEngineError("vLLM async engine: its process died while generating (EngineDeadError)")

    with pytest.raises(RolloutEngineError, match=r"^vLLM async engine: its process died while generating"):
        PendingGeneration(dead_engine, {}, step=2, deadline_s=10).result()
    started = time.perf_counter()
    with pytest.raises(
        RolloutEngineError,
        match=r"waited for the engine to be free for validation: the generation of "
        r"the batch for step 5 was not done 0.3 s after its launch "
        r"\(actor_rollout_ref.rollout.engine_timeout_s\)",
    ) as err:
        PendingGeneration(lambda b: time.sleep(5), {}, step=5, deadline_s=0.3).result(
            "the engine to be free for validation"
        )
    assert "\n" not in str(err.value) and time.perf_counter() - started < 2


def test_staleness_is_the_current_version_minus_each_samples():
    metrics = staleness_metrics([3, 3, 2, 3], current_version=4)
    assert metrics["fully_async/staleness/mean"] == pytest.approx(1.25) and metrics["fully_async/staleness/max"] == 2


# ---------------------------------------------------------------- the worker's engine lock (a stand-in engine)


class SlowEngine:
    """Records when its generations and weight syncs run; a generation takes ``seconds``."""

    def __init__(self, seconds):
        self.seconds, self.log, self.generating = seconds, [], threading.Event()

    def generate_sequences(self, prompts):
        start = time.monotonic()
        self.generating.set()
        time.sleep(self.seconds)
        self.log.append(("gen", start, time.monotonic()))
        return DataProto.from_dict(tensors={"responses": torch.zeros(len(prompts), 2, dtype=torch.long)})

    def sync_weights(self, module):
        self.log.append(("sync", time.monotonic(), time.monotonic()))


def _worker(engine, timeout_s=30):
    from hybridrl.workers.fsdp_workers import ActorRolloutRefWorker
    from hybridrl.workers.rollout.tp_group import RolloutTPGroup

    worker = ActorRolloutRefWorker.__new__(ActorRolloutRefWorker)  # the real methods around a stand-in engine
    worker.config = ppo_section("actor_rollout_ref", {"rollout": {"engine_timeout_s": timeout_s}})
    worker.device, worker.agent_loop_manager, worker.rollout = "cpu", None, engine
    worker.tp_group = RolloutTPGroup(1, rank=0, world_size=1)  # its own engine
    worker.actor = SimpleNamespace(actor_module=torch.nn.Linear(1, 1))
    worker._start_engine_bookkeeping()
    return worker


def _prompts(rows=2):
    return DataProto.from_dict(tensors={"input_ids": torch.ones(rows, 3, dtype=torch.long)})


def test_a_weight_sync_waits_for_an_inflight_generation_and_the_next_generation_has_the_new_version():
    engine = SlowEngine(0.5)
    worker = _worker(engine)
    outputs = []
    thread = threading.Thread(target=lambda: outputs.append(worker.generate_sequences(_prompts())))
    thread.start()
    assert engine.generating.wait(10)
    worker.param_version = 1  # an update happened meanwhile
    assert worker.sync_rollout_weights() == 1
    thread.join(10)
    (_, gen_start, gen_end), (_, sync_start, _) = engine.log
    assert sync_start >= gen_end and worker.engine_lock.last_wait_s > 0.2  # it waited for the generation
    assert list(outputs[0].non_tensor_batch["param_version"]) == [0, 0]  # generated before the sync
    assert list(worker.generate_sequences(_prompts()).non_tensor_batch["param_version"]) == [1, 1]
    assert worker.sync_rollout_weights() == 1 and len(engine.log) == 3  # up to date: no second sync


def test_a_busy_engine_fails_the_waiter_after_the_deadline_with_one_line():
    engine = SlowEngine(2.0)
    worker = _worker(engine, timeout_s=0.3)
    threading.Thread(target=worker.generate_sequences, args=(_prompts(),), daemon=True).start()
    assert engine.generating.wait(10)
    worker.param_version = 1
    with pytest.raises(
        RolloutEngineError,
        match=r"rollout engine: a weight sync waited actor_rollout_ref.rollout."
        r"engine_timeout_s=0.3 s for a generation to finish",
    ) as err:
        worker.sync_rollout_weights()
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------- end to end with vLLM

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="the vllm extra is not installed (pip install -e '.[vllm]')"
)


class CallLog:
    """Wall-clock intervals of the actor worker's generate_sequences / update_actor calls, with the
    calling thread; the prefetched generations (after batch 1's) are made ``stretch_s`` longer."""

    def __init__(self, stretch_s=PREFETCH_SECONDS, on_prefetch=None):
        self.calls, self.stretch_s, self.on_prefetch = [], stretch_s, on_prefetch

    def install(self, monkeypatch):
        from hybridrl.workers.fsdp_workers import ActorRolloutRefWorker

        for name in ("generate_sequences", "update_actor"):
            monkeypatch.setattr(ActorRolloutRefWorker, name, self._wrap(name, getattr(ActorRolloutRefWorker, name)))

    def _wrap(self, name, method):
        @functools.wraps(method)  # keeps the @register spec
        def recorded(worker, data, **kwargs):
            in_thread = threading.current_thread() is not threading.main_thread()
            start = time.monotonic()
            if name == "generate_sequences" and in_thread and self.on_prefetch is not None:
                self.on_prefetch(worker)
            out = method(worker, data, **kwargs)
            if name == "generate_sequences" and in_thread and self.of("generate_sequences"):  # not batch 1's
                time.sleep(self.stretch_s)
            self.calls.append((name, in_thread, start, time.monotonic()))
            return out

        return recorded

    def of(self, name):
        return [c for c in self.calls if c[0] == name]


@pytest.fixture(scope="module")
def small_data(gsm8k_head):
    """8 training rows: two batches of 4 prompts per epoch, so step 3 opens the second epoch."""
    return gsm8k_head(8)


def _args(data, model_dir, out, tmp_path, *extra):
    from tests.workers.vllm_helpers import grpo_overrides, length_reward_file

    return grpo_overrides(
        data,
        model_dir,
        out,
        length_reward_file(tmp_path),
        ONE_STEP_OFF,
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.total_training_steps=3",
        f"trainer.rollout_data_dir={out}/samples",
        *extra,
    )


def _rows(out):
    return [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]


def _samples(out, step):
    return [json.loads(line) for line in open(os.path.join(out, "samples", f"step_{step}.jsonl"))]


@pytest.fixture(scope="module")
def straight_run(small_data, vllm_model_dir, tmp_path_factory):
    """Three uninterrupted one-step-off steps (decoupled rollout correction, token TIS)."""
    from hybridrl.trainer.main_ppo import main

    tmp = tmp_path_factory.mktemp("straight")
    log = CallLog()
    with pytest.MonkeyPatch.context() as monkeypatch:
        log.install(monkeypatch)
        assert (
            main(
                _args(
                    small_data,
                    vllm_model_dir,
                    tmp / "run",
                    tmp,
                    "trainer.save_freq=-1",
                    "algorithm.rollout_correction.rollout_is=token",
                )
            )
            == 0
        )
    return tmp / "run", log


@pytest.mark.slow
@needs_vllm
def test_three_steps_stale_by_one_with_the_generation_overlapping_the_update(straight_run):
    out, log = straight_run
    rows = _rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["fully_async/staleness/mean"] for r in rows] == [0, 1, 1]
    assert [r["fully_async/staleness/max"] for r in rows] == [0, 1, 1]
    assert [r["fully_async/count/current_param_version"] for r in rows] == [0, 1, 2]
    assert [{s["param_version"] for s in _samples(out, step)} for step in (1, 2, 3)] == [{0}, {0}, {1}]
    for row in rows:
        for key in (
            "timing_s/gen",
            "timing_s/generate_async",
            "timing_s/sync_rollout_weights",
            "timing_s/old_log_prob",
            "fully_async/trainer/idle_ratio",
            "rollout_corr/rollout_is_mean",
            *MEMORY_METRICS,
        ):
            assert key in row, key
        assert row["actor/grad_norm"] > 0
    # The engine's log-probs are the actor's in step 1 (same weights, fp32); afterwards they are a step old.
    assert rows[0]["rollout_corr/log_ppl_abs_diff"] < 1e-4 < rows[1]["rollout_corr/log_ppl_abs_diff"]
    assert rows[1]["timing_s/generate_async"] >= PREFETCH_SECONDS
    # Batch t+1 is generated in a driver thread that starts before update t and is still running
    # when update t starts (its generation was made PREFETCH_SECONDS long). Batch 1's generation
    # runs in a thread too (the same deadline applies); the driver waits for it.
    gens, updates = log.of("generate_sequences"), log.of("update_actor")
    assert [g[1] for g in gens] == [True, True, True] and [u[1] for u in updates] == [False, False, False]
    for t in (0, 1):
        _, _, gen_start, gen_end = gens[t + 1]
        _, _, update_start, update_end = updates[t]
        assert gen_start < update_start < gen_end and gen_start < update_end


@pytest.mark.slow
@needs_vllm
def test_resume_trains_the_batches_an_uninterrupted_run_trains(straight_run, small_data, vllm_model_dir, tmp_path):
    """The checkpoint of step 2 holds the dataloader position before batch 3 (the next epoch's
    first) was drawn for prefetching: the resumed run draws and generates it again."""
    from hybridrl.trainer.main_ppo import main

    straight, _ = straight_run
    out = tmp_path / "run"
    args = _args(
        small_data,
        vllm_model_dir,
        out,
        tmp_path,
        "trainer.save_freq=2",
        "algorithm.rollout_correction.rollout_is=token",
    )
    assert main([*args, "trainer.total_training_steps=2"]) == 0
    assert main(args) == 0
    rows = _rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    inputs = {step: sorted(s["input"] for s in _samples(out, step)) for step in (1, 2, 3)}
    for step in (1, 2, 3):
        assert inputs[step] == sorted(s["input"] for s in _samples(straight, step)), step
    assert inputs[3] != inputs[2]
    # Regenerated after the resume with the checkpoint's weights: on policy for this one step.
    assert rows[2]["fully_async/staleness/max"] == 0 and {s["param_version"] for s in _samples(out, 3)} == {2}


@pytest.mark.slow
@needs_vllm
def test_async_engine_in_bypass_mode_and_a_killed_engine_is_one_line(
    small_data, vllm_model_dir, tmp_path, monkeypatch, capsys
):
    """rollout.mode=async, verl's recommended bypass mode; the engine process is killed as the
    prefetch of batch 3 starts: the driver stops at step 3 with the engine's one-line error."""
    from hybridrl.trainer.main_ppo import main

    generations = []

    def kill_at_the_third(worker):  # batch 1, batch 2, then batch 3's prefetch
        generations.append(worker)
        if len(generations) == 3:
            process = worker.rollout.llm.engine_core.resources.engine_manager.processes[0]
            process.kill()
            process.join(30)

    CallLog(stretch_s=0, on_prefetch=kill_at_the_third).install(monkeypatch)
    out = tmp_path / "run"
    args = _args(
        small_data,
        vllm_model_dir,
        out,
        tmp_path,
        "trainer.save_freq=-1",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.engine_timeout_s=60",
        "algorithm.rollout_correction.bypass_mode=true",
    )
    assert main(args) == 2
    error = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hybridrl: error:")]
    assert len(error) == 1 and "vLLM async engine: its process died while generating" in error[0]
    rows = _rows(out)
    assert [r["step"] for r in rows] == [1, 2] and [r["fully_async/staleness/max"] for r in rows] == [0, 1]
    assert all(r["actor/grad_norm"] > 0 and "timing_s/old_log_prob" not in r for r in rows)  # bypass: no pass


@pytest.mark.slow
@needs_vllm
def test_on_ray_with_the_async_engine(ray_cluster, small_data, vllm_model_dir, tmp_path):
    """trainer.backend=ray: the worker process runs two calls at once (Ray max_concurrency=2; that
    a second call really runs beside a running one is tests/controller/test_ray_backend.py's), the
    engine lock keeps the weights still under the prefetched generation: stale by exactly one."""
    from hybridrl.trainer.main_ppo import main

    out = tmp_path / "run"
    args = _args(
        small_data,
        vllm_model_dir,
        out,
        tmp_path,
        "trainer.save_freq=-1",
        "trainer.backend=ray",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.mode=async",
        "algorithm.rollout_correction.rollout_is=token",
    )
    assert main(args) == 0
    rows = _rows(out)
    assert [r["fully_async/staleness/max"] for r in rows] == [0, 1, 1]
    assert [{s["param_version"] for s in _samples(out, step)} for step in (1, 2, 3)] == [{0}, {0}, {1}]
    assert rows[0]["rollout_corr/log_ppl_abs_diff"] < 1e-4 < rows[1]["rollout_corr/log_ppl_abs_diff"]
