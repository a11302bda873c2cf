"""The local code sandbox contains what model-written code may try, and says why a run failed.

Each containment test runs a real program in the real sandbox. Where the machine cannot isolate
(no user namespaces) they are skipped, unless HYBRIDRL_REQUIRE_SANDBOX=1 (set by CI), which
turns the skip into a failure.
"""

import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from hybridrl.errors import ConfigError
from hybridrl.rewards.sandbox import (
    LocalSandbox,
    SandboxConfigError,
    SandboxLimits,
    SandboxUnavailableError,
    build_sandbox,
    local,
)
from tests.tiny_models import ppo_section


def _build(sandbox=None, fusion=None):
    """:func:`build_sandbox` from the run's typed ``reward_model`` section with these settings."""
    section = ppo_section("reward_model", {"sandbox": sandbox or {}, "sandbox_fusion": fusion or {}})
    return build_sandbox(section.sandbox, section.sandbox_fusion)


@pytest.fixture(scope="module")
def sandbox():
    why_not = local._why_no_isolation(LocalSandbox())
    if why_not and not os.environ.get("HYBRIDRL_REQUIRE_SANDBOX"):
        pytest.skip(f"no isolation on this machine: {why_not}")
    assert not why_not, why_not
    return LocalSandbox(SandboxLimits(timeout_s=5, max_processes=16, max_file_size_mb=4))


@pytest.mark.slow
def test_a_program_runs_with_its_stdin(sandbox):
    result = sandbox.run("import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))", stdin="1 2 39")
    assert (result.status, result.returncode, result.stdout, result.reason) == ("ok", 0, "42\n", "")


@pytest.mark.slow
def test_no_network_not_even_loopback(sandbox):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.5)
    port = server.getsockname()[1]
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')"
    result = sandbox.run(code)
    with pytest.raises(socket.timeout):
        server.accept()  # nothing came through
    server.close()
    assert result.status == "error" and "connected" not in result.stdout
    assert "Network is unreachable" in result.reason


# forks children that sleep until the process limit refuses one, and prints how many it got
COUNT_FORKS = textwrap.dedent("""
    import os, time
    n = 0
    for _ in range(100):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
    print(n)
""")


@pytest.mark.slow
def test_a_fork_bomb_is_held_to_the_process_limit_and_ended(sandbox):
    result = sandbox.run(COUNT_FORKS)
    assert result.ok and 0 < int(result.stdout) < sandbox.limits.max_processes
    started = time.perf_counter()
    bomb = sandbox.run(
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", timeout_s=1.5
    )
    assert bomb.status == "timeout" and "wall-time limit of 1.5 s" in bomb.reason
    assert time.perf_counter() - started < 5


@pytest.mark.slow
def test_nothing_outlives_its_run(sandbox):
    marker = "4321.5"
    result = sandbox.run(
        f"import subprocess\nsubprocess.Popen(['sleep', '{marker}'], start_new_session=True)\nprint('spawned')"
    )
    assert result.ok and result.stdout == "spawned\n"
    time.sleep(0.2)
    survivors = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    survivors.append(pid)
        except OSError:
            pass
    assert survivors == []


@pytest.mark.slow
def test_a_memory_hog_is_stopped(sandbox):
    result = sandbox.run("x = bytearray(4 * 1024 ** 3)\nprint('allocated')")
    assert result.status == "memory" and "allocated" not in result.stdout
    assert f"limit {sandbox.limits.memory_limit_mb} MiB" in result.reason


@pytest.mark.slow
def test_an_infinite_loop_times_out(sandbox):
    started = time.perf_counter()
    result = sandbox.run("while True:\n    pass", timeout_s=1)
    assert result.status == "timeout" and result.returncode is None
    assert 1 <= result.wall_s < 3 and time.perf_counter() - started < 4


@pytest.mark.slow
def test_the_cpu_limit_applies_to_a_process_in_a_busy_loop():
    limited = LocalSandbox(SandboxLimits(timeout_s=10, cpu_time_s=1))
    if local._probe(limited):
        pytest.skip("no isolation on this machine")
    result = limited.run("while True:\n    pass")
    assert result.status == "timeout" and "CPU-time limit of 1 s" in result.reason and result.wall_s < 8


