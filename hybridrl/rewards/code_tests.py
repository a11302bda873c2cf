"""Code test cases: the program of a response, the three ground-truth forms, output comparison.

Pure functions, nothing is run here; :mod:`hybridrl.rewards.code` runs the cases in the sandbox
(its module doc describes the forms and the scores).
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CodeGroundTruthError",
    "CodeTests",
    "extract_program",
    "parse_ground_truth",
    "outputs_match",
    "defines_name",
]

_PYTHON_TAGS = ("python", "py", "python3", "")
_FENCE = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_FORMS = (
    "{'inputs': [...], 'outputs': [...]} (stdin/stdout), the same with 'fn_name' (call-based), "
    "or {'test_code', 'entry_point', 'prefix'} (assert-style)"
)


class CodeGroundTruthError(ValueError):
    """A code ground truth is not in one of the three forms; the message names the key."""


@dataclass(frozen=True)
class CodeTests:
    """A parsed ground truth: ``kind`` is ``"stdio"``, ``"call"`` or ``"assert"``; stdio and call
    cases are ``inputs[i]`` (str, or the argument list) with ``outputs[i]``."""

    kind: str
    inputs: tuple = ()
    outputs: tuple = ()
    fn_name: str = ""
    test_code: str = ""
    entry_point: str = ""
    prefix: str = ""

    @property
    def num_cases(self) -> int:
        return 1 if self.kind == "assert" else len(self.inputs)


def extract_program(solution_str: str) -> str:
    """The program of a response: its last python (or untagged) fenced block, else all of it."""
    blocks = [m.group(2) for m in _FENCE.finditer(solution_str) if m.group(1).lower() in _PYTHON_TAGS]
    return blocks[-1] if blocks else solution_str


def _plain(value: Any) -> Any:
    """Lists from numpy arrays and tuples (what a parquet round trip makes of lists)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    return list(value) if isinstance(value, tuple) else value


def _bad(key: str, problem: str) -> CodeGroundTruthError:
    return CodeGroundTruthError(f"code ground_truth{key}: {problem}; expected {_FORMS}")


def _text(value: Any, key: str) -> str:
    """A stdin/stdout case: a string, or a list of lines (joined with newlines, as verl does)."""
    value = _plain(value)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    if not isinstance(value, str):
        raise _bad(key, f"is {type(value).__name__}; stdin/stdout cases are strings")
    return value


def _call_case(args: Any, expected: Any, i: int) -> tuple[list, Any]:
    """``(argument list, expected value)`` of call-based case ``i``; PRIME's strings are decoded."""
    args, expected = _plain(args), _plain(expected)
    if isinstance(args, str):
        try:
            args = [json.loads(line) for line in args.split("\n") if line.strip()]
            expected = json.loads(expected) if isinstance(expected, str) else expected
        except json.JSONDecodeError as exc:
            raise _bad(
                f"['inputs'/'outputs'][{i}]", f"a string case must hold JSON, one argument a line ({exc.msg})"
            ) from None
    if not isinstance(args, list):
        raise _bad(f"['inputs'][{i}]", f"is {type(args).__name__}; a call-based case is the list of arguments")
    try:  # both travel as JSON (arguments into the harness, results out of it)
        return json.loads(json.dumps(args, default=_plain)), json.loads(json.dumps(expected, default=_plain))
    except (TypeError, ValueError):
        raise _bad(f"['inputs'/'outputs'][{i}]", "cannot be written as JSON") from None


def _parse_cases(gt: dict) -> CodeTests:
    for key in ("inputs", "outputs"):
        if key not in gt:
            raise _bad("", f"has '{'outputs' if key == 'inputs' else 'inputs'}' but no '{key}' key")
    inputs, outputs = _plain(gt["inputs"]), _plain(gt["outputs"])
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs) or not inputs:
        raise _bad("['inputs'/'outputs']", "must be two non-empty lists of equal length (one entry per case)")
    fn_name = gt.get("fn_name")
    if fn_name is None:
        return CodeTests(
            "stdio",
            tuple(_text(v, f"['inputs'][{i}]") for i, v in enumerate(inputs)),
            tuple(_text(v, f"['outputs'][{i}]") for i, v in enumerate(outputs)),
        )
    if not isinstance(fn_name, str) or not fn_name.isidentifier():
        raise _bad("['fn_name']", f"{fn_name!r} is not a function name")
    cases = [_call_case(a, e, i) for i, (a, e) in enumerate(zip(inputs, outputs))]
    return CodeTests("call", tuple(a for a, _ in cases), tuple(e for _, e in cases), fn_name=fn_name)


def parse_ground_truth(ground_truth: Any) -> CodeTests:
    """Check and normalise a code ground truth (a dict or its JSON string, forms in the module doc).

    Raises:
        CodeGroundTruthError: not JSON, not a dict, a missing or malformed key (named in the message).
    """
    gt = ground_truth
    if isinstance(gt, (str, bytes)):
        try:
            gt = json.loads(gt)
        except json.JSONDecodeError as exc:
            raise _bad("", f"is not valid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(gt, dict):
        raise _bad("", f"is {type(gt).__name__}, not a dict")
    if "test_code" in gt or "entry_point" in gt:
        for key in ("test_code", "entry_point"):
            if not isinstance(gt.get(key), str) or not gt[key].strip():
                raise _bad(f"['{key}']", "is missing or not a non-empty string")
        if not gt["entry_point"].isidentifier():
            raise _bad("['entry_point']", f"{gt['entry_point']!r} is not a function name")
        prefix = gt.get("prefix") or ""
        if not isinstance(prefix, str):
            raise _bad("['prefix']", f"is {type(prefix).__name__}, not a string")
        return CodeTests("assert", test_code=gt["test_code"], entry_point=gt["entry_point"], prefix=prefix)
    if "inputs" in gt or "outputs" in gt:
        return _parse_cases(gt)
    raise _bad("", f"has neither 'inputs'/'outputs' nor 'test_code'/'entry_point' (its keys: {sorted(gt)})")


_NUMBER_TOL = (1e-5, 1e-8)  # numpy.allclose's rtol, atol


def _close(a: str, b: str) -> bool:
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    return abs(x - y) <= _NUMBER_TOL[1] + _NUMBER_TOL[0] * abs(y)


def outputs_match(actual: str, expected: str) -> bool:
    """Whether a program's stdout ``actual`` matches ``expected``: the same lines once each is
    stripped and blank lines are dropped, or line for line the same tokens, numbers within
    numpy's ``allclose`` tolerance (rtol 1e-5, atol 1e-8)."""
    got = [line.strip() for line in actual.splitlines() if line.strip()]
    want = [line.strip() for line in expected.splitlines() if line.strip()]
    if got == want:
        return True
    if len(got) != len(want):
        return False
    for g, w in zip(got, want):
        g_tokens, w_tokens = g.split(), w.split()
        if len(g_tokens) != len(w_tokens) or not all(a == b or _close(a, b) for a, b in zip(g_tokens, w_tokens)):
            return False
    return True


def defines_name(program: str, name: str) -> bool:
    """Whether ``program`` parses and binds ``name`` at its top level (def, class, assignment, import)."""
    try:
        body = ast.parse(program).body
    except (SyntaxError, ValueError):
        return False
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                return True
    return False
