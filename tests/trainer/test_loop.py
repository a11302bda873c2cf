"""The one training loop (hybridrl/trainer/run/loop.py) with a fake trainer: no model, no workers."""

import pytest

from hybridrl.trainer.run.loop import LoopHooks, LoopSettings, epoch_batches, is_due, run_training


class Tracker:
    def __init__(self):
        self.logged = []

    def log(self, data, step):
        self.logged.append((step, dict(data)))

    def steps(self):
        return [step for step, _ in self.logged]


class FakeTrainer:
    """Trains on the batches of ``epochs`` (a list of lists); records what the loop asked."""

    def __init__(self, epochs, total, validation=True, resume_at=0, resume_rest=None):
        self.dataloader_epochs = list(epochs)
        self.train_dataloader = self  # iterated once per epoch
        self.total_training_steps = total
        self.global_steps = 0
        self.validation = validation
        self.resume_at, self.resume_rest = resume_at, resume_rest
        self.calls = []

    def __iter__(self):
        return iter(self.dataloader_epochs.pop(0) if self.dataloader_epochs else [])

    def load_checkpoint(self):
        self.calls.append("load")
        if not self.resume_at:
            return None
        self.global_steps = self.resume_at
        return iter(self.resume_rest)

    def has_validation(self):
        return self.validation

    def validate(self):
        self.calls.append(("validate", self.global_steps))
        return {"val/score": float(self.global_steps)}

    def step(self, batch):
        self.calls.append(("step", self.global_steps, batch))
        return {"perf/time_per_step": 1.0, "batch": batch}

    def save_checkpoint(self):
        self.calls.append(("save", self.global_steps))
        return f"global_step_{self.global_steps}"


def settings(test_freq=-1, save_freq=-1, val_before_train=False, **kw):
    return LoopSettings(test_freq=test_freq, save_freq=save_freq, val_before_train=val_before_train, **kw)


@pytest.mark.parametrize(
    "step, freq, is_last, on_last, due",
    [
        (2, 2, False, False, True),
        (3, 2, False, False, False),
        (3, 2, True, False, True),  # the last step always, with a frequency
        (5, -1, True, False, False),  # <= 0: never, not even the last
        (5, 0, False, False, False),
        (5, -1, True, True, True),  # always_on_last (hybridrl rm)
        (4, -1, False, True, False),
    ],
)
def test_is_due(step, freq, is_last, on_last, due):
    assert is_due(step, freq, is_last, on_last) is due


def test_steps_validations_and_checkpoints_on_schedule_with_their_timings():
    trainer, tracker = FakeTrainer([["a", "b", "c"], ["d", "e"]], total=5), Tracker()
    run_training(trainer, tracker, settings(test_freq=2, save_freq=3, val_before_train=True))
    assert tracker.steps() == [0, 1, 2, 3, 4, 5]  # validation before training, then every step
    assert [b for *_, b in (c for c in trainer.calls if c[0] == "step")] == ["a", "b", "c", "d", "e"]
    validated = [c[1] for c in trainer.calls if c[0] == "validate"]
    assert validated == [0, 2, 4, 5]
    assert [c for c in trainer.calls if c[0] == "save"] == [("save", 3), ("save", 5)]
    by_step = dict(tracker.logged)
    assert "timing_s/testing" in by_step[2] and "timing_s/save_checkpoint" not in by_step[2]
    assert "timing_s/save_checkpoint" in by_step[3] and "timing_s/testing" not in by_step[3]
    assert not any(k.startswith("timing_s/") for k in by_step[1])
    assert by_step[1]["perf/time_per_step"] == 1.0
    last = by_step[5]
    assert last["perf/time_per_step"] == 1.0 + last["timing_s/testing"] + last["timing_s/save_checkpoint"]
    assert by_step[4]["val/score"] == 4.0


def test_a_resumed_run_trains_the_rest_of_its_epoch_first_and_does_not_validate_before():
    trainer = FakeTrainer([["x", "y"], ["z", "w"]], total=5, resume_at=2, resume_rest=["c"])
    tracker = Tracker()
    run_training(trainer, tracker, settings(val_before_train=True))
    assert trainer.calls[0] == "load"
    assert [c[1:] for c in trainer.calls if c[0] == "step"] == [(3, "c"), (4, "x"), (5, "y")]
    assert tracker.steps() == [3, 4, 5] and trainer.global_steps == 5


