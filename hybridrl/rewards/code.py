"""Code-execution rewards: run the program of a response against test cases in the sandbox.

The facts of verl's ``prime_code`` scorer carry over (its code does not):

- **The program** is the last fenced ```python (or ```py, ```python3, plain ```) block of the
  response, or the whole response when it has none; an unclosed last fence runs to the end.
- **The ground truth** is a dict or its JSON string, in one of three forms
  (:func:`hybridrl.rewards.code_tests.parse_ground_truth`):

  - stdin/stdout ``{"inputs": [str, ...], "outputs": [str, ...]}``: the program reads case i's
    input on stdin; its stdout must equal ``outputs[i]`` up to whitespace (lines compared
    stripped, blank lines ignored) or token by token as numbers within numpy's ``allclose``
    tolerance. A list of lines in place of a string is joined with newlines.
  - call-based ``{"fn_name": str, "inputs": [[args...], ...], "outputs": [...]}`` (APPS, TACO):
    ``fn_name(*args)``, or ``Solution().fn_name(*args)`` when the program defines no such function
    but a ``class Solution``, must return ``outputs[i]`` (compared after a JSON round trip, so
    tuples equal lists) or ``outputs[i][0]`` (APPS wraps outputs in a list). PRIME's string
    cases (``"1\\n2"``: one JSON argument a line, output ``"3"``) are decoded first.
  - assert-style ``{"test_code": str, "entry_point": str, "prefix": str}`` (HumanEval):
    ``prefix`` (the prompt) and the program run, then ``test_code`` and ``check(<entry_point>)``
    in the same namespace. A program that defines ``entry_point`` comes after the prefix (whose
    imports and helper functions stay in reach); one that does not continues it, so a bare body
    works.
- **Scores.** ``continuous=False``: 1.0 when every case passes, else 0.0; cases run in order,
  judging stops at the first failure. ``continuous=True`` (what verl uses for codecontests,
  apps, codeforces and taco): the fraction of the first :data:`MAX_CONTINUOUS_CASES` cases
  passed, each of them run; later cases are not run (verl's cap: some problems have hundreds).
- stdin/stdout and call-based programs start after one line of common imports (``sys``,
  ``math``, ``collections``, ``itertools``, ... and ``from typing import *``), as verl's harness
  puts them in reach.
- **Time.** Each case has the sandbox's wall-clock limit (``reward_model.sandbox.timeout_s``,
  10 s by default; :data:`DEFAULT_CASE_TIMEOUT_S` for a sandbox without one). The call-based
  cases of a program run in one process, each under its own alarm, so a case over time fails
  only itself; when the sandbox ends such a run for time after some cases finished (the CPU
  limit covers the whole run), a fresh run resumes with the interrupted case. The alarm is the
  program's to catch, so all the runs of one program share one deadline, ``n + 1`` case limits
  plus 1 s, that the sandbox enforces from outside (SIGKILL of the whole run): a program that
  ignores its alarm costs that much, not a full run per case.

- **Passed means the harness reached its end, never the exit status.** A program can end its
  process with status 0 before a test fails (``sys.exit(0)``, ``os._exit(0)``, ``raise
  SystemExit`` in the program or in the function under test, an exit from ``sys.excepthook`` or
  ``atexit``). So each run gets a fresh random nonce: assert-style, the harness reads it from stdin
  before the program starts (the program finds stdin at its end, the nonce in neither the source
  nor the environment) and prints it only after ``check()`` returned; the scorer looks for it in
  stdout. This works the same on every sandbox, the Sandbox Fusion service included (it returns
  the run's stdout). Between the program and the tests the harness restores the builtins and
  removes trace and profile hooks, so patching ``abs`` or jumping over ``assert`` lines does not
  carry into the tests. Call-based cases are judged from the values the harness reports, marked
  by a nonce in the source: a program that prints such a line must still hold the right value,
  which only the scorer knows. stdin/stdout cases are judged from the output itself.
- **The limit.** The tests run in the program's process (they call its function), so a program
  that searches the interpreter (the harness's frame, the garbage collector, ``ctypes``) can find
  the nonce, and one that patches what the tests use beyond the builtins (a module's functions, a
  result that equals everything) can pass an ``assert``. Closing that needs the function under
  test in another process than the tests; not done.

Every program runs in :func:`hybridrl.rewards.sandbox.current_sandbox`; nothing runs here.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from hybridrl.rewards.code_tests import (
    CodeGroundTruthError,
    CodeTests,
    defines_name,
    extract_program,
    outputs_match,
    parse_ground_truth,
)
from hybridrl.rewards.sandbox import current_sandbox

__all__ = [
    "CodeGroundTruthError",
    "CodeSandboxError",
    "compute_score",
    "compute_score_continuous",
    "extract_program",
    "parse_ground_truth",
    "DEFAULT_CASE_TIMEOUT_S",
    "MAX_CONTINUOUS_CASES",
]

DEFAULT_CASE_TIMEOUT_S = 10.0  # seconds per case when the sandbox does not say (assert-style: per check())
MAX_CONTINUOUS_CASES = 10  # verl's cap on the cases a continuous score runs
_PRELUDE = (
    "import sys, os, math, re, string, collections, itertools, functools, heapq, bisect, copy, "
    "random, statistics, operator, json; from typing import *\n"
)
# Call-based cases: a time limit on loading the program (replaced per case by the harness) ...
_CALL_PRELUDE = (
    "import signal as __hybridrl_signal\n"
    "def __hybridrl_expired(signum, frame): raise TimeoutError('no result within {timeout:g} s')\n"
    "__hybridrl_signal.signal(__hybridrl_signal.SIGALRM, __hybridrl_expired); "
    "__hybridrl_signal.setitimer(__hybridrl_signal.ITIMER_REAL, {timeout!r})\n"
)
# ... and after the program, a harness reporting one JSON line per case, marked with a nonce.
_CALL_HARNESS = """

