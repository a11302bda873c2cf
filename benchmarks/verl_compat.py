"""Runs verl's own CPU unit tests against hybridrl, with only their import lines rewritten.

Each test file in ``VERL_TEST_FILES`` is read from verl's released wheel (``--verl-version``,
default 0.9.1: fetched once with ``pip download --no-deps`` into ``~/.cache/hybridrl/verl_compat``;
the wheel ships its CPU tests) or from a verl git checkout (``--verl-repo``, ``git show REV:path``,
so a bare mirror works); its ``import verl...`` / ``from verl... import ...`` statements are
replaced by imports from the hybridrl module that ``IMPORT_MAP`` names (every other line is
kept byte for byte, and so are line numbers), and pytest runs it in a temporary folder. A name
hybridrl does not define becomes a placeholder that raises ``NotImplementedError`` when used,
so one missing helper does not stop the whole file from being collected.

Tests hybridrl does not claim are deselected, each with its reason (``excluded``). The output
is one row per file: passed / failed / skipped / excluded, then the excluded tests and the
failures. The exit code is 1 when a test that is not excluded fails.

    python benchmarks/verl_compat.py                                  # verl 0.9.1's tests
    python benchmarks/verl_compat.py --verl-repo ~/src/verl --rev v0.6.0 --show-imports

Not part of the test suite (it needs a verl checkout). To cover more of verl, add a
``VerlTestFile`` below and the modules its imports need to ``IMPORT_MAP``.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_VERL_VERSION = "0.9.1"
CACHE_DIR = os.path.expanduser("~/.cache/hybridrl/verl_compat")

# verl module -> hybridrl module; None: no hybridrl counterpart (every name is a placeholder).
IMPORT_MAP: dict[str, str | None] = {
    "verl": "hybridrl.protocol",  # `from verl import DataProto`
    "verl.protocol": "hybridrl.protocol",
    "verl.trainer.ppo.metric_utils": "hybridrl.trainer.ppo.metrics",
    "verl.utils.metric": "hybridrl.trainer.run.metrics",
    "verl.utils.metric.utils": "hybridrl.trainer.run.metrics",
    "verl.utils.tensordict_utils": None,
    "verl.trainer.ppo.core_algos": "hybridrl.algorithms",
    "verl.utils.py_functional": "hybridrl.rewards.pool",  # timeout_limit (the per-call deadline)
}

_TO_TENSORDICT = (
    "DataProto.to_tensordict / from_tensordict: verl's TensorDict+NonTensorData transfer format; hybridrl has none"
)
_METRIC = (
    "Metric / AggregationType: verl's worker-side metric accumulators; hybridrl workers report plain "
    "{name: [values]} dicts (the critic sums its micro-batch losses itself)"
)
_SERIALIZE = (
    "verl's numpy wire format for pickling (VERL_DATAPROTO_SERIALIZATION_METHOD); "
    "hybridrl pickles the TensorDict itself"
)


@dataclass
class VerlTestFile:
    path: str  # inside the verl repository
    excluded: dict[str, str] = field(default_factory=dict)  # test id (or prefix) -> reason


VERL_TEST_FILES = [
    VerlTestFile(
        "tests/test_protocol_on_cpu.py",
        excluded={
            "test_union_tensor_dict": "verl-internal helper on raw TensorDicts; hybridrl has DataProto.union",
            "test_union_numpy_dict": "verl-internal helper on dicts of arrays (incl. circular references); "
            "hybridrl has DataProto.union",
            "test_tensor_dict_constructor": "hybridrl supports from_dict(num_batch_dims=2) on purpose; verl "
            "asserts num_batch_dims == 1",
            "test_to_tensordict": _TO_TENSORDICT,
            "test_from_tensordict": _TO_TENSORDICT,
            "test_to_tensordict_with_nested_lists": _TO_TENSORDICT,
            "test_to_tensordict_with_nested_dicts": _TO_TENSORDICT,
            "test_to_tensordict_with_complex_nested_structures": _TO_TENSORDICT,
            "test_to_tensordict_and_back_with_nested_data": _TO_TENSORDICT,
            "test_to_tensordict_agent_loop_scenario": _TO_TENSORDICT,
            "test_serialize_deserialize_single_tensor": _SERIALIZE,
            "test_serialize_deserialize_tensordict_regular_tensors": _SERIALIZE,
            "test_serialize_deserialize_tensordict_nested_tensors": _SERIALIZE,
            "test_serialize_deserialize_tensordict_mixed_types": _SERIALIZE,
            "test_serialize_deserialize_tensordict_with_device": _SERIALIZE,
            "test_numpy_dataproto_serialization_skips_tensordict_consolidation": _SERIALIZE,
        },
    ),
    VerlTestFile(
        "tests/trainer/ppo/test_metric_utils_on_cpu.py",
        excluded={
            "TestMetric": _METRIC,
            "TestComputeTimingMetrics::test_compute_timing_metrics": "patches the private "
            "verl.trainer.ppo.metric_utils._compute_response_info by its dotted path (not an import)",
        },
    ),
    VerlTestFile(
        "tests/trainer/ppo/test_core_algos_on_cpu.py",
        excluded={
            "TestRegisterAdvEst": "setUp replaces the module's ADV_ESTIMATOR_REGISTRY dict (by its dotted path, "
            "not an import) and expects register_adv_est to write into the replacement; "
            "hybridrl's registry is hybridrl.algorithms.advantages' own dict. The facts it checks "
            "(a plain Enum member registers under its value, the same function twice is fine, another "
            "one is a ValueError) are in tests/test_registry.py",
        },
    ),
    VerlTestFile("tests/trainer/ppo/test_loss_aggregation_on_cpu.py"),
    VerlTestFile(
        "tests/trainer/ppo/test_value_loss_normalization_on_cpu.py",
        excluded={
            "test_vf_loss_metric_sum_aggregation_reports_global_mean": _METRIC,
        },
    ),
    VerlTestFile("tests/trainer/ppo/test_reinforce_pp_multiturn_on_cpu.py"),
    # verl's git tree only (not in the 0.9.1 wheel): run with --verl-repo
    VerlTestFile(
        "tests/utils/test_timeout_decorator_cpu.py",
        excluded={
            "test_signal_in_thread_does_not_timeout": "skipped by verl itself (it shows why signals fail in "
            "threads); hybridrl's timeout_limit uses no signals, so it would time out there",
        },
    ),
]

_STUB_MODULE = "_verl_compat_stub"
_STUB_SOURCE = '''"""Placeholders for verl names hybridrl does not define (written by benchmarks/verl_compat.py)."""


class Missing:
    def __init__(self, name):
        self._name = name

    def _fail(self, *args, **kwargs):
        raise NotImplementedError(f"{self._name} has no hybridrl counterpart")

    __call__ = _fail

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        self._fail()


def missing(name):
    return Missing(name)
'''


def _resolve(verl_module: str, name: str) -> tuple[str, str | None]:
    """(hybridrl import statement body, missing verl name or None) for ``from verl_module import name``."""
    submodule = f"{verl_module}.{name}"
    if submodule in IMPORT_MAP:  # `from verl.utils import tensordict_utils`: a module
        target = IMPORT_MAP[submodule]
        return (f"import {target}", None) if target else ("", submodule)
    if verl_module not in IMPORT_MAP:
        raise SystemExit(f"verl_compat: no IMPORT_MAP entry for {verl_module!r} (needed for {name!r}); add one")
    target = IMPORT_MAP[verl_module]
    if target is None or not hasattr(importlib.import_module(target), name):
        return "", f"{verl_module}.{name}"
    return f"from {target} import {name}", None


def _rewrite_node(node: ast.stmt) -> tuple[list[str], list[str]]:
    """Replacement statements for one verl import, and the verl names hybridrl lacks."""
    statements, missing = [], []
    if isinstance(node, ast.ImportFrom):
        for alias in node.names:
            bind = alias.asname or alias.name
            body, lacking = _resolve(node.module, alias.name)
            if lacking:
                statements.append(f"{bind} = missing({lacking!r})")
                missing.append(lacking)
            elif body.startswith("import "):
                statements.append(f"{body} as {bind}")
            else:
                statements.append(body if bind == alias.name else f"{body} as {bind}")
    else:  # ast.Import
        for alias in node.names:
            target = IMPORT_MAP.get(alias.name)
            if not alias.asname:  # `import verl.x.y`: later `verl.x.y.name` references stay unresolved
                statements.append(f"import {target}" if target else "pass")
                if not target:
                    missing.append(alias.name)
            elif target is None:
                statements.append(f"{alias.asname} = missing({alias.name!r})")
                missing.append(alias.name)
            else:
                statements.append(f"import {target} as {alias.asname}")
    if missing:
        statements.insert(0, f"from {_STUB_MODULE} import missing")
    return statements, missing


def _is_verl(module: str | None) -> bool:
    return bool(module) and (module == "verl" or module.startswith("verl."))


def rewrite_imports(source: str) -> tuple[str, list[tuple[str, str]], list[str]]:
    """``source`` with its verl imports pointed at hybridrl, keeping every other line and the
    line count. Returns (new source, [(old import, new import)], missing verl names)."""
    lines = source.splitlines(keepends=True)
    changes, missing = [], []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and _is_verl(node.module):
            pass
        elif isinstance(node, ast.Import) and any(_is_verl(a.name) for a in node.names):
            pass
        else:
            continue
        statements, lacking = _rewrite_node(node)
        missing += lacking
        first, last = node.lineno - 1, node.end_lineno - 1
        indent = re.match(r"\s*", lines[first]).group(0)
        old = "".join(lines[first : last + 1]).strip()
        new = "; ".join(statements)
        changes.append((old, new))
        lines[first] = indent + new + "\n"
        for i in range(first + 1, last + 1):  # keep line numbers
            lines[i] = "\n"
    return "".join(lines), changes, missing


def _wheel_tests(version: str) -> str:
    """The folder of verl ``version``'s wheel, unpacked (downloaded once into :data:`CACHE_DIR`)."""
    folder = os.path.join(CACHE_DIR, f"verl-{version}")
    if not os.path.isdir(os.path.join(folder, "tests")):
        os.makedirs(CACHE_DIR, exist_ok=True)
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                f"verl=={version}",
                "--no-deps",
                "--only-binary=:all:",
                "-q",
                "-d",
                CACHE_DIR,
            ],
            capture_output=True,
            text=True,
        )
        wheels = [w for w in os.listdir(CACHE_DIR) if w.startswith(f"verl-{version}-") and w.endswith(".whl")]
        if result.returncode != 0 or not wheels:
            raise SystemExit(
                f"verl_compat: cannot download verl=={version}: {result.stderr.strip()[-300:]}; "
                "use --verl-repo with a verl checkout instead"
            )
        shutil.unpack_archive(os.path.join(CACHE_DIR, wheels[0]), folder, format="zip")
    return folder


