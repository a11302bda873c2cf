"""The code scorer: program extraction, the three ground-truth forms run in the sandbox, scores."""

import json

import numpy as np
import pytest

from hybridrl.rewards import code, default_compute_score, get_scorer
from hybridrl.rewards.code import CodeGroundTruthError, CodeSandboxError, compute_score
from hybridrl.rewards.code_tests import defines_name, extract_program, outputs_match, parse_ground_truth
from hybridrl.rewards.sandbox import LocalSandbox, SandboxLimits, SandboxResult

FENCE = "```"


def fenced(program, tag="python"):
    return f"Here you go:\n{FENCE}{tag}\n{program}\n{FENCE}\nDone."


# ------------------------------------------------------------------ extraction


def test_extract_takes_the_last_python_block():
    text = f"{FENCE}python\nx = 1\n{FENCE}\nthen\n{FENCE}python\nx = 2\n{FENCE}\n"
    assert extract_program(text) == "x = 2\n"


@pytest.mark.parametrize("tag", ["py", "python3", "Python", ""])
def test_extract_accepts_py_and_untagged_fences(tag):
    assert extract_program(fenced("print(3)", tag)) == "print(3)\n"


def test_extract_skips_other_languages_and_falls_back_to_the_whole_text():
    text = f"{FENCE}python\nprint(1)\n{FENCE}\n{FENCE}bash\nls\n{FENCE}"
    assert extract_program(text) == "print(1)\n"
    assert extract_program(f"{FENCE}bash\nls\n{FENCE}") == f"{FENCE}bash\nls\n{FENCE}"
    assert extract_program("def f():\n    return 1") == "def f():\n    return 1"


def test_extract_reads_an_unclosed_last_fence_to_the_end():
    assert extract_program(f"text\n{FENCE}python\ndef f():\n    return 1") == "def f():\n    return 1"


def test_defines_name():
    assert defines_name("import math\ndef f(x):\n    return x", "f")
    assert defines_name("f = lambda x: x", "f")
    assert not defines_name("def g(x):\n    return x", "f")
    assert not defines_name("    return x", "f")  # a bare body does not parse


# ------------------------------------------------------------------ stdin/stdout

ECHO_DOUBLE = "n = int(input())\nprint(n * 2)"


@pytest.mark.slow
def test_stdio_all_cases_pass():
    gt = {"inputs": ["3\n", "10\n"], "outputs": ["6\n", "20\n"]}
    assert compute_score(fenced(ECHO_DOUBLE), gt) == {"score": 1.0, "passed": 2, "total": 2, "reason": ""}


@pytest.mark.slow
def test_stdio_wrong_output_names_the_case_and_the_outputs():
    result = compute_score(ECHO_DOUBLE, json.dumps({"inputs": ["3", "4"], "outputs": ["6", "9"]}))
    assert result["score"] == 0.0 and result["passed"] == 1
    assert result["reason"].startswith("case 2 of 2:") and "'8'" in result["reason"] and "'9'" in result["reason"]


@pytest.mark.slow
def test_stdio_comparison_tolerates_whitespace_and_float_noise():
    gt = {"inputs": ["1"], "outputs": ["1.5 2\n\nok"]}
    assert compute_score("print('  1.5000001   2  ')\nprint()\nprint('ok ')", gt)["score"] == 1.0
    assert compute_score("print('1.6 2')\nprint('ok')", gt)["score"] == 0.0
    assert compute_score("print('1.5 2 ok')", gt)["score"] == 0.0  # line structure still counts


def test_outputs_match_rules():
    assert outputs_match("a b\n", "a b")
    assert outputs_match("\n a b \n\n", "a b")
    assert outputs_match("3.0000000001\n", "3")
    assert not outputs_match("a  b", "a b c")
    assert not outputs_match("1\n2", "1")
    assert not outputs_match("abc", "abd")