def __hybridrl_run_cases(nonce, fn_name, cases_json, timeout_s):
    import json, signal, sys
    def report(payload):
        try:
            line = json.dumps(payload, default=repr)
        except (TypeError, ValueError):
            line = json.dumps({"value": repr(payload.get("value"))})
        sys.__stdout__.write("\\n" + nonce + " " + line + "\\n")
        sys.__stdout__.flush()
    fn = globals().get(fn_name)
    if not callable(fn) and isinstance(globals().get("Solution"), type):
        try:
            fn = getattr(globals()["Solution"](), fn_name, None)
        except Exception:
            fn = None
    signal.setitimer(signal.ITIMER_REAL, 0)
    report({"ready": callable(fn)})
    if not callable(fn):
        return
    for args in json.loads(cases_json):
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            payload = {"value": fn(*args)}
        except BaseException as exc:
            payload = {"error": type(exc).__name__ + ": " + str(exc)}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        report(payload)
"""


# Assert-style: the nonce comes on stdin, read before the program runs (byte by byte, so nothing
# after it is taken) and printed only once the tests returned. Everything the harness calls after
# the program is bound before it, since the program may patch builtins and modules.
_ASSERT_HARNESS = """
def __hybridrl_check(program, tests):
    import builtins, os, sys
    nonce = b""
    while not nonce.endswith(b"\\n"):
        byte = os.read(0, 1)
        if not byte:
            break
        nonce += byte
    run, compile_, namespace, write = exec, compile, globals(), os.write
    settrace, setprofile, kept, table = sys.settrace, sys.setprofile, dict(vars(builtins)), vars(builtins)
    run(compile_(program, "<program>", "exec", optimize=0), namespace)
    settrace(None)
    setprofile(None)
    for name in [name for name in table if name not in kept]:
        table.pop(name)
    table.update(kept)
    run(compile_(tests, "<tests>", "exec", optimize=0), namespace)
    write(1, b"\\n" + nonce.strip() + b' {"done": true}\\n')
