"""Thread counts from the free cores (issue 33 item 7): the pick, who wins, the re-check, and the
environment of the processes hybridrl starts. CPU facts are monkeypatched: no sampling here."""

from __future__ import annotations

import os

import pytest
import torch

from hybridrl.controller import cpu_threads as ct


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    ct._reset_for_tests()
    for key in (*ct.USER_THREAD_ENVS, ct.AUTO_ENV):
        monkeypatch.delenv(key, raising=False)
    before = torch.get_num_threads()
    yield
    ct._reset_for_tests()
    torch.set_num_threads(before)


def machine(monkeypatch, cores: int, busy: float, torch_threads: int | None = None):
    """A machine of ``cores`` allowed CPUs of which other processes keep ``busy`` cores busy."""
    calls = []

    def sample(cpus, interval=ct.SAMPLE_S):
        calls.append(len(cpus))
        return busy, "psutil"

    monkeypatch.setattr(ct, "allowed_cores", lambda: list(range(cores)))
    monkeypatch.setattr(ct, "busy_cores", sample)
    monkeypatch.setattr(ct, "_torch_default_threads", lambda: {cores})
    torch.set_num_threads(torch_threads or cores)
    return calls


@pytest.mark.parametrize(
    "cores, busy, threads",
    [
        (2, 0.0, 2),
        (2, 0.2, 2),
        (2, 1.0, 1),
        (2, 0.8, 1),
        (2, 2.0, 1),
        (2, 5.0, 1),
        (8, 1.0, 7),
        (8, 2.6, 6),
        (8, 2.75, 5),
        (1, 1, 1),
    ],
)
def test_one_thread_per_free_core_never_below_one(cores, busy, threads):
    assert ct.threads_for(cores, busy) == threads


def test_the_line_counts_every_busy_core():
    pick = ct.ThreadPick(cores=2, busy=2.0, source="psutil", threads=1)
    assert pick.line("x") == "hybridrl: 2 of 2 cores busy at start-up (load 2.00 cores, psutil): 1 thread for x"


def test_start_up_pick_lowers_torch_once_with_one_line(monkeypatch, capsys):
    calls = machine(monkeypatch, cores=2, busy=1.02)
    assert ct.apply_torch_threads("torch in the driver") == 1
    assert torch.get_num_threads() == 1
    assert ct.engine_threads(None) == 1
    assert ct.apply_torch_threads("torch in the driver") == 1
    assert calls == [2]  # one sample per process
    out = capsys.readouterr().out.strip().splitlines()
    assert (
        out[0] == "hybridrl: 1 of 2 cores busy at start-up (load 1.02 cores, psutil): 1 thread for torch in the driver"
    )
    assert out[1].endswith("1 thread for the vLLM CPU engine")


def test_quiet_machine_changes_nothing_and_prints_nothing(monkeypatch, capsys):
    machine(monkeypatch, cores=2, busy=0.1)
    assert ct.apply_torch_threads() is None
    assert torch.get_num_threads() == 2
    assert ct.engine_threads(None) is None
    assert ct.worker_threads(2) == 2
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("key, value", [("OMP_NUM_THREADS", "2"), ("MKL_NUM_THREADS", "2"), (ct.AUTO_ENV, "0")])
def test_the_users_thread_setting_wins(monkeypatch, key, value):
    calls = machine(monkeypatch, cores=2, busy=1.0)
    monkeypatch.setenv(key, value)
    assert ct.apply_torch_threads() is None
    assert torch.get_num_threads() == 2
    assert ct.engine_threads(None) is None
    assert ct.worker_threads(2) == 2
    assert calls == []


def test_a_torch_count_the_user_set_is_kept(monkeypatch):
    calls = machine(monkeypatch, cores=4, busy=3.0, torch_threads=3)  # 3: not torch's default of 4
    assert ct.apply_torch_threads() is None
    assert torch.get_num_threads() == 3
    assert calls == []


