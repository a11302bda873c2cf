"""Loggers: console line, JSON-lines file (incl. resume), registry, optional backends."""

import json
import math
import os
import subprocess
import sys
import types

import numpy as np
import pytest
import torch

from hybridrl.trainer.run import tracking as T
from hybridrl.trainer.run.tracking import (
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
    tracker.log(
        {"a": np.float32(0.5), "b": torch.tensor(3), "c": "x", "nan": float("nan"), "vec": torch.ones(3)}, step=1
    )
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
        "critic/score/mean": 0.3124,
        "critic/rewards/mean": np.float64(0.25),
        "actor/ppo_kl": 0.00123,
        "actor/entropy": 1.2345,
        "response_length/mean": 145.25,
        "actor/pg_loss": torch.tensor(-0.0456),
        "perf/time_per_step": 12.34,
        "val-core/openai/gsm8k/reward/mean@1": 0.5,
        "timing_s/gen": 3.0,
        "other": 7.0,
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
    assert captured.out.splitlines() == [
        "step 1/2 | score 0.5",
        "  critic/score/mean:0.5",
        "step 2/2 | score 0.75",
        "  critic/score/mean:0.75",
    ]
    assert captured.err == ""  # stderr is not a tty under capsys: no bar noise in logs


def test_console_prints_every_metric_by_name_sorted_below_the_summary(capsys):
    """verl's console logger prints every metric each step; here the summary line, then each
    metric group (the name up to its first '/') on its own line(s), sorted, by full name."""
    data = {
        "critic/vf_loss": 0.0,
        "critic/score/mean": 0.0,
        "actor/entropy": 1.23456789,
        "timing_s/step": 3.5,
        "training/global_step": 1,
        "response_length/clip_ratio": 0.0,
        "perf/throughput": 1234.56789,
        "val-core/openai/gsm8k/reward/mean@1": 0.25,
        "some/list": [1, 2],  # not one number: left out
        **{f"critic/advantages/p{i:02d}": i / 10 for i in range(10)},
    }
    with Tracking("p", "e", "console", total_steps=1) as tracker:
        tracker.log(data, step=1)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "step 1/1 | score 0 | entropy 1.23 | vf_loss 0 | val openai/gsm8k 0.25"
    assert lines[1] == "  actor/entropy:1.23457"
    critic = [line for line in lines if line.startswith("  critic/")]
    assert len(critic) > 1 and all(len(line) <= 120 for line in critic)  # a long group wraps
    tokens = " ".join(critic).split()
    assert tokens == sorted(tokens) and tokens[-2:] == ["critic/score/mean:0", "critic/vf_loss:0"]
    assert lines[-5:] == [
        "  perf/throughput:1234.57",
        "  response_length/clip_ratio:0",
        "  timing_s/step:3.5",
        "  training/global_step:1",
        "  val-core/openai/gsm8k/reward/mean@1:0.25",
    ]
    assert "some/list" not in "\n".join(lines)
    assert T.format_console_metrics({"step": 3, "x": "text"}) == ""  # nothing numeric: no block


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
    monkeypatch.setattr(T.LOGGERS, "table", dict(T.LOGGERS.table))
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
        "import sys, hybridrl.trainer.run.tracking, hybridrl.trainer.ppo.metrics;"
        "bad = [m for m in ('wandb', 'mlflow', 'tensorboard', 'torch.utils.tensorboard', 'transformers')"
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
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(MissingLoggerPackage) as err:
        Tracking("p", "e", ["console", "mlflow"], local_dir=str(tmp_path))
    assert str(err.value) == (
        "trainer.logger: 'mlflow' needs the mlflow package; "
        "run `pip install mlflow` or drop 'mlflow' from trainer.logger"
    )


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
        ("init", {"project": "proj", "name": "exp", "config": {"trainer": {"total_epochs": 2, "name": 2}}}),
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

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=FakeWriter))
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    with Tracking("p", "e", "tensorboard", local_dir=str(tmp_path)) as tracker:
        tracker.log({"a": np.float32(2.0), "s": "text", "inf": math.inf}, step=5)
    assert events[0] == ("dir", str(tmp_path / "tensorboard"))
    assert events[1:] == [("a", 2.0, 5), ("inf", math.inf, 5), ("close",)]
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb"))
    Tracking("p", "e", "tensorboard").finish()
    assert events[-2] == ("dir", str(tmp_path / "tb"))


# ---------------------------------------------------------------- validation samples, wandb offline, mlflow

SAMPLES = [
    {"input": "system\nQ: 2+3?\nassistant\n", "output": "\n\n\n", "score": 0.0, "ground_truth": "5", "step": 4},
    {"input": "x" * 500 + "END", "output": "It is 5.\n#### 5", "score": 1.0, "ground_truth": "5", "step": 4},
]