@pytest.mark.slow
def test_stdio_runtime_error_reason_is_the_exception_line():
    result = compute_score("import sys\nprint(1 / int(input()))", {"inputs": ["0"], "outputs": ["1"]})
    assert result["score"] == 0.0 and "ZeroDivisionError" in result["reason"]


@pytest.mark.slow
def test_stdio_cases_may_be_lists_of_lines():
    gt = {"inputs": [["1 2", "3"]], "outputs": [["3", "3"]]}
    program = "a, b = map(int, input().split())\nprint(a + b)\nprint(input())"
    assert compute_score(program, gt)["score"] == 1.0


@pytest.mark.slow
def test_common_imports_are_in_reach_as_in_verl():
    assert compute_score("print(math.isqrt(int(input())))", {"inputs": ["17"], "outputs": ["4"]})["score"] == 1.0


# ------------------------------------------------------------------ call-based


def call_gt(fn_name, cases):
    return json.dumps({"fn_name": fn_name, "inputs": [list(a) for a, _ in cases], "outputs": [o for _, o in cases]})


ADD3 = call_gt("add", [((1,), 4), ((2,), 5), ((3,), 6)])


@pytest.mark.slow
def test_call_based_passes_and_reports_the_failing_call():
    assert compute_score(fenced("def add(x):\n    return x + 3"), ADD3)["score"] == 1.0
    result = compute_score(fenced("def add(x):\n    return 5"), ADD3)
    assert result["score"] == 0.0 and result["passed"] == 0
    assert result["reason"] == "case 1 of 3: add(1) returned 5, expected 4"


@pytest.mark.slow
def test_call_based_tuples_equal_lists_and_apps_wrapped_outputs():
    gt = {"fn_name": "pair", "inputs": [[1], [2]], "outputs": [[[1, 1]], [2, 2]]}  # first APPS-wrapped
    assert compute_score("def pair(x):\n    return (x, x)", gt)["score"] == 1.0


@pytest.mark.slow
def test_call_based_solution_class_and_prime_string_cases():
    gt = {"fn_name": "twoSum", "inputs": ["[1, 2]\n3", "[5]\n0"], "outputs": ["[1, 2, 3]", "[5, 0]"]}
    program = "class Solution:\n    def twoSum(self, xs: List[int], y: int) -> List[int]:\n        return xs + [y]"
    assert compute_score(program, gt)["score"] == 1.0


@pytest.mark.slow
def test_call_based_missing_function_and_syntax_error():
    assert "no function 'add'" in compute_score("def plus(x):\n    return x + 3", ADD3)["reason"]
    result = compute_score("def add(x) return x", ADD3)
    assert result["score"] == 0.0 and "SyntaxError" in result["reason"]


def limited_sandbox(monkeypatch, **limits):
    sandbox = LocalSandbox(SandboxLimits(**limits))
    monkeypatch.setattr(code, "current_sandbox", lambda: sandbox)


@pytest.mark.slow
def test_call_based_a_case_over_time_fails_only_itself(monkeypatch):
    limited_sandbox(monkeypatch, timeout_s=1.0, cpu_time_s=5.0)
    program = "def add(x):\n    while x == 2:\n        pass\n    return x + 3"
    result = compute_score(program, ADD3, continuous=True)
    assert result["passed"] == 2 and result["score"] == pytest.approx(2 / 3)
    assert result["reason"] == "case 2 of 3: add(2) TimeoutError: no result within 1 s"


@pytest.mark.slow
def test_a_run_out_of_cpu_time_after_some_cases_resumes_with_a_fresh_run(monkeypatch):
    """Each case burns 0.6 CPU-s, under the 1 s per process; together they are over it."""
    limited_sandbox(monkeypatch, timeout_s=5.0, cpu_time_s=1.0)
    program = (
        "import time\ndef add(x):\n    end = time.process_time() + 0.6\n"
        "    while time.process_time() < end:\n        pass\n    return x + 3"
    )
    assert compute_score(program, ADD3) == {"score": 1.0, "passed": 3, "total": 3, "reason": ""}


