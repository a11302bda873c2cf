"""The PPO driver's schedules (hybridrl/trainer/schedules/modes.py): which config picks which, and what
each one does for the driver and the loop, with fake trainers and worker groups (no model)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hybridrl.protocol import DataProto
from hybridrl.registry import RegistryError
from hybridrl.trainer.schedules import modes as schedules
from hybridrl.trainer.schedules.fully_async import DataExhausted
from hybridrl.trainer.schedules.modes import (
    FullyAsyncSchedule,
    OneStepOffSchedule,
    SyncSchedule,
    make_schedule,
)


def config(one_step_off=False, mode="sync", n=2):
    return SimpleNamespace(
        trainer=SimpleNamespace(one_step_off_policy=one_step_off, v1=SimpleNamespace(trainer_mode=mode)),
        actor_rollout_ref=SimpleNamespace(rollout=SimpleNamespace(n=n, engine_timeout_s=10)),
    )


@pytest.mark.parametrize(
    "one_step_off, mode, cls",
    [
        (False, "sync", SyncSchedule),
        (True, "sync", OneStepOffSchedule),
        (False, "colocate_async", FullyAsyncSchedule),
        (False, "separate_async", FullyAsyncSchedule),
    ],
)
def test_each_config_picks_its_schedule(one_step_off, mode, cls):
    schedule = make_schedule(config(one_step_off, mode), trainer := object())
    assert type(schedule) is cls and schedule.trainer is trainer
    assert schedule.update_syncs_weights is (cls is SyncSchedule)


def test_an_unknown_mode_is_one_line_naming_the_known_ones():
    with pytest.raises(RegistryError, match="trainer.v1.trainer_mode.*colocate_asinc.*colocate_async"):
        make_schedule(config(mode="colocate_asinc"), object())


class Dataloader:
    def __init__(self):
        self.drawn = 0

    def state_dict(self):
        return {"drawn": self.drawn}

    def batches(self, n):
        for i in range(n):
            self.drawn += 1
            yield {"id": i}


class Workers:
    """The actor/rollout group; ``version`` counts the actor's updates (``param_version``)."""

    def __init__(self, version=0):
        self.version, self.calls = version, []

    def sync_rollout_weights(self):
        self.calls.append("sync_rollout_weights")
        return [self.version]

    def engine_weights(self):
        self.calls.append("engine_weights")
        return [("state", self.version)]

    def update_weights(self, state, version):
        self.calls.append(("update_weights", state, version))
        return [version]


class Host:
    """A PPOTrainer as a schedule sees it."""

    def __init__(self, cfg=None):
        self.config = cfg or config()
        self.train_dataloader = Dataloader()
        self.actor_rollout_wg = self.rollout_wg = Workers()
        self.tokenizer = SimpleNamespace(pad_token_id=0)
        self.generated = []

    def generate(self, batch_dict):
        self.generated.append(batch_dict["id"])
        version = self.actor_rollout_wg.version
        responses = DataProto.from_dict(
            {"r": torch.zeros(2, 1)}, non_tensors={"param_version": np.array([version] * 2, dtype=object)}
        )
        return {"rows": batch_dict["id"]}, "prompts", responses

    def prepare_generation(self, batch_dict):
        raise AssertionError("not used by these schedules")

    def join_responses(self, batch, prompts, responses, timing_raw):
        return ("joined", batch["rows"], responses)


def test_sync_generates_each_batch_in_its_step_and_saves_the_position_now():
    host = Host()
    schedule = SyncSchedule(host)
    batches = list(schedule.batches(host.train_dataloader.batches(2)))
    metrics, timing = {}, {}
    joined = schedule.rollout(batches[0], 1, False, metrics, timing)
    assert joined[:2] == ("joined", 0) and "gen" in timing and metrics == {}
    assert schedule.checkpoint_state() == ({"drawn": 2}, {})
    schedule.after_update(timing)
    assert host.actor_rollout_wg.calls == [] and schedule.step_metrics({"gen": 1.0, "step": 4.0}) == {}


