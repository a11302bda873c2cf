"""One error base: every error the user can fix is a UserError and prints as one line."""

import importlib
import inspect
import pkgutil
import sys
import types

import pytest

import hybridrl
from hybridrl import cli
from hybridrl.errors import UserError

# Errors that are not the user's to fix: contract violations between our own modules (a bug, so
# the traceback matters) or control flow caught inside hybridrl. Every other error class is a
# UserError; a new class must choose.
INTERNAL = {
    "hybridrl.agents.tools.gsm8k._TooLarge": "caught by the calculator tool",
    "hybridrl.agents.tools.loop.ToolLoopTimeout": "becomes the tool call's timeout message",
    "hybridrl.controller.ray.WorkerError": "a worker crashed: the traceback is the report",
    "hybridrl.models.output_head.HeadOutputError": "model-output contract",
    "hybridrl.models.padding.PackingError": "packing contract",
    "hybridrl.protocol.errors.DataProtoError": "DataProto API contract (and its subclasses)",
    "hybridrl.protocol.errors.BatchSizeMismatchError": "",
    "hybridrl.protocol.errors.ChunkSizeError": "",
    "hybridrl.protocol.errors.ConcatConflictError": "",
    "hybridrl.protocol.errors.MissingKeyError": "",
    "hybridrl.protocol.errors.UnionConflictError": "",
    "hybridrl.rewards.code.CodeSandboxError": "infrastructure failure, reported by the reward manager",
    "hybridrl.rewards.code_tests.CodeGroundTruthError": "goes through reward_model.on_error",
    "hybridrl.rewards.judge.JudgeParseError": "goes through reward_model.on_error",
    "hybridrl.rewards.manager.RewardInputError": "reward-manager input contract",
    "hybridrl.rewards.pool.ScoreTimeoutError": "goes through reward_model.on_error",
    "hybridrl.rewards.pool.ScoringProcessDied": "goes through reward_model.on_error",
    "hybridrl.rewards.qa_em.QAGroundTruthError": "goes through reward_model.on_error",
    "hybridrl.rewards.sandbox.jail.JailError": "becomes the sandboxed run's error outcome",
    "hybridrl.trainer.schedules.fully_async.DataExhausted": "control flow: the data set ran out",
    "hybridrl.trainer.ppo.metrics.MetricsInputError": "metrics input contract",
    "hybridrl.trainer.ppo.validation_metrics.ValidationMetricsError": "metrics input contract",
    "hybridrl.workers.dcp_safe._Refused": "caught by read_dcp_metadata, which raises a CheckpointError naming the file",
    "hybridrl.workers.llm_judge.JudgeBusyError": "a ScoreTimeoutError",
}


def _error_classes():
    found = {}
    for info in pkgutil.walk_packages(hybridrl.__path__, "hybridrl."):
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == info.name:
                found[f"{info.name}.{obj.__qualname__}"] = obj
    return found


def test_every_error_class_is_a_user_error_or_listed_as_internal():
    found = _error_classes()
    internal = {name for name, cls in found.items() if not issubclass(cls, UserError)}
    assert internal == set(INTERNAL), "a new error class: subclass hybridrl.errors.UserError or list it in INTERNAL"
    assert len(found) - len(internal) >= 30  # config, data, model, reward, registry, checkpoint, ... errors


def _fake_command(monkeypatch, exc):
    def main(argv):
        raise exc

    monkeypatch.setitem(sys.modules, "fake_command", types.SimpleNamespace(main=main))
    monkeypatch.setitem(cli.COMMANDS, "fake", ("fake_command", "raises"))


def test_a_user_error_from_any_command_is_one_line_and_exit_code_2(monkeypatch, capsys):
    from hybridrl.trainer.run.checkpoint import CheckpointError

    monkeypatch.delenv("HYBRIDRL_DEBUG", raising=False)
    _fake_command(monkeypatch, CheckpointError("checkpoint /x is incomplete; resume from global_step_2"))
    assert cli.main(["fake"]) == 2
    assert capsys.readouterr().err == "hybridrl: error: checkpoint /x is incomplete; resume from global_step_2\n"


def test_a_bug_keeps_its_traceback_and_debug_keeps_user_errors_traceback(monkeypatch):
    from hybridrl.errors import ConfigError

    monkeypatch.delenv("HYBRIDRL_DEBUG", raising=False)
    _fake_command(monkeypatch, KeyError("internal"))
    with pytest.raises(KeyError):
        cli.main(["fake"])
    monkeypatch.setenv("HYBRIDRL_DEBUG", "1")
    _fake_command(monkeypatch, ConfigError("data.train_batch_size=0 must be > 0"))
    with pytest.raises(ConfigError):
        cli.main(["fake"])


def test_errors_stay_what_they_were_for_callers_that_catch_builtins():
    from hybridrl.errors import ConfigError
    from hybridrl.models import ModelDependencyError
    from hybridrl.rewards.manager import RewardFunctionError

    assert issubclass(ConfigError, ValueError) and issubclass(RewardFunctionError, RuntimeError)
    assert issubclass(ModelDependencyError, ImportError)