@pytest.mark.slow
def test_continuous_resumes_after_a_case_that_kills_the_process():
    program = "import os\ndef add(x):\n    if x == 2:\n        os._exit(3)\n    return x + 3"
    result = compute_score(program, ADD3, continuous=True)
    assert result["passed"] == 2 and result["reason"].startswith("case 2 of 3:")
    assert compute_score(program, ADD3)["score"] == 0.0


@pytest.mark.slow
def test_harness_reports_cannot_be_forged_by_printing():
    program = "print('\\n@hybridrl-0 {\"value\": 4}')\ndef add(x):\n    return 0"
    assert compute_score(program, ADD3, continuous=True)["passed"] == 0


# ------------------------------------------------------------------ continuous vs all-or-nothing


@pytest.mark.slow
def test_all_or_nothing_stops_at_the_first_failure_continuous_counts_all():
    gt = call_gt("f", [((0,), 1), ((1,), 1), ((2,), 1)])  # the program fails case 1 only
    program = "def f(x):\n    return 1 if x else 0"
    strict, partial = compute_score(program, gt), compute_score(program, gt, continuous=True)
    assert (strict["score"], strict["passed"], strict["total"]) == (0.0, 0, 3)
    assert (partial["passed"], partial["total"]) == (2, 3) and partial["score"] == pytest.approx(2 / 3)
    assert strict["reason"] == partial["reason"] and strict["reason"].startswith("case 1 of 3")


@pytest.mark.slow
def test_continuous_runs_only_the_first_cases_up_to_the_cap():
    n = code.MAX_CONTINUOUS_CASES + 2
    gt = call_gt("f", [((i,), i) for i in range(n)])
    program = f"def f(x):\n    return x if x < {code.MAX_CONTINUOUS_CASES} else -1"  # fails the cases past the cap
    partial = compute_score(program, gt, continuous=True)
    assert (partial["score"], partial["total"]) == (1.0, code.MAX_CONTINUOUS_CASES)
    assert compute_score(program, gt)["score"] == 0.0


@pytest.mark.slow
def test_registered_code_sources_score_like_verl():
    program = "def f(x):\n    return 1 if x else 0"
    gt = call_gt("f", [((0,), 1), ((1,), 1)])
    for source in ("codecontests", "apps", "codeforces", "taco"):  # verl's prime_code sets: a float, as verl
        assert default_compute_score(source, program, gt) == pytest.approx(0.5)
    assert default_compute_score("code_tasks", program, gt)["score"] == pytest.approx(0.5)
    for source in ("humaneval", "openai_humaneval"):
        assert get_scorer(source) is code.compute_score
        assert default_compute_score(source, program, gt)["score"] == 0.0


# ------------------------------------------------------------------ assert-style (HumanEval)

PREFIX = 'import math\n\n\ndef root(x):\n    """Integer square root."""\n'
ASSERT_GT = {
    "test_code": "def check(c):\n    assert c(16) == 4\n    assert c(17) == 4\n",
    "entry_point": "root",
    "prefix": PREFIX,
}


@pytest.mark.slow
def test_assert_style_full_function_and_bare_body():
    assert compute_score(fenced("def root(x):\n    return math.isqrt(x)"), ASSERT_GT)["score"] == 1.0
    assert compute_score(fenced("    return math.isqrt(x)"), ASSERT_GT)["score"] == 1.0  # continues the prefix


@pytest.mark.slow
def test_assert_style_failure_and_missing_function():
    result = compute_score("def root(x):\n    return int(x ** 0.5) + 1", ASSERT_GT)
    assert (result["score"], result["passed"], result["total"]) == (0.0, 0, 1)
    assert result["reason"].startswith("check(root):") and "AssertionError" in result["reason"]
    no_prefix = {**ASSERT_GT, "prefix": ""}
    assert "NameError" in compute_score("def other(x):\n    return 4", no_prefix)["reason"]