def test_one_step_off_takes_the_prefetched_batch_settles_before_saving_and_checkpoints_before_the_prefetch():
    host = Host(config(one_step_off=True))
    schedule = make_schedule(host.config, host)
    with pytest.raises(RuntimeError, match="batches"):
        schedule.rollout({"id": 0}, 1, False, {}, {})
    assert schedule.checkpoint_state() == ({"drawn": 0}, {})  # not started: the dataloader's position
    items = iter(schedule.batches(host.train_dataloader.batches(3)))
    for step in (1, 2):
        next(items)
        metrics, timing = {}, {}
        joined = schedule.rollout(None, step, False, metrics, timing)
        assert joined[1] == step - 1 and "gen" in timing and "sync_rollout_weights" in timing
        assert metrics["fully_async/staleness/max"] == (0.0 if step == 1 else 1.0)
        assert schedule.checkpoint_state() == ({"drawn": step}, {})  # before the prefetch drew it
        events: dict = {}
        schedule.before_validation_or_save("a checkpoint", events)
        assert "gen_next" in events and host.generated == list(range(step + 1))  # the next batch, generated
        host.actor_rollout_wg.version += 1  # the update
    assert host.actor_rollout_wg.calls == ["sync_rollout_weights"] * 2
    assert schedule.step_metrics({"gen": 1.0, "step": 4.0}) == {"fully_async/trainer/idle_ratio": 0.25}


class FakeStream:
    """Stands in for StreamingRollout: records how the schedule built and drove it."""

    def __init__(self, batches, prepare, wg, sync, dataloader_state, settings, n, version, done_rows):
        self.args = dict(wg=wg, sync=sync, settings=settings, n=n, version=version, done_rows=done_rows)
        self.events = []

    def __iter__(self):
        return iter([None])

    def take(self, metrics, timing_raw):
        self.events.append("take")
        return "batch"

    def sync_weights(self, timing_raw):
        self.events.append("sync_weights")

    def checkpoint_state(self):
        return {"drawn": 1}, [[0, 2]]

    def close(self, quiet=False):
        self.events.append(("close", quiet))


@pytest.mark.parametrize("own_pool", [False, True])
def test_fully_async_streams_syncs_after_the_update_and_checkpoints_the_done_rows(monkeypatch, own_pool):
    monkeypatch.setattr(schedules, "StreamingRollout", FakeStream)
    monkeypatch.setattr(schedules, "stream_settings", lambda cfg, pad: ("settings", pad))
    host = Host(config(mode="separate_async" if own_pool else "colocate_async", n=3))
    host.actor_rollout_wg.version = 4
    if own_pool:
        host.rollout_wg = Workers()
    schedule = make_schedule(host.config, host)
    assert DataExhausted in schedule.early_stop
    schedule.close(quiet=False)  # nothing started: nothing to close
    assert schedule.checkpoint_state() == ({"drawn": 0}, {})
    schedule.restore({"global_step": 4, "stream_done_rows": [[1]]})
    stream = schedule.batches(iter([]))
    assert stream.args["done_rows"] == [[1]] and stream.args["n"] == 3 and stream.args["wg"] is host.rollout_wg
    assert stream.args["version"] == 4  # the engines got the actor's weights first
    expected = ["engine_weights"] if own_pool else ["sync_rollout_weights"]
    assert host.actor_rollout_wg.calls == expected
    if own_pool:
        assert host.rollout_wg.calls == [("update_weights", "state", 4)]
    assert schedule.rollout(None, 1, False, {}, {}) == "batch"
    schedule.after_update({})
    assert schedule.checkpoint_state() == ({"drawn": 1}, {"stream_done_rows": [[0, 2]]})
    schedule.close(quiet=True)
    assert stream.events == ["take", "sync_weights", ("close", True)]
