"""The layers of .importlinter hold: no upward imports, no import cycles inside a package."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _lint(config: str) -> subprocess.CompletedProcess:
    script = (
        "import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(config_filename=sys.argv[1], no_cache=True))"
    )
    return subprocess.run([sys.executable, "-c", script, config], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_import_contracts_are_kept():
    pytest.importorskip("importlinter")
    result = _lint(".importlinter")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "Contracts: 3 kept, 0 broken." in result.stdout


def test_an_upward_import_breaks_the_layers(tmp_path):
    """The contract has teeth: the same layers, with config placed above workers, are broken
    (workers import hybridrl.config)."""
    pytest.importorskip("importlinter")
    with open(os.path.join(ROOT, ".importlinter")) as f:
        text = f.read()
    swapped = text.replace("    hybridrl.workers\n", "    hybridrl.config\n    hybridrl.workers\n", 1)
    swapped = swapped.replace("    hybridrl.config\n    hybridrl.protocol", "    hybridrl.protocol", 1)
    assert swapped != text
    config = tmp_path / "swapped.ini"
    config.write_text(swapped)
    result = _lint(str(config))
    assert result.returncode != 0 and "hybridrl.workers is not allowed to import hybridrl.config" in result.stdout