def test_a_run_resumed_at_its_last_step_trains_nothing(capsys):
    trainer = FakeTrainer([["a"]], total=3, resume_at=3, resume_rest=["b"])
    hooks = RecordingHooks()
    run_training(trainer, Tracker(), settings(test_freq=1, save_freq=1, val_before_train=True), hooks)
    assert trainer.calls == ["load"] and hooks.events == []
    assert "the run is complete" in capsys.readouterr().out


def test_val_only_validates_and_stops():
    trainer, tracker = FakeTrainer([["a"]], total=3), Tracker()
    run_training(trainer, tracker, settings(val_before_train=True, val_only=True))
    assert trainer.calls == ["load", ("validate", 0)] and tracker.steps() == [0]


def test_without_validation_data_nothing_validates():
    trainer, tracker = FakeTrainer([["a", "b"]], total=2, validation=False), Tracker()
    run_training(trainer, tracker, settings(test_freq=1, val_before_train=True))
    assert not [c for c in trainer.calls if c[0] == "validate"] and tracker.steps() == [1, 2]


def test_always_on_last_saves_and_validates_the_last_step_only():
    trainer = FakeTrainer([["a", "b", "c"]], total=3)
    run_training(trainer, Tracker(), settings(always_on_last=True))
    assert [c for c in trainer.calls if c[0] in ("save", "validate")] == [("validate", 3), ("save", 3)]


class RecordingHooks(LoopHooks):
    def __init__(self, early_stop=()):
        self.early_stop, self.events = early_stop, []

    def batches(self, batches):
        self.events.append("start")
        return batches

    def before_validation_or_save(self, what, timing):
        self.events.append(what)
        timing["gen_next"] = 0.5

    def close(self, quiet):
        self.events.append(("close", quiet))


def test_the_hooks_start_settle_before_validation_or_a_checkpoint_and_close():
    trainer, tracker, hooks = FakeTrainer([["a", "b", "c"]], total=3), Tracker(), RecordingHooks()
    run_training(trainer, tracker, settings(test_freq=2, save_freq=1), hooks)
    assert hooks.events == ["start", "a checkpoint", "validation", "validation", ("close", False)]
    assert tracker.logged[1][1]["timing_s/gen_next"] == 0.5
    assert tracker.logged[1][1]["perf/time_per_step"] >= 1.5


def test_early_stop_ends_the_run_cleanly_and_an_error_closes_quietly(capsys):
    class Exhausted(Exception):
        pass

    trainer, hooks = FakeTrainer([["a", "b", "c"]], total=3), RecordingHooks(early_stop=(Exhausted,))
    steps = trainer.step
    trainer.step = lambda batch: (_ for _ in ()).throw(Exhausted("2 groups left")) if batch == "b" else steps(batch)
    tracker = Tracker()
    run_training(trainer, tracker, settings(), hooks)
    assert tracker.steps() == [1] and hooks.events[-1] == ("close", False)
    assert "stopping at step 2: the data ran out (2 groups left)" in capsys.readouterr().out

    trainer, hooks = FakeTrainer([["a", "b"]], total=2), RecordingHooks()
    trainer.step = lambda batch: (_ for _ in ()).throw(RuntimeError("engine died"))
    with pytest.raises(RuntimeError, match="engine died"):
        run_training(trainer, Tracker(), settings(), hooks)
    assert hooks.events[-1] == ("close", True)


def test_a_step_still_collecting_does_not_advance():
    trainer, tracker = FakeTrainer([["a", "skip", "b"]], total=2), Tracker()
    steps = trainer.step
    trainer.step = lambda batch: None if batch == "skip" else steps(batch)
    run_training(trainer, tracker, settings())
    assert [(s, d["batch"]) for s, d in tracker.logged] == [(1, "a"), (2, "b")]


def test_epoch_batches_starts_with_the_resumed_rest_and_ends_on_an_empty_epoch():
    epochs = [[1, 2], [3]]
    loader = type("Loader", (), {"__iter__": lambda self: iter(epochs.pop(0) if epochs else [])})()
    assert list(epoch_batches(loader, iter([0]))) == [0, 1, 2, 3]
