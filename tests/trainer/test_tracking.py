"""Loggers: console line, JSON-lines file (incl. resume), registry, optional backends."""

import json
import math
import subprocess
import sys
import types

import numpy as np
import pytest
import torch

from hybridrl.trainer import tracking as T
from hybridrl.trainer.tracking import (
    MissingLoggerPackage,
    Tracking,
    TrackingError,
    format_console_line,
    register_logger,
)


def _read_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_file_logger_writes_one_plain_line_per_step(tmp_path):
    tracker = Tracking("p", "e", "file", local_dir=str(tmp_path))
    tracker.log({"a": np.float32(0.5), "b": torch.tensor(3), "c": "x", "nan": float("nan"),
                 "vec": torch.ones(3)}, step=1)
    tracker.log({"a": 1.5}, step=2)
    # flushed per line: readable before finish
    lines = _read_lines(tmp_path / "metrics.jsonl")
    assert lines == [{"step": 1, "a": 0.5, "b": 3, "c": "x", "nan": None}, {"step": 2, "a": 1.5}]
    assert type(lines[0]["b"]) is int
    tracker.finish()
    tracker.finish()  # idempotent


def test_file_logger_resume_drops_stale_steps(tmp_path):
    with Tracking("p", "e", ["file"], local_dir=str(tmp_path)) as tracker:
        for step in (1, 2, 3, 4):
            tracker.log({"x": float(step)}, step=step)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "x": ')  # a line cut short by a crash
    # resume from the checkpoint of step 2: steps 3.. are redone
    with Tracking("p", "e", ["file"], local_dir=str(tmp_path)) as tracker:
        tracker.log({"x": 30.0}, step=3)
        tracker.log({"x": 40.0}, step=4)
    lines = _read_lines(tmp_path / "metrics.jsonl")
    assert [(d["step"], d["x"]) for d in lines] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]


def test_file_logger_needs_local_dir():
    with pytest.raises(TrackingError, match="default_local_dir"):
        Tracking("p", "e", "file", local_dir=None)


def test_console_line_format():
    data = {
        "critic/score/mean": 0.3124, "critic/rewards/mean": np.float64(0.25),
        "actor/ppo_kl": 0.00123, "actor/entropy": 1.2345, "response_length/mean": 145.25,
        "actor/pg_loss": torch.tensor(-0.0456), "perf/time_per_step": 12.34,
        "val-core/openai/gsm8k/reward/mean@1": 0.5, "timing_s/gen": 3.0, "other": 7.0,
    }
    line = format_console_line(data, step=3, total_steps=40)
    assert line == (
        "step 3/40 | score 0.312 | reward 0.25 | ppo_kl 0.00123 | entropy 1.23 | resp_len 145.2"
        " | pg_loss -0.0456 | val openai/gsm8k 0.5 | 12.3s/step"
    )
    assert format_console_line({"critic/vf_loss": 2.0}, step=7) == "step 7 | vf_loss 2"


def test_console_logger_prints_lines_without_bar_when_not_tty(capsys):
    with Tracking("p", "e", "console", total_steps=2) as tracker:
        tracker.log({"critic/score/mean": 0.5}, step=1)
        tracker.log({"critic/score/mean": 0.75}, step=2)
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["step 1/2 | score 0.5", "step 2/2 | score 0.75"]
    assert captured.err == ""  # stderr is not a tty under capsys: no bar noise in logs


def test_console_bar_advances_on_tty(monkeypatch, capsys):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    logger = T.ConsoleLogger(total_steps=10)
    logger.log({}, step=4)  # a resumed run starting at step 4
    logger.log({}, step=5)
    assert logger._bar.n == 5 and logger._bar.total == 10
    logger.finish()
    assert capsys.readouterr().out.splitlines() == ["step 4/10", "step 5/10"]


def test_unknown_logger_lists_known_ones():
    with pytest.raises(ValueError) as err:
        Tracking("p", "e", ["console", "mlfloww"])
    message = str(err.value)
    assert "trainer.logger" in message and "mlfloww" in message
    for known in ("console", "file", "tensorboard", "wandb"):
        assert known in message


def test_register_custom_logger(monkeypatch):
    monkeypatch.setattr(T, "_LOGGERS", dict(T._LOGGERS))
    seen = []

    @register_logger("memory")
    class MemoryLogger:
        def __init__(self, **kwargs):
            seen.append(("init", kwargs["project_name"], kwargs["total_steps"]))

        def log(self, data, step):
            seen.append(("log", step, data["x"]))

        def finish(self):
            seen.append(("finish",))

    assert "memory" in T.available_loggers()
    with Tracking("proj", "exp", ["memory", "memory"], total_steps=9) as tracker:
        tracker.log({"x": 1.0}, step=1)
    assert seen == [("init", "proj", 9), ("log", 1, 1.0), ("finish",)]
    with pytest.raises(TrackingError, match="already registered"):
        register_logger("memory")(type("Other", (), {}))


def test_import_stays_light():
    code = (
        "import sys, hybridrl.trainer.tracking, hybridrl.trainer.metrics;"
        "bad = [m for m in ('wandb', 'tensorboard', 'torch.utils.tensorboard', 'transformers')"
        " if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_missing_packages_give_pip_hint(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import fails as if not installed
    with pytest.raises(MissingLoggerPackage, match="pip install wandb"):
        Tracking("p", "e", "wandb")
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(MissingLoggerPackage, match="pip install tensorboard"):
        Tracking("p", "e", "tensorboard", local_dir=str(tmp_path))


def test_wandb_logger_with_fake_module(monkeypatch):
    from omegaconf import OmegaConf

    calls = []
    fake = types.SimpleNamespace(
        init=lambda **kw: calls.append(("init", kw)),
        log=lambda data, step: calls.append(("log", data, step)),
        finish=lambda: calls.append(("finish",)),
    )
    monkeypatch.setitem(sys.modules, "wandb", fake)
    config = OmegaConf.create({"trainer": {"total_epochs": 2, "name": "${trainer.total_epochs}"}})
    with Tracking("proj", "exp", ["wandb"], config=config) as tracker:
        tracker.log({"x": 1.0}, step=3)
    assert calls == [
        ("init", {"project": "proj", "name": "exp",
                  "config": {"trainer": {"total_epochs": 2, "name": 2}}}),
        ("log", {"x": 1.0}, 3),
        ("finish",),
    ]


def test_tensorboard_logger_with_fake_writer(monkeypatch, tmp_path):
    events = []

    class FakeWriter:
        def __init__(self, log_dir):
            events.append(("dir", log_dir))

        def add_scalar(self, key, value, step):
            events.append((key, value, step))

        def flush(self):
            pass

        def close(self):
            events.append(("close",))

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard",
                        types.SimpleNamespace(SummaryWriter=FakeWriter))
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    with Tracking("p", "e", "tensorboard", local_dir=str(tmp_path)) as tracker:
        tracker.log({"a": np.float32(2.0), "s": "text", "inf": math.inf}, step=5)
    assert events[0] == ("dir", str(tmp_path / "tensorboard"))
    assert events[1:] == [("a", 2.0, 5), ("inf", math.inf, 5), ("close",)]
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb"))
    Tracking("p", "e", "tensorboard").finish()
    assert events[-2] == ("dir", str(tmp_path / "tb"))