def test_val_generations_go_to_log_generations_not_to_metrics(monkeypatch, tmp_path):
    monkeypatch.setattr(T.LOGGERS, "table", dict(T.LOGGERS.table))
    seen = []

    @register_logger("samples")
    class SampleLogger:
        def __init__(self, **_):
            pass

        def log(self, data, step):
            seen.append(("log", dict(data), step))

        def log_generations(self, samples, step):
            seen.append(("gen", samples, step))

        def finish(self):
            pass

    data = {"x": 1.0, T.VAL_GENERATIONS_KEY: SAMPLES}
    with Tracking("p", "e", ["samples", "file"], local_dir=str(tmp_path)) as tracker:
        tracker.log(data, step=4)
        tracker.log({"x": 2.0}, step=5)
    assert seen == [("log", {"x": 1.0}, 4), ("gen", SAMPLES, 4), ("log", {"x": 2.0}, 5)]
    assert T.VAL_GENERATIONS_KEY in data  # the caller's dict is left alone
    assert _read_lines(tmp_path / "metrics.jsonl") == [{"step": 4, "x": 1.0}, {"step": 5, "x": 2.0}]


def test_console_prints_val_generations(capsys):
    with Tracking("p", "e", "console") as tracker:
        tracker.log({T.VAL_GENERATIONS_KEY: SAMPLES}, step=4)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "step 4"
    assert lines[1] == "step 4 | validation sample 1/2 | score 0.0 | ground_truth 5"
    assert lines[2:7] == ["  input:", "    system", "    Q: 2+3?", "    assistant", "  output:"]
    assert lines[7] == "    '\\n\\n\\n'"  # a whitespace-only response is shown quoted, not as blank lines
    assert lines[8] == "step 4 | validation sample 2/2 | score 1.0 | ground_truth 5"
    assert lines[10] == "    ..." + "x" * 397 + "END"  # prompts keep their end: the question
    assert lines[11:] == ["  output:", "    It is 5.", "    #### 5"]


def test_wandb_offline_writes_under_run_dir_and_logs_a_table(monkeypatch, tmp_path):
    calls = []

    class Table:
        def __init__(self, columns, data):
            self.columns, self.data = columns, data

    def init(**kwargs):
        calls.append(("init", os.environ.get("WANDB_MODE"), kwargs["dir"]))

    fake = types.SimpleNamespace(
        init=init,
        Table=Table,
        finish=lambda: calls.append(("finish",)),
        log=lambda data, step: calls.append(("log", data, step)),
    )
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setenv("WANDB_MODE", "offline")
    with Tracking("p", "e", "wandb", local_dir=str(tmp_path / "run")) as tracker:
        tracker.log({"a": np.float32(0.5), "text": "x", "vec": torch.ones(2), T.VAL_GENERATIONS_KEY: SAMPLES[:1]}, 1)
        tracker.log({T.VAL_GENERATIONS_KEY: SAMPLES[1:]}, step=2)
    assert calls[0] == ("init", "offline", str(tmp_path / "run"))
    assert (tmp_path / "run").is_dir()
    assert calls[1] == ("log", {"a": 0.5}, 1)
    tables = [(c[1]["val/generations"], c[2]) for c in calls if c[0] == "log" and "val/generations" in c[1]]
    assert [t.columns for t, _ in tables] == [["step", "input", "output", "score", "ground_truth"]] * 2
    # wandb tables cannot grow once logged: each validation logs all rows so far
    assert [[row[0] for row in t.data] for t, _ in tables] == [[1], [1, 2]]
    assert tables[1][0].data[1][2:] == ["It is 5.\n#### 5", 1.0, '"5"']
    assert calls[-1] == ("finish",)


def test_wandb_login_error_is_one_line(monkeypatch):
    class WandbError(Exception):
        pass

    def init(**_):
        raise WandbError("api_key not configured (no-tty).\ncall wandb.login(key=[your_api_key])")

    fake = types.SimpleNamespace(init=init, errors=types.SimpleNamespace(Error=WandbError))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    with pytest.raises(TrackingError) as err:
        Tracking("p", "e", "wandb")
    assert "\n" not in str(err.value)
    assert "api_key not configured (no-tty)." in str(err.value) and "WANDB_MODE=offline" in str(err.value)


def _fake_mlflow(calls):
    def record(name):
        return lambda *args, **kwargs: calls.append((name, args, kwargs)) or object()

    return types.SimpleNamespace(
        **{
            name: record(name)
            for name in (
                "set_tracking_uri",
                "create_experiment",
                "set_experiment",
                "start_run",
                "log_params",
                "log_metrics",
                "log_dict",
                "end_run",
            )
        },
        get_experiment_by_name=lambda name: None,
    )


