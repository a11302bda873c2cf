"""verl's torch profiler tool (issue 34, item 2): the config sections and their one-line refusals,
which steps are traced, which ranks record, and the trace a worker's process writes per step."""

import json
import os

import pytest
import torch
from omegaconf import OmegaConf

from hybridrl.config import ConfigError
from hybridrl.config.verl_compat import check_verl_only
from hybridrl.workers.config.profiler import GlobalProfilerConfig, starts, stops
from hybridrl.workers.profiler import ProfiledWorker, role_profiler, trace_path


def _config(changes: dict | None = None):
    from tiny_models import ppo_config_with

    return ppo_config_with(changes)


def _section(enable=True, tool="torch", all_ranks=False, ranks=(), contents=(), save_path="out"):
    return OmegaConf.create(
        {
            "tool": tool,
            "enable": enable,
            "all_ranks": all_ranks,
            "ranks": list(ranks),
            "save_path": save_path,
            "tool_config": {"torch": {"contents": list(contents), "discrete": False}},
        }
    )


class _Worker(ProfiledWorker):
    def __init__(self, role, sections, rank=0):
        self.profiler = role_profiler(role, sections, rank)


def test_the_role_sections_follow_global_profiler():
    config = _config(
        {
            "global_profiler": {"tool": "torch", "steps": [2], "save_path": "/tmp/p"},
            "critic": {"profiler": {"enable": True}},
        }
    )
    policy = config.actor_rollout_ref
    assert policy.actor.profiler.tool == "torch" and policy.actor.profiler.save_path == "/tmp/p"
    assert config.critic.profiler.enable and not policy.actor.profiler.enable
    assert policy.rollout.profiler.tool_config.torch.contents == []  # the actor's


@pytest.mark.parametrize("tool", ["npu", "precision_debugger"])
def test_another_tool_is_refused_in_one_line_naming_it(tool):
    with pytest.raises(ConfigError, match=f"global_profiler.tool={tool}: verl's {tool} profiler"):
        GlobalProfilerConfig(tool=tool)
    with pytest.raises(ConfigError, match=f"critic.profiler.tool={tool}: verl's {tool} profiler"):
        _config({"critic": {"profiler": {"tool": tool}}})


def test_bad_profiler_values_get_one_line():
    with pytest.raises(ConfigError, match="global_profiler.steps"):
        GlobalProfilerConfig(tool="torch", steps=[0])
    with pytest.raises(ConfigError, match="actor_rollout_ref.actor.profiler.tool_config.torch.contents has 'gpu'"):
        _config({"actor_rollout_ref": {"actor": {"profiler": {"tool_config": {"torch": {"contents": ["gpu"]}}}}}})


def test_the_other_tools_keys_are_refused_naming_the_tool_and_accepted_at_verl_defaults():
    assert check_verl_only("global_profiler.global_tool_config.nsys.discrete", True).kind == "ignored"
    with pytest.raises(ConfigError, match="verl's npu profiler is not in hybridrl"):
        check_verl_only("actor_rollout_ref.actor.profiler.tool_config.npu.level", "level1")
    assert check_verl_only("global_profiler.global_tool_config.torch_memory.stack_depth", 32).kind == "ignored"
    with pytest.raises(ConfigError, match="torch_memory settings other than verl's defaults"):
        check_verl_only("global_profiler.global_tool_config.torch_memory.stack_depth", 8)


def test_which_steps_start_and_stop_a_trace():
    section = GlobalProfilerConfig(tool="torch", steps=[2, 3, 5])
    assert [s for s in range(1, 7) if starts(section, s)] == [2, 3, 5]
    assert [s for s in range(1, 7) if stops(section, s)] == [2, 3, 5]
    section.profile_continuous_steps = True  # 2 and 3 share one trace
    assert [s for s in range(1, 7) if starts(section, s)] == [2, 5]
    assert [s for s in range(1, 7) if stops(section, s)] == [3, 5]
    assert not any(starts(GlobalProfilerConfig(steps=[1]), s) for s in range(3))  # no tool: off