def _read_test(args, path: str) -> str | None:
    """The test file's text, or None when this verl source has no such file (a newer or older verl)."""
    if args.verl_repo:
        return _git_show(args.verl_repo, args.rev, path)
    file = os.path.join(_wheel_tests(args.verl_version), path)
    if not os.path.isfile(file):
        return None
    with open(file) as f:
        return f.read()


def _git_show(repo: str, rev: str, path: str) -> str | None:
    result = subprocess.run(["git", "-C", repo, "show", f"{rev}:{path}"], capture_output=True, text=True)
    if result.returncode != 0:
        if "does not exist" in result.stderr or "exists on disk, but not in" in result.stderr:
            return None
        raise SystemExit(f"verl_compat: cannot read {path} at {rev} from {repo}: {result.stderr.strip()}")
    return result.stdout


def _junit_outcomes(xml_path: str) -> dict[str, str]:
    """test id -> passed / failed / skipped, from pytest's JUnit XML."""
    outcomes = {}
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            outcomes[name] = "failed"
        elif case.find("skipped") is not None:
            outcomes[name] = "skipped"
        else:
            outcomes[name] = "passed"
    return outcomes


def run_file(spec: VerlTestFile, source: str, workdir: str, show_imports: bool, exclude: bool) -> dict:
    source, changes, missing = rewrite_imports(source)
    target = os.path.join(workdir, spec.path)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "w") as f:
        f.write(source)
    if show_imports:
        print(f"\n{spec.path}: rewritten imports")
        for old, new in changes:
            print(f"  - {' '.join(old.split())}\n  + {new}")
    xml_path = target + ".xml"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--import-mode=importlib",
        f"--junitxml={xml_path}",
        spec.path,
    ]
    for test_id in spec.excluded if exclude else ():
        cmd.append(f"--deselect={spec.path}::{test_id}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([workdir, REPO_ROOT, os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
    outcomes = _junit_outcomes(xml_path) if os.path.exists(xml_path) else {}
    deselected = re.search(r"(\d+) deselected", result.stdout)
    return {
        "path": spec.path,
        "outcomes": outcomes,
        "excluded": int(deselected.group(1)) if deselected else 0,
        "missing": missing,
        "output": result.stdout + result.stderr,
        "returncode": result.returncode,
    }


def _report(results: list[dict], specs: list[VerlTestFile], verbose: bool) -> int:
    width = max(len(r["path"]) for r in results)
    print(f"\n{'verl test file':<{width}}  passed  failed  skipped  excluded")
    for r in results:
        counts = {k: sum(v == k for v in r["outcomes"].values()) for k in ("passed", "failed", "skipped")}
        print(
            f"{r['path']:<{width}}  {counts['passed']:>6}  {counts['failed']:>6}  {counts['skipped']:>7}  "
            f"{r['excluded']:>8}"
        )
    failed_any = False
    for r, spec in zip(results, specs):
        print(f"\n{r['path']}")
        if r["missing"]:
            print(f"  verl names without a hybridrl counterpart (placeholders): {', '.join(r['missing'])}")
        for test_id, reason in spec.excluded.items():
            print(f"  excluded {test_id}: {reason}")
        failed = [name for name, outcome in r["outcomes"].items() if outcome == "failed"]
        for name in failed:
            print(f"  FAILED {name}")
        if r["returncode"] not in (0, 5) and not failed:  # e.g. a collection error
            print(f"  pytest exited with {r['returncode']}:\n{r['output'][-3000:]}")
            failed = ["<pytest run>"]
        if failed and verbose:
            print(r["output"][-6000:])
        failed_any = failed_any or bool(failed)
    return 1 if failed_any else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--verl-version",
        default=DEFAULT_VERL_VERSION,
        help="read the tests from this release's wheel (downloaded once)",
    )
    parser.add_argument("--verl-repo", default=None, help="read them from this verl git repository instead")
    parser.add_argument("--rev", default="HEAD", help="with --verl-repo: the revision to read")
    parser.add_argument("--show-imports", action="store_true", help="print each rewritten import")
    parser.add_argument("--verbose", action="store_true", help="print pytest's output when a test fails")
    parser.add_argument(
        "--no-exclude",
        action="store_true",
        help="run the excluded tests too (to see whether an exclusion is still needed)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder and print its path")
    args = parser.parse_args(argv)

    workdir = tempfile.mkdtemp(prefix="verl_compat_")
    with open(os.path.join(workdir, f"{_STUB_MODULE}.py"), "w") as f:
        f.write(_STUB_SOURCE)
    with open(os.path.join(workdir, "pytest.ini"), "w") as f:  # keeps hybridrl's pytest config out
        f.write("[pytest]\n")
    sys.path.insert(0, REPO_ROOT)  # _resolve imports hybridrl modules to see which names exist
    try:
        sources = [(spec, _read_test(args, spec.path)) for spec in VERL_TEST_FILES]
        for spec, source in sources:
            if source is None:
                print(f"not in this verl source (skipped): {spec.path}")
        present = [(spec, source) for spec, source in sources if source is not None]
        results = [run_file(spec, source, workdir, args.show_imports, not args.no_exclude) for spec, source in present]
        return _report(results, [spec for spec, _ in present], args.verbose)
    finally:
        if args.keep:
            print(f"\ntemporary folder kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