@pytest.mark.slow
def test_the_home_folder_and_the_host_files_stay_untouched(sandbox, tmp_path):
    home_file = os.path.join(os.path.expanduser("~"), "hybridrl-sandbox-test-file")
    host_file = tmp_path / "written-from-the-sandbox"
    result = sandbox.run(f"open({home_file!r}, 'w').write('x')\n")
    assert result.status == "error" and not os.path.exists(home_file)
    result = sandbox.run(f"open({str(host_file)!r}, 'w').write('x')\n")
    assert result.status == "error" and not host_file.exists()
    assert "Read-only file system" in result.reason or "No such file" in result.reason
    # its own directory is writable, and gone afterwards
    result = sandbox.run("import os\nopen('scratch.txt', 'w').write('kept?')\nprint(os.getcwd())")
    assert result.ok and result.stdout.strip() == "/sandbox"


@pytest.mark.slow
def test_a_python_installed_under_tmp_runs_isolated_and_read_only(sandbox):
    # The jail's root was once mounted over /tmp, which hid such an install: "cannot be isolated".
    with tempfile.TemporaryDirectory(dir="/tmp") as venv:
        os.chmod(venv, 0o755)  # as an install is: the program may run as nobody
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=60)
        under_tmp = LocalSandbox(sandbox.limits, python=os.path.join(venv, "bin", "python"))
        assert local._why_no_isolation(under_tmp) == ""
        result = under_tmp.run("import sys\nopen('/tmp/scratch', 'w').write('x')\nprint(sys.prefix)")
        assert result.ok and result.stdout.strip() == venv  # and /tmp stays writable
        result = under_tmp.run("import sys\nopen(sys.prefix + '/planted', 'w')")
        assert result.status == "error" and "Read-only file system" in result.reason
        assert not os.path.exists(os.path.join(venv, "planted"))


@pytest.mark.slow
def test_the_trainers_environment_is_not_visible(sandbox, monkeypatch):
    monkeypatch.setenv("HYBRIDRL_TEST_SECRET_TOKEN", "s3cr3t-value")
    result = sandbox.run("import os\nprint(os.environ.get('HYBRIDRL_TEST_SECRET_TOKEN'))\nprint(sorted(os.environ))")
    assert result.ok and "s3cr3t-value" not in result.stdout and "None" in result.stdout
    result = sandbox.run("print(open('/proc/1/environ').read())")
    assert result.status == "error" and "s3cr3t-value" not in result.stdout


@pytest.mark.slow
def test_a_flood_of_output_is_cut_at_the_file_size_limit(sandbox):
    result = sandbox.run("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)")
    assert result.status == "output_limit"
    assert len(result.stdout) <= sandbox.limits.max_file_size_mb * 1024 * 1024


@pytest.mark.slow
def test_the_program_cannot_undo_the_jail(sandbox):
    code = "import os\nprint(os.getuid(), os.system('mount -t tmpfs none /usr 2>/dev/null'))\nprint(os.listdir('/usr'))"
    result = sandbox.run(code)
    assert result.ok and result.stdout.split("\n")[0].split()[1] != "0"  # mount failed
    assert "bin" in result.stdout  # /usr is still the real one


@pytest.mark.slow
def test_without_isolation_code_rewards_refuse_with_one_line(monkeypatch):
    monkeypatch.setattr(local, "_probe_results", {})
    monkeypatch.setattr(local, "_why_no_isolation", lambda sandbox: "user namespaces are disabled")
    with pytest.raises(SandboxUnavailableError) as err:
        LocalSandbox().run("print(1)")
    message = str(err.value)
    assert "\n" not in message and "user namespaces are disabled" in message
    assert "reward_model.sandbox.unsafe_no_isolation=true" in message and "sandbox_fusion.url" in message
    unsafe = LocalSandbox(SandboxLimits(timeout_s=5), unsafe_no_isolation=True)
    result = unsafe.run("import os\nprint(os.environ.get('HOME') != os.path.expanduser('~root'))")
    assert result.ok and result.stdout.strip() == "True"