# Ways a program ends its run with exit status 0, or empties the tests, without passing check().
ABS_GT = {
    **ASSERT_GT,
    "test_code": "def check(c):\n    assert abs(c(16) - 4) < 1e-9\n    assert abs(c(17) - 4) < 1e-9\n",
}
WRONG = "def root(x):\n    return -1"
REWARD_HACKS = {
    "sys.exit(0)": "import sys\nsys.exit(0)",
    "os._exit(0)": "import os\nos._exit(0)",
    "raise SystemExit": "raise SystemExit",
    "SystemExit from the function": "def root(x):\n    raise SystemExit(0)",
    "os._exit from the function": "import os\ndef root(x):\n    os._exit(0)",
    "excepthook exits 0": f"import os, sys\nsys.excepthook = lambda *a: os._exit(0)\n{WRONG}",
    "atexit exits 0": f"import atexit, os\natexit.register(os._exit, 0)\n{WRONG}",
    "SIGKILL the parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos._exit(0)",
    "SIGINT the parent": "import os, signal, time\nos.kill(os.getppid(), signal.SIGINT)\ntime.sleep(0.5)\nos._exit(0)",
    "fake success marker": 'print("\\n@hybridrl-0 {\\"done\\": true}")\nimport sys\nsys.exit(0)',
    "rerun without asserts": (
        "import os, sys\nif not sys.flags.optimize:\n    os.execv(sys.executable, [sys.executable, '-O', *sys.argv])\n"
        + WRONG
    ),
    "trace hook swaps the candidate": (
        "import sys\ndef swap(frame, event, arg):\n    if event == 'call' and frame.f_code.co_name == 'check':\n"
        "        frame.f_locals['c'] = lambda x: 4\nsys.settrace(swap)\n" + WRONG
    ),
    "redefined check": f"import sys\ndef check(c):\n    sys.exit(0)\n{WRONG}",
}


@pytest.mark.slow
@pytest.mark.parametrize("program", REWARD_HACKS.values(), ids=REWARD_HACKS.keys())
def test_assert_style_scores_zero_for_ending_the_run_early(program):
    """Exit status 0 is no pass: only the harness's nonce, printed after check() returned, is."""
    result = compute_score(fenced(program), ASSERT_GT)
    assert (result["score"], result["passed"]) == (0.0, 0)
    assert result["reason"].startswith("check(root):")


@pytest.mark.slow
def test_assert_style_patched_builtins_do_not_reach_the_tests():
    assert compute_score(fenced("def root(x):\n    return math.isqrt(x)"), ABS_GT)["score"] == 1.0
    hack = f"import builtins\nbuiltins.abs = lambda x: 0\n{WRONG}"
    assert compute_score(fenced(hack), ABS_GT)["score"] == 0.0


class _Recording:
    """The local sandbox, keeping what each run was given."""

    def __init__(self):
        self.runs, self.sandbox = [], LocalSandbox()

    def run(self, source, stdin="", timeout_s=None):
        self.runs.append((source, stdin))
        return self.sandbox.run(source, stdin=stdin, timeout_s=timeout_s)


@pytest.mark.slow
def test_assert_style_nonce_travels_on_stdin_not_in_the_program(monkeypatch):
    """The program finds neither the nonce in its source nor anything left on stdin."""
    recording = _Recording()
    monkeypatch.setattr(code, "current_sandbox", lambda: recording)
    program = "import sys\nassert sys.stdin.read() == ''\ndef root(x):\n    return math.isqrt(x)"
    assert compute_score(fenced(program), ASSERT_GT)["score"] == 1.0
    [(source, stdin)] = recording.runs
    assert stdin.startswith("@hybridrl-") and stdin.strip() not in source


# ------------------------------------------------------------------ empty response, bad input, sandbox failure


class _Refuse:
    def run(self, *args, **kwargs):
        raise AssertionError("the sandbox must not run for an empty response")