def test_which_ranks_record():
    assert role_profiler("critic", [_section()], rank=0) is not None
    assert role_profiler("critic", [_section()], rank=1) is None  # rank 0 by default
    assert role_profiler("critic", [_section(ranks=[1])], rank=1) is not None
    assert role_profiler("critic", [_section(all_ranks=True)], rank=3) is not None
    assert role_profiler("critic", [_section(enable=False)], rank=0) is None
    assert role_profiler("critic", [_section(tool=None)], rank=0) is None
    # a policy worker records when any of its roles does (verl's union), with their contents
    both = role_profiler("actor_rollout_ref", [_section(enable=False), _section(contents=["shapes"])], 0)
    assert both.contents == ("shapes",) and both.options()["record_shapes"]


def _work():
    x = torch.randn(8, 8, requires_grad=True)
    (x @ x).sum().backward()


def test_a_profiled_step_writes_a_chrome_trace_per_process(tmp_path):
    actor = _Worker("actor_rollout_ref", [_section(save_path=str(tmp_path))])
    critic = _Worker("critic", [_section(save_path=str(tmp_path))])
    actor.start_profile(4)
    critic.start_profile(4)  # the same process: joins the actor's trace
    _work()
    assert actor.stop_profile() is None  # the critic still records
    path = critic.stop_profile()
    assert path == trace_path(str(tmp_path), 4, ["actor_rollout_ref", "critic"], 0)
    assert path.endswith(os.path.join("step_4", "actor_rollout_ref+critic_rank0.json"))
    with open(path) as f:
        trace = json.load(f)
    assert any("aten::mm" in event.get("name", "") for event in trace["traceEvents"])


def test_without_profiling_nothing_is_recorded_or_written(tmp_path):
    worker = _Worker("critic", [_section(enable=False, save_path=str(tmp_path))])
    assert worker.profiler is None
    worker.start_profile(1)
    _work()
    assert worker.stop_profile() is None
    assert os.listdir(tmp_path) == []


class _FakeCuda:
    """What the CUDA-only tools call, recorded (this machine may have no GPU)."""

    def __init__(self, monkeypatch):
        self.calls = []
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
        monkeypatch.setattr(torch.cuda.profiler, "start", lambda: self.calls.append("capture start"))
        monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: self.calls.append("capture stop"))
        monkeypatch.setattr(
            torch.cuda.memory,
            "_record_memory_history",
            lambda enabled="all", **kw: self.calls.append(("history", enabled, kw)),
        )

        def dump(path):
            self.calls.append(("dump", path))
            open(path, "wb").close()

        monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", dump)


def test_torch_memory_dumps_the_allocator_history_of_the_step(tmp_path, monkeypatch):
    cuda = _FakeCuda(monkeypatch)
    worker = _Worker("actor_rollout_ref", [_section(tool="torch_memory", save_path=str(tmp_path))])
    worker.start_profile(2)
    path = worker.stop_profile()
    assert path.endswith(os.path.join("step_2", "actor_rollout_ref_rank0.pickle")) and os.path.isfile(path)
    assert cuda.calls == [
        ("history", "all", {"max_entries": 100_000, "stacks": "all"}),
        ("history", None, {}),
        ("dump", path),
    ]


def test_nsys_makes_each_chosen_step_a_capture_range(tmp_path, monkeypatch):
    cuda = _FakeCuda(monkeypatch)
    worker = _Worker("critic", [_section(tool="nsys", save_path=str(tmp_path))])
    worker.start_profile(1)
    assert cuda.calls == ["capture start"]
    assert worker.stop_profile() is None and cuda.calls == ["capture start", "capture stop"]
    assert os.listdir(tmp_path) == []  # nsys writes its own report


def test_the_cuda_tools_record_nothing_on_cpu(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for tool in ("torch_memory", "nsys"):
        worker = _Worker("critic", [_section(tool=tool, save_path=str(tmp_path))])
        worker.start_profile(1)
        assert worker.stop_profile() is None