@pytest.mark.parametrize(
    "cfg, match",
    [
        ({"timeout_s": 0}, r"reward_model.sandbox.timeout_s=0.0 must be a number > 0"),
        ({"max_processes": -1}, r"reward_model.sandbox.max_processes=-1 must be a number > 0"),
    ],
)
def test_bad_sandbox_settings_get_one_line(cfg, match):
    with pytest.raises(SandboxConfigError, match=match):
        _build(cfg)


@pytest.mark.parametrize(
    "cfg, match",
    [
        ({"memory_limit_mb": "lots"}, r"reward_model.sandbox.memory_limit_mb: Value 'lots' .* could not be converted"),
        ({"max_proceses": 8}, r"reward_model.sandbox.max_proceses is not a key"),
        (
            {"unsafe_no_isolation": "maybe"},
            r"reward_model.sandbox.unsafe_no_isolation: Value 'maybe' is not a valid bool",
        ),
    ],
)
def test_sandbox_settings_of_another_type_or_name_are_refused_by_the_typed_config(cfg, match):
    with pytest.raises(ConfigError, match=match):
        _build(cfg)


def test_a_fusion_url_selects_the_remote_service():
    box = _build({"timeout_s": 3}, {"url": "http://localhost:1/run_code", "max_concurrent": 2})
    assert type(box).__name__ == "SandboxFusionClient" and box.timeout_s == 3 and box.max_concurrent == 2
    assert isinstance(_build({}, {"url": None}), LocalSandbox)
    with pytest.raises(SandboxConfigError, match="sandbox_fusion.url='localhost:8080' must be an http"):
        _build({}, {"url": "localhost:8080"})


# ------------------------------------------------------------------ nothing outlives the run (issue 33)

_TRAINER = """
import sys
from hybridrl.rewards.sandbox import LocalSandbox, SandboxLimits
program = (
    "import subprocess, time\\n"
    "subprocess.Popen(['sleep', {marker!r}], start_new_session=True)\\n"
    "time.sleep(120)\\n"
)
LocalSandbox(SandboxLimits(timeout_s=120)).run(program.format(marker=sys.argv[1]))
"""


def _pids_with(text):
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if text.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def _children(parent):
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == parent:
                    found.append(int(pid))
        except (OSError, IndexError, ValueError):
            pass
    return found


def _wait_until(condition, timeout_s):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_a_killed_trainer_leaves_no_program_and_no_work_folder(sandbox):
    """kill -9 of the trainer: the jail, the program and its setsid child die, the folder goes."""
    marker = "4322.25"
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    trainer = subprocess.Popen([sys.executable, "-c", _TRAINER, marker], cwd=repo)
    try:
        assert _wait_until(lambda: _pids_with("sleep\0" + marker), 30), "the sandboxed program did not start"
        jails = [p for p in _children(trainer.pid) if p in _pids_with(str(local.JAIL))]
        assert len(jails) == 1
        with open(f"/proc/{jails[0]}/cmdline", "rb") as f:
            work = os.path.dirname(f.read().split(b"\0")[-2].decode())  # .../spec.json
        assert os.path.isdir(work)
        jail_pids = [jails[0], *_children(jails[0])]
    finally:
        trainer.kill()
        trainer.wait()
    assert _wait_until(lambda: not _pids_with("sleep\0" + marker), 5), "the program outlived its trainer"
    assert _wait_until(lambda: not any(os.path.exists(f"/proc/{p}") for p in jail_pids), 5)
    assert _wait_until(lambda: not os.path.exists(work), 5), "the work folder outlived the trainer"


