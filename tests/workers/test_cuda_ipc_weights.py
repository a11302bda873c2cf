"""The async engine's weights by CUDA IPC (issue 31, item 1), shown on CPU: the rollout's side of
vLLM's weight-transfer protocol against a stand-in engine that opens each bucket's buffer the way
vLLM's IPC engine does (by the handle, at the time of the call) and unpacks it with vLLM's own
``unpack_tensor``. The CUDA handles themselves need a GPU and vLLM's CUDA build."""

import asyncio
import base64
import pickle
import socket
import threading
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

pytest.importorskip("vllm", reason="the vllm extra is not installed (pip install -e '.[vllm]')")

from hybridrl.workers.rollout import cuda_ipc, vllm_async
from hybridrl.workers.rollout.base import RolloutEngineError, policy_weights
from hybridrl.workers.rollout.weight_files import BUCKET_KEY, WEIGHTS_DIR_ENV

BUFFERS: dict[int, torch.Tensor] = {}  # the live "device memory" a handle points at


def fake_ipc_producer(iterator, gpu_uuid, post_iter_func, buffer_size_bytes):
    """vLLM's ``packed_ipc_producer`` on CPU memory: one reused buffer, a chunk yielded when the
    next tensor would not fit, dtypes and shapes read off the tensors it is given."""
    buffer = torch.zeros(buffer_size_bytes, dtype=torch.uint8)
    BUFFERS[id(buffer)] = buffer
    parts: list[tuple[str, torch.Tensor]] = []

    def chunk():
        return SimpleNamespace(
            names=[n for n, _ in parts],
            shapes=[list(t.shape) for _, t in parts],
            dtype_names=[str(t.dtype).split(".")[-1] for _, t in parts],
            tensor_sizes=[t.numel() * t.element_size() for _, t in parts],
            ipc_handle={gpu_uuid: id(buffer)},
        )

    used = 0
    for name, tensor in iterator:
        flat = post_iter_func((name, tensor)).contiguous().view(-1).view(torch.uint8)
        if used and used + flat.numel() > buffer_size_bytes:
            yield chunk()
            parts, used = [], 0
        buffer[used : used + flat.numel()].copy_(flat)
        parts.append((name, tensor))
        used += flat.numel()
    if parts:
        yield chunk()


class FakeIpcEngine:
    """The calls ``AsyncLLM`` takes for a weight update, recorded; ``update_weights`` reads the
    buffer behind the handle when called, as vLLM's worker does, and keeps clones."""

    def __init__(self, refuse: str | None = None, gpu: str = "GPU-0"):
        self.gpu = gpu
        self.gpus: list[list[str]] = []  # the GPUs each bucket's handles name
        self.calls: list[str] = []
        self.loaded: dict[str, torch.Tensor] = {}
        self.bucket_bytes: list[int] = []
        self.refuse = refuse

    async def start_weight_update(self):
        self.calls.append("start")

    async def update_weights(self, request):
        from vllm.distributed.weight_transfer.packed_tensor import unpack_tensor

        info = request.update_info
        if self.refuse:
            raise ValueError(self.refuse)
        handles = pickle.loads(base64.b64decode(info["ipc_handles_pickled"]))
        self.gpus.append(sorted(handles))
        buffer_id = handles[self.gpu]  # the copy on this engine worker's GPU
        dtypes = [getattr(torch, name) for name in info["dtype_names"]]
        used = sum(info["tensor_sizes"])
        packed = BUFFERS[buffer_id][:used]
        for name, tensor in unpack_tensor(packed, info["names"], info["shapes"], dtypes, info["tensor_sizes"]):
            self.loaded[name] = tensor.clone()
        self.calls.append("update")
        self.bucket_bytes.append(used)

    async def finish_weight_update(self):
        self.calls.append("finish")

    async def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")


def tiny_model() -> LlamaForCausalLM:
    torch.manual_seed(0)  # the same weights in every process, as gathered from the shards
    shape = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4}
    config = LlamaConfig(vocab_size=64, **shape)
    return LlamaForCausalLM(config)


@pytest.fixture
def model():
    return tiny_model()


def ipc_rollout(tp_group=None):
    """An ``AsyncVLLMRollout`` set for CUDA IPC with its client loop running (its engine: set ``llm``)."""
    engine = object.__new__(vllm_async.AsyncVLLMRollout)
    engine.ipc, engine.dtype, engine.timeout_s, engine.tp_group = True, torch.bfloat16, 30.0, tp_group
    engine.sleeping, engine.sleep_mode = False, False
    engine._loop = asyncio.new_event_loop()
    threading.Thread(target=engine._loop.run_forever, daemon=True).start()
    return engine


@pytest.fixture
def rollout(monkeypatch):
    monkeypatch.setattr(cuda_ipc, "_producer", lambda: fake_ipc_producer)
    monkeypatch.setattr(cuda_ipc, "_this_gpu", lambda: (torch.device("cpu"), "GPU-0"))
    collected = []
    monkeypatch.setattr(torch.cuda, "ipc_collect", lambda: collected.append(1))
    engine = ipc_rollout()
    engine.collected = collected
    yield engine
    engine._loop.call_soon_threadsafe(engine._loop.stop)


