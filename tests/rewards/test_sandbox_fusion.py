"""The Sandbox Fusion client against a stand-in service that answers as Sandbox Fusion does."""

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hybridrl.rewards import code
from hybridrl.rewards.sandbox import SandboxFusionClient
from tests.rewards.test_code_reward import ASSERT_GT, REWARD_HACKS, fenced


class _Service(BaseHTTPRequestHandler):
    requests: list = []

    def do_POST(self):  # http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append(body)
        code = body["code"]
        if code == "crash-the-service":
            answer = {"status": "SandboxError", "message": "container failed to start", "run_result": None}
        elif code == "loop":
            answer = {
                "status": "Failed",
                "run_result": {
                    "status": "TimeLimitExceeded",
                    "return_code": None,
                    "stdout": "",
                    "stderr": "",
                    "execution_time": 3.0,
                },
            }
        elif "__hybridrl_check" in code:  # the code scorer's assert-style harness: run it (unisolated)
            run = subprocess.run(
                [sys.executable, "-I", "-c", code], input=body["stdin"], capture_output=True, text=True, timeout=30
            )
            answer = {
                "status": "Success" if run.returncode == 0 else "Failed",
                "run_result": {
                    "status": "Finished",
                    "return_code": run.returncode,
                    "stdout": run.stdout,
                    "stderr": run.stderr,
                },
            }
        elif code == "raise":
            answer = {
                "status": "Failed",
                "run_result": {
                    "status": "Finished",
                    "return_code": 1,
                    "stdout": "",
                    "stderr": "Traceback ...\nValueError: bad\n",
                },
            }
        else:  # echo stdin back, upper-cased
            answer = {
                "status": "Success",
                "run_result": {"status": "Finished", "return_code": 0, "stdout": body["stdin"].upper(), "stderr": ""},
            }
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture()
def service():
    _Service.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Service)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/run_code"
    server.shutdown()
    server.server_close()


def test_requests_carry_verls_fields_and_answers_map_to_results(service):
    client = SandboxFusionClient(service, max_concurrent=2, memory_limit_mb=512, timeout_s=7)
    result = client.run("print(input())", stdin="abc")
    assert (result.status, result.returncode, result.stdout) == ("ok", 0, "ABC")
    sent = _Service.requests[0]
    assert sent["language"] == "python" and sent["memory_limit_MB"] == 512 and sent["run_timeout"] == 7
    assert sent["code"] == "print(input())" and sent["stdin"] == "abc"
    assert client.run("loop", timeout_s=3).status == "timeout"
    failed = client.run("raise")
    assert failed.status == "error" and failed.reason == "exit code 1: ValueError: bad"
    broken = client.run("crash-the-service")
    assert broken.status == "sandbox_error" and "container failed to start" in broken.reason


def test_an_unreachable_service_is_a_sandbox_error_not_a_wrong_program(service):
    client = SandboxFusionClient("http://127.0.0.1:9/run_code", timeout_s=1)
    result = client.run("print(1)")
    assert result.status == "sandbox_error" and "Sandbox Fusion at http://127.0.0.1:9/run_code failed" in result.reason


def test_the_client_pickles_for_the_scoring_pool(service):
    import pickle

    client = pickle.loads(pickle.dumps(SandboxFusionClient(service, max_concurrent=3)))
    assert client.run("x", stdin="ok").stdout == "OK" and client.max_concurrent == 3


@pytest.mark.parametrize(
    "hack", ["sys.exit(0)", "os._exit(0)", "raise SystemExit", "excepthook exits 0", "fake success marker"]
)
def test_code_scores_from_the_nonce_in_the_services_stdout_not_its_exit_code(service, monkeypatch, hack):
    """Through the service, as locally: a run that exits 0 early scores 0, a right program 1."""
    client = SandboxFusionClient(service, timeout_s=10)
    monkeypatch.setattr(code, "current_sandbox", lambda: client)
    assert code.compute_score(fenced(REWARD_HACKS[hack]), ASSERT_GT)["score"] == 0.0
    assert code.compute_score(fenced("def root(x):\n    return math.isqrt(x)"), ASSERT_GT)["score"] == 1.0