def test_stale_work_folders_of_dead_trainers_are_swept(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    stale = tmp_path / (local.WORK_PREFIX + "dead")
    (stale / "box").mkdir(parents=True)
    (stale / "stdout").write_text("x")
    old = time.time() - 2 * local.STALE_AFTER_S
    os.utime(stale, (old, old))
    with local._work_dir() as live:
        os.utime(live, (old, old))  # old, but its trainer (this process) holds the lock
        assert local.sweep_stale_work_dirs() == [str(stale)]
        assert not stale.exists() and live.is_dir()
    assert not live.exists()


@pytest.mark.slow
@pytest.mark.parametrize("signals", ["SIGALRM", "SIGALRM, signal.SIGXCPU, signal.SIGTERM, signal.SIGINT"])
def test_the_wall_deadline_is_a_kill_the_program_cannot_catch(sandbox, signals):
    marker = "4323.5"
    program = textwrap.dedent(f"""
        import signal, subprocess, time
        for s in (signal.{signals},):
            signal.signal(s, lambda *a: None)
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        subprocess.Popen(['sleep', '{marker}'], start_new_session=True)
        while True:
            time.sleep(0.01)
    """)
    started = time.perf_counter()
    result = sandbox.run(program, timeout_s=1.5)
    assert result.status == "timeout" and time.perf_counter() - started < 4
    assert _wait_until(lambda: not _pids_with("sleep\0" + marker), 2)


@pytest.mark.slow
def test_a_program_that_ignores_its_alarm_gets_one_deadline_for_all_its_cases(monkeypatch):
    """Call-based cases run under an alarm the program can catch; the runs share one deadline."""
    from hybridrl.rewards import code

    limited = LocalSandbox(SandboxLimits(timeout_s=1.0))
    if local._probe(limited):
        pytest.skip("no isolation on this machine")
    monkeypatch.setattr(code, "current_sandbox", lambda: limited)
    program = (
        "import signal, time\nsignal.signal(signal.SIGALRM, lambda *a: None)\n"
        "def add(x):\n    signal.signal(signal.SIGALRM, lambda *a: None)\n    time.sleep(600)"
    )
    ground_truth = {"fn_name": "add", "inputs": [[1], [2], [3], [4]], "outputs": [4, 5, 6, 7]}
    started = time.perf_counter()
    result = code.compute_score(program, ground_truth, continuous=True)
    assert result["passed"] == 0
    assert time.perf_counter() - started < 4 * 1.0 + 1.0 + 1.0 + 2.0  # n + 1 case limits + 1 s, + slack


@pytest.mark.slow
def test_the_memory_limit_covers_all_processes_of_a_run(sandbox):
    """Three children of 800 MB each: 2.4 GB together, over the run's 1024 MiB."""
    why_not = local.MemoryCgroup.why_unavailable()
    if why_not:
        pytest.skip(f"the memory limit is per process here: {why_not}")
    program = textwrap.dedent("""
        import os, sys, time
        children = []
        for _ in range(3):
            pid = os.fork()
            if pid == 0:
                block = b"x" * (800 * 1024 * 1024)
                time.sleep(1)
                os._exit(0)
            children.append(pid)
        statuses = [os.waitpid(pid, 0)[1] for pid in children]
        print(statuses)
        sys.exit(0 if statuses == [0, 0, 0] else 1)
    """)
    result = LocalSandbox(SandboxLimits(timeout_s=30, memory_limit_mb=1024)).run(program)
    assert result.status == "memory", (result.status, result.stdout, result.stderr[-500:])
    assert "limit 1024 MiB for all its processes" in result.reason
    assert not [name for name in os.listdir(local.MemoryCgroup._base[1]) if name.startswith(local.WORK_PREFIX)]


@pytest.mark.slow
def test_without_a_memory_cgroup_the_limit_is_per_process_and_the_processes_are_capped(sandbox, monkeypatch):
    monkeypatch.setattr(local.MemoryCgroup, "_why_not", "cgroups are read-only")
    result = sandbox.run("x = bytearray(2 * 1024 ** 3)\nprint('allocated')")
    assert result.status == "memory" and f"limit {sandbox.limits.memory_limit_mb} MiB" in result.reason
    result = sandbox.run(COUNT_FORKS)
    assert result.ok and int(result.stdout) < sandbox.limits.max_processes
