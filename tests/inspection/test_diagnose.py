"""`hybridrl diagnose`: versions, devices, Ray probing without starting Ray, optional parts."""

import importlib.machinery
import json
import socket
import subprocess
import sys
import types

import torch

from hybridrl.inspection import diagnose


def test_json_report_matches_this_machine_and_imports_nothing_heavy():
    code = (
        "import json, sys; from hybridrl.inspection.diagnose import main; main(['--json']);"
        "heavy = ('ray', 'wandb', 'mlflow', 'textual', 'matplotlib');"
        "print(json.dumps(sorted(m for m in heavy if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    report_text, imported = out.rsplit("\n", 2)[:2]
    report = json.loads(report_text)
    assert json.loads(imported) == []  # optional parts are looked up, never imported
    assert list(report) == ["versions", "cpu", "cuda", "ray", "environment", "optional parts"]
    assert report["versions"]["torch"] == torch.__version__
    assert report["versions"]["python"].startswith(f"{sys.version_info.major}.{sys.version_info.minor}.")
    assert report["cuda"]["available"].startswith("yes" if torch.cuda.is_available() else "no")
    assert report["cpu"]["torch kernels"] == torch.backends.cpu.get_cpu_capability()


def test_text_report(capsys):
    assert diagnose.main([]) == 0
    out = capsys.readouterr().out
    sections = [line for line in out.splitlines() if line and not line.startswith(" ")]
    assert sections == ["versions", "cpu", "cuda", "ray", "environment", "optional parts"]
    assert f"  torch         {torch.__version__}" in out


def test_installed_version_looks_modules_up(monkeypatch):
    fake = types.ModuleType("hybridrl_fake_pkg")
    fake.__spec__ = importlib.machinery.ModuleSpec("hybridrl_fake_pkg", None)
    fake.__version__ = "9.9"
    monkeypatch.setitem(sys.modules, "hybridrl_fake_pkg", fake)
    assert diagnose.installed_version("hybridrl_fake_pkg") == "9.9"
    assert diagnose.installed_version("hybridrl_no_such_pkg") is None
    assert diagnose.installed_version("hybridrl_no_such_pkg.sub") is None
    assert diagnose.installed_version("numpy") == __import__("numpy").__version__


def test_optional_parts_say_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    monkeypatch.setitem(
        sys.modules, "textual", types.SimpleNamespace(__spec__=importlib.machinery.ModuleSpec("textual", None))
    )
    parts = diagnose.optional_parts()
    assert parts["trainer.logger=wandb"] == "no: pip install wandb"
    assert parts["hybridrl view (terminal UI)"].startswith("yes (textual ")


def test_ray_cluster_probe(monkeypatch, tmp_path):
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    assert diagnose.ray_info()["cluster"].startswith("none found")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        (tmp_path / "ray").mkdir()
        (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{port}\n")
        found = diagnose.ray_info()["cluster"]
        assert found.endswith("ray_current_cluster): reachable; runs join it with RAY_ADDRESS=auto"), found
        monkeypatch.setenv("RAY_ADDRESS", "auto")
        assert diagnose.ray_info()["cluster"].endswith("ray_current_cluster): reachable")
        monkeypatch.setenv("RAY_ADDRESS", f"ray://127.0.0.1:{port}")
        assert diagnose.ray_info()["cluster"] == f"ray://127.0.0.1:{port} (from RAY_ADDRESS): reachable"
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")  # closed now
    assert diagnose.ray_info()["cluster"].endswith("NOT reachable")
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(is_initialized=lambda: True))
    assert diagnose.ray_info()["cluster"].startswith("connected in this process")