def test_configured_engine_threads_and_worker_cap(monkeypatch):
    machine(monkeypatch, cores=4, busy=2.0)
    assert ct.engine_threads(3) == 3  # rollout.cpu_threads wins
    assert ct.engine_threads(None) == 2
    assert ct.worker_threads(1) == 1
    assert ct.worker_threads(4) == 2


def test_wait_policy_for_started_processes(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert ct.wait_policy_env() == {"OMP_WAIT_POLICY": "PASSIVE"}
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert ct.wait_policy_env() == {"OMP_WAIT_POLICY": "ACTIVE"}


def test_step_watch_rechecks_a_far_slower_step(monkeypatch, capsys):
    machine(monkeypatch, cores=2, busy=0.0)
    watch = ct.StepWatch(raise_every=0)
    assert watch.after_step(10.0, 1) is None
    assert watch.after_step(20.0, 2) is None  # 2x: no re-check
    picks = iter([1.0, 0.0])
    monkeypatch.setattr(ct, "busy_cores", lambda cpus, interval=ct.SAMPLE_S: (next(picks), "psutil"))
    assert watch.after_step(90.0, 3) == 1  # 4.5x the one before, one core busy now
    assert torch.get_num_threads() == 1
    assert "step 3 took 90.0 s (4.5x the one before)" in capsys.readouterr().out
    assert watch.after_step(400.0, 4) == 2  # slow again, the machine quiet: back up
    assert torch.get_num_threads() == 2


def test_step_watch_takes_cores_back_and_ignores_short_steps(monkeypatch):
    machine(monkeypatch, cores=2, busy=1.0)
    ct.apply_torch_threads()
    watch = ct.StepWatch(raise_every=2)
    assert watch.ceiling == 2
    assert watch.after_step(0.01, 1) is None
    assert watch.after_step(0.5, 2) is None  # under MIN_STEP_S
    monkeypatch.setattr(ct, "busy_cores", lambda cpus, interval=ct.SAMPLE_S: (0.0, "psutil"))
    assert watch.after_step(12.0, 3) is None  # not a re-check step
    assert watch.after_step(12.0, 4) == 2  # every 2nd step while lowered
    assert torch.get_num_threads() == 2


def test_step_watch_off_when_the_user_chose(monkeypatch):
    machine(monkeypatch, cores=2, busy=1.0)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    watch = ct.StepWatch()
    watch.after_step(1.0, 1)
    assert watch.after_step(100.0, 2) is None
    assert torch.get_num_threads() == 2


def test_busy_cores_subtracts_this_process_tree(monkeypatch):
    psutil = pytest.importorskip("psutil")
    monkeypatch.setattr(psutil, "cpu_percent", lambda interval, percpu: [100.0, 40.0, 100.0])
    spent = iter([10.0, 10.3])  # 0.3 CPU-s of our own over the sample
    monkeypatch.setattr(ct, "_own_cpu_seconds", lambda ps: next(spent))
    clock = iter([0.0, 1.0])
    monkeypatch.setattr(ct.time, "monotonic", lambda: next(clock))
    busy, source = ct.busy_cores([0, 1])  # CPU 2 is not ours
    assert source == "psutil" and busy == pytest.approx(1.1)


def test_loadavg_fallback_counts_this_process(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_psutil(name, *args, **kwargs):
        if name == "psutil":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_psutil)
    monkeypatch.setattr(os, "getloadavg", lambda: (2.2, 0.0, 0.0))
    busy, source = ct.busy_cores([0, 1])
    assert source == "loadavg" and busy == pytest.approx(1.2)


def test_vllm_engines_get_nobind_and_passive_wait(monkeypatch):
    """Both engines (sync in-process, async in its own process, which inherits os.environ) start
    after import_vllm has set these."""
    from hybridrl.workers.rollout import vllm as vllm_rollout

    assert vllm_rollout._VLLM_ENV["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert vllm_rollout._VLLM_ENV["OMP_WAIT_POLICY"] == "PASSIVE"


def test_cli_sets_passive_wait_before_torch_for_training_commands(monkeypatch):
    import hybridrl.cli as cli

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    cli.set_wait_policy()
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    cli.set_wait_policy()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