def test_mlflow_logger_with_fake_module(monkeypatch, tmp_path):
    from omegaconf import OmegaConf

    calls = []
    monkeypatch.setitem(sys.modules, "mlflow", _fake_mlflow(calls))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = OmegaConf.create(
        {
            "trainer": {"total_epochs": 2, "name": "${trainer.total_epochs}", "logger": ["console", "mlflow"]},
            "seed": None,
        }
    )
    with Tracking("proj", "exp", ["mlflow"], config=config, local_dir=str(tmp_path)) as tracker:
        tracker.log(
            {
                "val-core/openai/gsm8k/reward/mean@1": 0.5,
                "actor/kl(x)": np.float64(2),
                "note": "x",
                T.VAL_GENERATIONS_KEY: SAMPLES,
            },
            step=3,
        )
    names = [c[0] for c in calls]
    assert names == [
        "set_tracking_uri",
        "create_experiment",
        "set_experiment",
        "start_run",
        "log_params",
        "log_metrics",
        "log_dict",
        "end_run",
    ]
    assert calls[0][1] == (f"sqlite:///{(tmp_path / 'mlflow.db').resolve()}",)
    assert calls[1][1] == ("proj",) and calls[1][2] == {"artifact_location": (tmp_path / "mlartifacts").as_uri()}
    assert calls[2][1] == ("proj",) and calls[3][2] == {"run_name": "exp"}
    assert calls[4][1] == (
        {"trainer.total_epochs": "2", "trainer.name": "2", "trainer.logger": "['console', 'mlflow']", "seed": "None"},
    )
    assert calls[5][1] == ({"val-core/openai/gsm8k/reward/mean_at_1": 0.5, "actor/kl_x_": 2.0},)
    assert calls[5][2] == {"step": 3}
    assert calls[6][1] == ({"step": 3, "samples": SAMPLES}, "val_generations/step_3.json")


def test_mlflow_respects_tracking_uri_env(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setitem(sys.modules, "mlflow", _fake_mlflow(calls))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    Tracking("proj", "exp", "mlflow", local_dir=str(tmp_path)).finish()
    assert [c[0] for c in calls] == ["set_experiment", "start_run", "end_run"]  # no params without a config


def test_mlflow_key_sanitizing():
    from hybridrl.trainer.run.loggers_optional import mlflow_key

    assert mlflow_key("val-core/a b/reward/mean@4") == "val-core/a b/reward/mean_at_4"
    assert mlflow_key("timing_s/gen:0.x") == "timing_s/gen:0.x"
    assert mlflow_key("actor/kl[k3]") == "actor/kl_k3_"


def test_swanlab_logger_does_what_verls_does(monkeypatch):
    """verl's swanlab backend: log in with SWANLAB_API_KEY, init with its mode and log folder and
    the config, scalars per step, validation samples as an echarts table, finish at the end."""
    from omegaconf import OmegaConf

    calls = []

    class Table:
        def add(self, headers, rows):
            calls.append(("table", headers, rows))

    fake = types.SimpleNamespace(
        login=lambda key: calls.append(("login", key)),
        init=lambda **kw: calls.append(("init", kw)),
        log=lambda data, step: calls.append(("log", data if "val/generations" not in data else "table", step)),
        finish=lambda: calls.append(("finish",)),
        echarts=types.SimpleNamespace(Table=Table),
    )
    monkeypatch.setitem(sys.modules, "swanlab", fake)
    monkeypatch.setenv("SWANLAB_API_KEY", "k")
    monkeypatch.setenv("SWANLAB_MODE", "offline")
    monkeypatch.delenv("SWANLAB_LOG_DIR", raising=False)
    config = OmegaConf.create({"trainer": {"total_epochs": 2}})
    with Tracking("proj", "exp", ["swanlab"], config=config) as tracker:
        tracker.log({"x": 1.0, "note": "text"}, step=3)
        tracker.log_generations([{"input": "q", "output": "a", "score": 1.0, "ground_truth": "a"}], step=3)
    assert calls == [
        ("login", "k"),
        (
            "init",
            {
                "project": "proj",
                "experiment_name": "exp",
                "config": {"FRAMEWORK": "hybridrl", "trainer": {"total_epochs": 2}},
                "logdir": "swanlog",
                "mode": "offline",
            },
        ),
        ("log", {"x": 1.0}, 3),
        ("table", ["step", "input", "output", "score"], [[3, "q", "a", 1.0]]),
        ("log", "table", 3),
        ("finish",),
    ]
    monkeypatch.setitem(sys.modules, "swanlab", None)  # not installed: one line naming the package
    with pytest.raises(MissingLoggerPackage, match="'swanlab' needs the swanlab package; run `pip install swanlab`"):
        Tracking("p", "e", ["swanlab"])