"""


class CodeSandboxError(RuntimeError):
    """The sandbox itself failed (status ``sandbox_error``), so the program was not judged."""


def compute_score(
    solution_str: str, ground_truth: Any, extra_info: dict | None = None, continuous: bool = False
) -> dict:
    """Run the response's program on the test cases of ``ground_truth`` in the sandbox.

    Args:
        solution_str: the decoded response (the program is extracted, see the module doc).
        ground_truth: a dict or JSON string in one of the three forms of the module doc.
        extra_info: the row's extra_info (unused; accepted for the reward manager).
        continuous: score the fraction of the first :data:`MAX_CONTINUOUS_CASES` cases passed,
            instead of 1.0 only when every case passes.

    Returns:
        ``{"score": float in [0, 1], "passed": int, "total": int (cases counted), "reason": str}``;
        ``reason`` is one line on the first failing case ("" when all pass).

    Raises:
        CodeGroundTruthError: a malformed ground truth (the message names the key).
        CodeSandboxError: the sandbox failed to run a program.
    """
    tests = parse_ground_truth(ground_truth)
    total = min(tests.num_cases, MAX_CONTINUOUS_CASES) if continuous else tests.num_cases
    program = extract_program(solution_str or "")
    if not program.strip():
        return {"score": 0.0, "passed": 0, "total": total, "reason": "empty response: no program to run"}
    if tests.kind == "assert":
        passed, reason = run_assert(program, tests)
    else:
        run = run_stdio_cases if tests.kind == "stdio" else run_call_cases
        passed, reason = run(program, tests, total, stop_at_failure=not continuous)
    score = passed / total if continuous else float(passed == total)
    return {"score": score, "passed": passed, "total": total, "reason": reason}


def compute_score_continuous(solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> dict:
    """:func:`compute_score` with ``continuous=True`` (the scorer of verl's code data sources)."""
    return compute_score(solution_str, ground_truth, extra_info, continuous=True)


def _short(value: Any, limit: int = 60) -> str:
    text = " ".join((value if isinstance(value, str) else repr(value)).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def case_timeout_s() -> float:
    """Seconds per case: the current sandbox's wall-clock limit (``limits.timeout_s`` of the local
    sandbox, ``timeout_s`` of the Sandbox Fusion client), else :data:`DEFAULT_CASE_TIMEOUT_S`."""
    sandbox = current_sandbox()
    limit = getattr(getattr(sandbox, "limits", None), "timeout_s", None) or getattr(sandbox, "timeout_s", None)
    return float(limit or DEFAULT_CASE_TIMEOUT_S)


def _run(source: str, stdin: str = "", timeout_s: float | None = None):
    """One sandbox run (``timeout_s`` None: the sandbox's own limit, i.e. one case).

    Raises:
        CodeSandboxError: the sandbox, not the program, failed.
    """
    result = current_sandbox().run(source, stdin=stdin, timeout_s=timeout_s)
    if result.status == "sandbox_error":
        raise CodeSandboxError(f"the code sandbox failed: {result.reason}; the program was not judged")
    return result


def _why(result) -> str:
    """One line on why a sandbox run did not succeed: the error's last stderr line, or the status."""
    if result.status == "error":
        lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
        return _short(lines[-1] if lines else result.reason or f"exit status {result.returncode}", 200)
    if result.status == "ok":  # exit status 0, yet the harness did not report
        return "the program exited before the tests finished"
    return _short(f"{result.status}: {result.reason}" if result.reason else result.status, 200)


def _new_nonce() -> str:
    """A fresh marker for the harness's lines, which a program cannot guess (64 random bits)."""
    return "@hybridrl-" + secrets.token_hex(8)


def run_assert(program: str, tests: CodeTests) -> tuple[int, str]:
    """Assert-style: ``(1, "")`` when ``check(entry_point)`` returned (the harness printed the
    run's nonce), else ``(0, reason)``, whatever the exit status.

    Raises:
        CodeSandboxError: the sandbox, not the program, failed.
    """
    if defines_name(program, tests.entry_point):
        body = f"{tests.prefix}\n{program}" if tests.prefix else program
    else:
        body = tests.prefix + program
    nonce = _new_nonce()
    checks = f"{tests.test_code}\n\ncheck({tests.entry_point})\n"
    result = _run(_ASSERT_HARNESS + f"\n__hybridrl_check({body!r}, {checks!r})\n", stdin=nonce + "\n")
    if any(report.get("done") is True for report in _reports(result.stdout, nonce)):
        return 1, ""
    return 0, f"check({tests.entry_point}): {_why(result)}"


def run_stdio_cases(program: str, tests: CodeTests, n: int, stop_at_failure: bool) -> tuple[int, str]:
    """stdin/stdout: one sandbox run per case among the first ``n``; ``(passed, first reason)``."""
    passed, reason = 0, ""
    for i in range(n):
        result = _run(_PRELUDE + program, stdin=tests.inputs[i])
        if result.status == "ok" and outputs_match(result.stdout, tests.outputs[i]):
            passed += 1
            continue
        why = (
            f"printed {_short(result.stdout)!r}, expected {_short(tests.outputs[i])!r}"
            if result.status == "ok"
            else _why(result)
        )
        reason = reason or f"case {i + 1} of {n}: {why}"
        if stop_at_failure:
            break
    return passed, reason


def _reports(stdout: str, nonce: str) -> list[dict]:
    """The harness's JSON lines in ``stdout`` (a line cut by an output limit is left out)."""
    reports = []
    for line in stdout.splitlines():
        if line.startswith(nonce + " "):
            try:
                reports.append(json.loads(line[len(nonce) + 1 :]))
            except json.JSONDecodeError:
                break
    return reports


def _judge(report: dict, expected: Any) -> str:
    """ "" when a call-based case's report matches ``expected``, else why not."""
    if "error" in report:
        return _short(report["error"], 200)
    value = report.get("value")
    if value == expected or (isinstance(expected, list) and expected and value == expected[0]):
        return ""
    return f"returned {_short(value)}, expected {_short(expected)}"


def run_call_cases(program: str, tests: CodeTests, n: int, stop_at_failure: bool) -> tuple[int, str]:
    """Call-based: the first ``n`` cases in one sandbox run (after a case that kills the process,
    a new run resumes with the next case); ``(passed, first reason)``."""
    passed, reason, start = 0, "", 0
    timeout = case_timeout_s()
    # The alarm of a case is the program's to catch; this deadline is not: every run gets only
    # what is left of it, and the sandbox kills the run from outside when that is spent.
    deadline = time.monotonic() + timeout * (n + 1) + 1.0
    while start < n:
        left = deadline - time.monotonic()
        if left <= 0:
            return passed, reason or f"case {start + 1} of {n}: over the time of all {n} cases ({timeout * n:g} s)"
        nonce = _new_nonce()
        cases = json.dumps(list(tests.inputs[start:n]))
        source = (
            _CALL_PRELUDE.format(timeout=timeout)
            + _PRELUDE
            + program
            + _CALL_HARNESS
            + f"\n__hybridrl_run_cases({nonce!r}, {tests.fn_name!r}, {cases!r}, {timeout!r})\n"
        )
        result = _run(source, timeout_s=min(timeout * (n - start + 1) + 1.0, left))
        reports = _reports(result.stdout, nonce)
        if not reports:
            return passed, reason or f"the program does not run: {_why(result)}"
        if not reports[0].get("ready"):
            return passed, reason or f"the program defines no function {tests.fn_name!r} (nor a Solution method)"
        for i, report in enumerate(reports[1:], start):
            why = _judge(report, tests.outputs[i])
            if not why:
                passed += 1
                continue
            call = f"{tests.fn_name}({', '.join(repr(a) for a in tests.inputs[i])})"
            reason = reason or f"case {i + 1} of {n}: {_short(call)} {why}"
            if stop_at_failure:
                return passed, reason
        finished = len(reports) - 1
        start += finished
        if start < n and finished and result.status == "timeout":
            continue  # the run's time ran out, maybe not the case's: a fresh run retries it
        if start < n:  # the process ended during case `start`
            reason = reason or f"case {start + 1} of {n}: {_why(result)}"
            if stop_at_failure:
                return passed, reason
            start += 1
    return passed, reason
