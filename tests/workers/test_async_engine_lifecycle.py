"""The async vLLM engine's process lives and dies with its driver (issue 33, items 3 and 5).

- kill -9 of the driver: its ``VLLM::EngineCore`` (and the worker under it) goes within seconds
  instead of holding ~2 GB for minutes (the engine core asks the kernel for SIGTERM when the
  thread that started it dies, :mod:`hybridrl.workers.rollout.engine_watch`).
- kill -9 of the EngineCore while a call waits on it: the call stops with one
  ``RolloutEngineError`` line within seconds, not after ``engine_timeout_s``.
"""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

pytest.importorskip("vllm", reason="the vllm extra is not installed (pip install -e '.[vllm]')")
psutil = pytest.importorskip("psutil")

from vllm_helpers import TEXTS, make_prompts  # noqa: E402

from hybridrl.workers.rollout.base import RolloutEngineError  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DRIVER = textwrap.dedent(
    """
    import sys, time

    if __name__ == "__main__":  # vLLM spawns its engine: the guard keeps the child from rerunning this
        from transformers import AutoTokenizer

        from hybridrl.models import load_causal_lm
        from hybridrl.workers.rollout.vllm_async import AsyncVLLMRollout
        from tests.workers.vllm_helpers import engine_config

        model = load_causal_lm(sys.argv[1], dtype="fp32").eval()
        engine = AsyncVLLMRollout(
            model, engine_config(mode="async"), AutoTokenizer.from_pretrained(sys.argv[1]), model.generation_config
        )
        print("READY", flush=True)
        time.sleep(3600)
    """
)


def _gone_within(procs, seconds):
    """The processes of ``procs`` still alive after ``seconds`` (zombies count as gone)."""
    deadline = time.monotonic() + seconds
    while True:
        alive = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


@pytest.mark.slow
def test_the_engine_process_dies_with_a_killed_driver(vllm_model_dir, tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    driver = subprocess.Popen(
        [sys.executable, str(script), vllm_model_dir], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True
    )
    descendants = []
    try:
        lines = iter(driver.stdout.readline, "")  # up to READY, or to the end when the driver died
        assert any(line.strip() == "READY" for line in lines), f"no engine started (exit code {driver.poll()})"
        descendants = psutil.Process(driver.pid).children(recursive=True)
        engine_cores = [p for p in descendants if "EngineCore" in " ".join([p.name(), *p.cmdline()])]
        assert engine_cores, [(p.pid, p.name()) for p in descendants]
        driver.kill()  # kill -9: no atexit, no finalizer
        driver.wait(30)
        left = _gone_within(descendants, 15)
        assert not left, f"alive 15 s after the driver's kill -9: {[(p.pid, p.name()) for p in left]}"
    finally:
        driver.kill()
        for p in descendants:  # whatever a failure left behind
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass


CALLS = {  # what the engine is doing -> a call that waits on it
    "generating": lambda engine, tokenizer: engine.generate_sequences(make_prompts(tokenizer, TEXTS)),
    # a utility call: before the watch it waited for the whole engine_timeout_s (vLLM wakes no one)
    "reloading weights": lambda engine, tokenizer: engine.load_weights({}),
}


@pytest.mark.slow
@pytest.mark.parametrize("doing", list(CALLS))
def test_a_call_waiting_on_an_engine_killed_meanwhile_stops_in_seconds(async_vllm_engine, tokenizer, doing):
    """Kills the shared engine (a test after it gets a new one). SIGSTOP first holds the engine so
    the call surely waits on it; SIGKILL then ends it mid-call."""
    engine = async_vllm_engine
    saved = engine.timeout_s
    engine.timeout_s = 120  # without the watch the call would wait for this deadline
    core = engine.llm.engine_core.resources.engine_manager.processes[0]
    try:
        os.kill(core.pid, signal.SIGSTOP)
        threading.Timer(1.0, os.kill, (core.pid, signal.SIGKILL)).start()
        started = time.monotonic()
        with pytest.raises(RolloutEngineError) as err:
            CALLS[doing](engine, tokenizer)
        took = time.monotonic() - started
        message = str(err.value)
        assert "\n" not in message and took < 10, (took, message)
        assert f"EngineCore (pid {core.pid}) was killed by SIGKILL" in message, message
        assert f"died while {doing}" in message
    finally:
        engine.timeout_s = saved
        engine.shutdown()