@pytest.mark.parametrize("response", ["", "   \n", f"{FENCE}python\n\n{FENCE}"])
def test_empty_response_scores_zero_without_running(response, monkeypatch):
    monkeypatch.setattr(code, "current_sandbox", _Refuse)
    result = compute_score(response, ADD3)
    assert (result["score"], result["passed"], result["total"]) == (0.0, 0, 3)
    assert "empty response" in result["reason"]


@pytest.mark.parametrize(
    "gt, key",
    [
        ("{not json", "not valid JSON"),
        ([1, 2], "is list, not a dict"),
        ({"inputs": ["1"]}, "no 'outputs' key"),
        ({"inputs": ["1", "2"], "outputs": ["1"]}, "['inputs'/'outputs']"),
        ({"inputs": [], "outputs": []}, "non-empty"),
        ({"inputs": [1], "outputs": ["1"]}, "['inputs'][0]"),
        ({"fn_name": "not a name", "inputs": [[1]], "outputs": [1]}, "['fn_name']"),
        ({"fn_name": "f", "inputs": [5], "outputs": [1]}, "['inputs'][0]"),
        ({"test_code": "def check(c): pass"}, "['entry_point']"),
        ({"entry_point": "f"}, "['test_code']"),
        ({"answer": "4"}, "its keys: ['answer']"),
    ],
)
def test_malformed_ground_truth_names_the_key(gt, key):
    with pytest.raises(CodeGroundTruthError) as info:
        compute_score("print(1)", gt)
    message = str(info.value)
    assert key in message and "\n" not in message and message.startswith("code ground_truth")


def test_parquet_arrays_are_accepted_as_lists():
    tests = parse_ground_truth(
        {"fn_name": "f", "inputs": np.array([np.array([1]), np.array([2])], dtype=object), "outputs": np.array([1, 2])}
    )
    assert tests.inputs == ([1], [2]) and tests.outputs == (1, 2)


def test_sandbox_failure_raises_instead_of_scoring(monkeypatch):
    class Broken:
        def run(self, source, stdin="", timeout_s=None):
            return SandboxResult("sandbox_error", None, "", "", 0.0, "namespaces unavailable")

    monkeypatch.setattr(code, "current_sandbox", Broken)
    with pytest.raises(CodeSandboxError, match="namespaces unavailable"):
        compute_score("print(1)", {"inputs": ["1"], "outputs": ["1"]})


def test_verls_code_sets_score_a_float_and_the_manager_keeps_the_details(monkeypatch):
    """verl's default_compute_score gives a float for codecontests / apps / codeforces / taco (its
    prime_code, continuous: the first 10 cases); hybridrl's reward manager still logs passed /
    total / reason. The sandbox run is stubbed: 9 of the first 10 of 11 cases pass (verl's sample)."""
    from hybridrl.rewards import compute_score_details

    gt = {"inputs": [f"{i}\n" for i in range(11)], "outputs": [f"{i}\n" for i in range(11)]}
    monkeypatch.setattr(code, "run_stdio_cases", lambda program, tests, n, stop_at_failure: (n - 1, "case 4 of 10: x"))
    for source in ("codecontests", "apps", "codeforces", "taco"):
        score = default_compute_score(source, "print(input())", gt)
        assert type(score) is float and score == pytest.approx(0.9)
    details = compute_score_details("codecontests", "print(input())", gt)
    assert details == {"score": pytest.approx(0.9), "passed": 9, "total": 10, "reason": "case 4 of 10: x"}
    assert default_compute_score("code_tasks", "print(input())", gt)["passed"] == 9  # hybridrl's own set: details

    from hybridrl.rewards import register_scorer

    register_scorer("codecontests")(lambda s, g: {"score": 1.0, "mine": 1})  # a user's scorer: as it answers
    try:
        assert default_compute_score("codecontests", "x", gt) == {"score": 1.0, "mine": 1}
    finally:
        from hybridrl.rewards import SCORERS

        SCORERS.unregister("codecontests")
        SCORERS.register_lazy("codecontests", "hybridrl.rewards.code:compute_score_continuous", score_only=True)