def test_ipc_serves_cuda_unless_files_are_asked_for(monkeypatch):
    monkeypatch.delenv(WEIGHTS_DIR_ENV, raising=False)
    assert cuda_ipc.serves(torch.device("cuda", 0))
    assert not cuda_ipc.serves(torch.device("cpu"))
    monkeypatch.setenv(WEIGHTS_DIR_ENV, "/tmp")
    assert not cuda_ipc.serves(torch.device("cuda", 0))


def test_the_buffer_is_a_bucket_or_the_whole_model(model):
    whole = sum(p.numel() for p in model.parameters()) * 2  # bf16
    assert cuda_ipc.buffer_bytes(2**62, model, torch.bfloat16) == whole  # no bucket key: one bucket
    assert cuda_ipc.buffer_bytes(4096, model, torch.bfloat16) == 4096


def test_weights_reach_the_engine_bucket_by_bucket_in_its_dtype(rollout, model):
    layer_bytes = sum(p.numel() for p in model.model.layers[0].parameters()) * 2
    rollout.ipc_bytes = layer_bytes  # smaller than the model: several buckets through one buffer
    rollout.llm = FakeIpcEngine()
    rollout.load_weights(policy_weights(model, everything=True))

    calls = rollout.llm.calls
    assert calls[0] == "start" and calls[-2:] == ["finish", "reset_prefix_cache"]
    assert calls.count("update") >= 4 and calls.count("start") == calls.count("finish") == 1
    assert max(rollout.llm.bucket_bytes) <= layer_bytes
    expected = dict(policy_weights(model, everything=True))
    assert set(rollout.llm.loaded) == set(expected)
    for name, tensor in expected.items():  # each bucket was read before the buffer was reused
        assert rollout.llm.loaded[name].dtype == torch.bfloat16
        assert torch.equal(rollout.llm.loaded[name], tensor.to(torch.bfloat16)), name
    assert rollout.collected  # the buffer goes back once the engine closed its handle


def test_a_tensor_larger_than_a_bucket_names_the_key(rollout, model):
    rollout.ipc_bytes = 1024  # the embedding alone is 64 x 32 x 2 = 4096 bytes
    rollout.llm = FakeIpcEngine()
    with pytest.raises(RolloutEngineError) as err:
        rollout.load_weights(policy_weights(model, everything=True))
    msg = str(err.value)
    assert "\n" not in msg and BUCKET_KEY in msg and "embed_tokens" in msg and "raise it to at least 1" in msg


def test_an_engine_refusal_is_one_line_with_what_to_do(rollout, model):
    rollout.ipc_bytes = 2**20
    rollout.llm = FakeIpcEngine(refuse="IPC handle not found for GPU UUID GPU-1111.\nAvailable UUIDs: ['GPU-0']")
    with pytest.raises(RolloutEngineError) as err:
        rollout.load_weights(policy_weights(model, everything=True))
    msg = str(err.value)
    assert "\n" not in msg and "CUDA IPC" in msg and "GPU-1111" in msg and WEIGHTS_DIR_ENV in msg


def _tp_rank(rank: int, port: int, out_dir: str) -> None:
    """One rank of a TP group of 2 on Gloo: rank 0 leads (its engine the stand-in), rank 1 follows."""
    import os

    import torch.distributed as dist

    from hybridrl.workers.rollout.tp_group import RolloutTPGroup, TPFollowerRollout

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo")
    cuda_ipc._producer = lambda: fake_ipc_producer
    cuda_ipc._this_gpu = lambda: (torch.device("cpu"), f"GPU-{rank}")
    torch.cuda.ipc_collect = lambda: None
    model, group = tiny_model(), RolloutTPGroup(2, rank, 2)
    limit = sum(p.numel() for p in model.model.layers[0].parameters()) * 2
    if rank == 0:
        side = ipc_rollout(group.group)
        side.ipc_bytes, side.llm = limit, FakeIpcEngine()
    else:
        side = object.__new__(TPFollowerRollout)
        side.group, side.ipc, side.dtype, side.ipc_bytes = group, True, torch.bfloat16, limit
    side.sync_weights(model, everything=True)
    result = {"updates": 0}
    if rank == 0:
        result = {"updates": side.llm.calls.count("update"), "gpus": side.llm.gpus, "loaded": side.llm.loaded}
        side.llm = FakeIpcEngine(refuse="out of memory")
    try:
        side.sync_weights(model, everything=True)
        result["failure"] = ""
    except RolloutEngineError as exc:
        result["failure"] = str(exc)
    torch.save(result, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()  # else Gloo's threads may abort the process as the interpreter exits


@pytest.mark.slow
def test_a_tp_group_hands_its_engine_every_ranks_copy_and_hears_its_refusal(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.start_processes(_tp_rank, args=(port, str(tmp_path)), nprocs=2, start_method="spawn")
    leader, follower = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert leader["updates"] >= 4  # several buckets, each with the handles of both GPUs
    assert leader["gpus"] == [["GPU-0", "GPU-1"]] * leader["updates"]
    assert set(leader["loaded"]) >= {"model.embed_tokens.weight", "model.layers.2.mlp.down_proj.weight"}
    assert leader["failure"].startswith("vLLM async engine: loading the weights by CUDA IPC failed: out of memory")
    assert follower["failure"].startswith("the rollout engine of rank 0 (this rank's TP group leader) could not load")
    assert "out of memory" in follower["failure"] and "\n" not in follower["failure"]
