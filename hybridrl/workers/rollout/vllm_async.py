"""Rollout with vLLM's async engine (``rollout.mode=async``): one request per sequence and turn,
each answered as soon as it is done.

The agent loops (``hybridrl.agents``) send every turn of every sample as its own request
(:meth:`AsyncVLLMRollout.agenerate`), concurrently: vLLM's scheduler batches whatever is in
flight, a finished sample leaves the batch at once, and a long multi-turn episode holds no one
back. ``generate_sequences`` sends the rows of a batch the same way.

vLLM 0.32's ``AsyncLLM`` always runs its engine core in a child process, so unlike the
colocated engine (:mod:`.vllm`) weights cannot be handed over as tensors of this process. On a
GPU they go by CUDA IPC handles through vLLM's weight-transfer API (:mod:`.cuda_ipc`): the engine
reads them from the GPU memory of this process (and of its TP group's ranks), one bucket at a
time. On the CPU, or when ``HYBRIDRL_ASYNC_WEIGHTS_DIR`` names a folder, ``sync_weights`` writes
them as bucket-sized safetensors files into a folder in RAM (``/dev/shm`` where there is one) and
the engine reloads them in place from there (``reload_weights(weights_path=...)``,
:mod:`.weight_files`). Being its own process, the engine also runs beside a
trainer that uses ``torch.distributed``: with ``trainer.backend=ray`` and N workers each rank
starts its own engine on its share of the batch.

The client runs on an event loop of its own, in a daemon thread of the worker, so it outlives
the short event loops of the agent manager. Every wait on the engine has a deadline
(``rollout.engine_timeout_s``) and says what it waited for; a dead engine process is a
:class:`RolloutEngineError` naming it, never a hang: every wait checks the engine process once a
second (:data:`WATCH_S`) and stops within seconds of its death, with its exit code or signal. The
engine process also dies with the thread that started it (the client's), so a driver killed with
kill -9 leaves no engine behind (:mod:`.engine_watch`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Iterable

import torch

from hybridrl.workers.rollout import cuda_ipc
from hybridrl.workers.rollout.base import (
    RolloutEngineError,
    SampledIds,
    policy_weights,
    register_rollout,
    resolve_sampling,
)
from hybridrl.workers.rollout.engine_watch import engine_death, engine_dies_with_parent
from hybridrl.workers.rollout.vllm import (
    VLLMRollout,
    engine_error_text,
    hidden_unscannable_globals,
    sampled_ids,
    write_model_folder,
)
from hybridrl.workers.rollout.weight_files import (
    FOLDER_PREFIX,
    WEIGHTS_DIR_ENV,
    bucket_bytes,
    drop_weight_files,
    ram_dir,
    sweep_orphan_folders,
    weight_buckets,
    write_weights_file,
)

DEFAULT_ENGINE_TIMEOUT_S = 900.0
WATCH_S = 1.0  # how often a wait on the engine checks that its process lives


@contextlib.contextmanager
def _child_env(threads: int | None, extra: dict[str, str] | None = None):
    """Environment the engine process is spawned with: ``spawn`` (forking a process that runs
    OpenMP and an event-loop thread is unsafe), ``rollout.cpu_threads`` OpenMP threads, and
    ``extra`` (the weight transport's)."""
    settings = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn", **(extra or {})}
    if threads:
        settings["OMP_NUM_THREADS"] = str(int(threads))
    before = {key: os.environ.get(key) for key in settings}
    for key, value in settings.items():
        if key == "VLLM_WORKER_MULTIPROC_METHOD" and before[key]:
            continue  # the user's choice
        os.environ[key] = value
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _shutdown(state: dict) -> None:
    """Stops the engine of a rollout's ``__dict__``: vLLM's shutdown runs on the client's loop
    (its sockets are closed there; left open, zmq would block the interpreter's exit), then the
    loop stops. Dropping the last reference here, while the interpreter is whole, keeps
    ``AsyncLLM.__del__`` from running again at exit, when it fails."""
    llm, loop, thread = state.pop("llm", None), state.get("_loop"), state.get("_thread")
    if llm is not None:
        with contextlib.suppress(Exception):
            if loop is not None and loop.is_running():
                asyncio.run_coroutine_threadsafe(_shutdown_in_loop(llm), loop).result(timeout=60)
            else:
                llm.shutdown()
        del llm
    if loop is not None and thread is not None:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


async def _shutdown_in_loop(llm) -> None:
    llm.shutdown()
    await asyncio.sleep(0)  # the cancelled output handler finishes


@register_rollout("vllm", mode="async")
class AsyncVLLMRollout(VLLMRollout):
    """vLLM's ``AsyncLLM`` behind the :class:`BaseRollout` contract, plus :meth:`agenerate` for
    the agent loops. Sampling, log-probs, keys and errors are those of :class:`VLLMRollout`;
    ``rollout.engine_timeout_s`` (default 900) bounds every wait on the engine.

    Raises (at construction):
        RolloutEngineError: vLLM missing, or no engine within the deadline.
        EngineStartError (a RolloutEngineError): vLLM refused to start, as for
            :class:`VLLMRollout`: its own reason and the rollout keys to change.
    """

    def __init__(self, actor_module: torch.nn.Module, config, tokenizer, generation_config=None, tp_group=None):
        """As :class:`VLLMRollout`; ``tp_group``: the process group of the TP group whose GPUs the
        engine spans (``tensor_model_parallel_size`` > 1), whose ranks hand it their weights too."""
        self.tp_group = tp_group
        super().__init__(actor_module, config, tokenizer, generation_config)

    def _start(self, actor_module: torch.nn.Module, base: torch.nn.Module) -> None:
        """Starts the engine process from the actor's weights: by CUDA IPC into dummy weights on a
        GPU (:mod:`.cuda_ipc`), else from bucket-sized files in RAM (:mod:`.weight_files`)."""
        self.timeout_s = float(self.config.engine_timeout_s)
        self.bucket_bytes = bucket_bytes(self.config)
        # by IPC the handles must cover every GPU of the engine: this rank's, or its TP group's
        self.ipc = cuda_ipc.serves(self.device) and (self.tp_size == 1 or self.tp_group is not None)
        self.ipc_bytes = cuda_ipc.buffer_bytes(self.bucket_bytes, actor_module, self.dtype)
        sweep_orphan_folders(ram_dir())
        # by IPC the folder holds only the config and tokenizer: no need for RAM
        folder_parent = None if self.ipc else ram_dir()
        self._folder = tempfile.TemporaryDirectory(prefix=f"{FOLDER_PREFIX}{os.getpid()}-", dir=folder_parent)
        write_model_folder(base, self.tokenizer, self._folder.name, weights=False)
        if not self.ipc:  # one bucket in this process at a time
            buckets = weight_buckets(policy_weights(actor_module, everything=True), self.bucket_bytes, self.dtype)
            for i, bucket in enumerate(buckets):
                write_weights_file(self._folder.name, bucket, self.dtype, f"model-{i:05d}.safetensors")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="hybridrl-vllm-async", daemon=True)
        self._thread.start()
        try:
            self._call(self._astart(), "the vLLM engine process to start", "starting")
            drop_weight_files(self._folder.name)
        except (ValueError, RuntimeError, TypeError, NotImplementedError) as exc:
            if isinstance(exc, RolloutEngineError):
                raise
            raise self._start_error(exc) from exc
        self._finalizer = weakref.finalize(self, _shutdown, self.__dict__)  # also at exit
        if self.ipc:
            self.load_weights(policy_weights(actor_module, everything=True))

    async def _astart(self) -> None:
        """Builds the client on the engine's event loop, generates one token (see ``_build_engine``)
        and, for CUDA IPC, opens the engine's side of the transfer."""
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        kwargs = self._engine_kwargs("dummy" if self.ipc else "safetensors")
        args = AsyncEngineArgs(**({**kwargs, **cuda_ipc.ENGINE_KWARGS} if self.ipc else kwargs))
        env = cuda_ipc.ENGINE_ENV if self.ipc else None
        with _child_env(self.cpu_threads, env), hidden_unscannable_globals(), engine_dies_with_parent():
            self.llm = AsyncLLM.from_engine_args(args)
        await self._one({"prompt_token_ids": [self.eos_token_ids[0]]}, self.vllm.SamplingParams(max_tokens=1))
        if self.ipc:
            from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

            await self.llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info=cuda_ipc.INIT_INFO))

    def shutdown(self) -> None:
        """Stops the engine process and the client's event loop (also done when garbage-collected)."""
        self._finalizer()

    # ------------------------------------------------------------------ waiting with deadlines
    def _call(self, coro, what: str, doing: str = "generating"):
        """Runs ``coro`` on the engine's loop and waits at most ``engine_timeout_s`` for it,
        checking every :data:`WATCH_S` that the engine process lives.

        Args:
            what: what the wait is for, in the timeout's message.
            doing: what the engine was doing, in the message of its death.
        """
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                return future.result(max(0.0, min(WATCH_S, deadline - time.monotonic())))
            except concurrent.futures.TimeoutError:
                death = self._engine_death()
                if death is None and time.monotonic() < deadline:
                    continue
                future.cancel()
                raise (self._died(doing, death) if death else self._timeout(what)) from None

    async def _await(self, future: concurrent.futures.Future, what: str, doing: str = "generating"):
        """:meth:`_call`'s wait from another event loop (the agent loops')."""
        waited = asyncio.wrap_future(future)
        deadline = time.monotonic() + self.timeout_s
        try:
            while True:
                done, _ = await asyncio.wait({waited}, timeout=max(0.0, min(WATCH_S, deadline - time.monotonic())))
                if done:
                    return waited.result()
                death = self._engine_death()
                if death is not None:
                    raise self._died(doing, death)
                if time.monotonic() >= deadline:
                    raise self._timeout(what)
        finally:
            future.cancel()  # no-op once done

    def _engine_death(self) -> str | None:
        """None while the engine process lives (or is still being built); else how it died."""
        llm = self.__dict__.get("llm")
        return None if llm is None else engine_death(llm)

    def _timeout(self, what: str) -> RolloutEngineError:
        return RolloutEngineError(
            f"vLLM async engine: no answer within actor_rollout_ref.rollout.engine_timeout_s={self.timeout_s:g} s "
            f"while waiting for {what}; raise the deadline for long generations, or check the engine process"
        )

    def _dead(self, exc: Exception, doing: str) -> RolloutEngineError:
        """:meth:`_died` for an ``EngineDeadError`` caught while ``doing`` (used by :mod:`.stream`)."""
        return self._died(doing)

    def _died(self, doing: str, death: str | None = None) -> RolloutEngineError:
        death = death or self._engine_death() or "vLLM reports its engine core dead"
        return RolloutEngineError(
            f"vLLM async engine: its process died while {doing} ({death}); the lines above from EngineCore say "
            "why (often memory: lower rollout.kv_cache_memory_gb or max_num_seqs, or a kill by the OOM killer: "
            "see dmesg); the run cannot go on with this engine: restart it (from the last checkpoint)"
        )

    async def _one(self, request: dict, params):
        """The final ``RequestOutput`` of one request (runs on the engine's loop)."""
        from vllm.v1.engine.exceptions import EngineDeadError

        final = None
        try:
            async for output in self.llm.generate(request, params, request_id=uuid.uuid4().hex):
                final = output
        except EngineDeadError:
            raise self._died("generating") from None
        return final

    # ------------------------------------------------------------------ weights and memory
    @torch.no_grad()
    def sync_weights(self, actor_module: torch.nn.Module, everything: bool = False) -> None:
        """Hands the actor's weights to the engine process in buckets of
        ``rollout.checkpoint_engine.update_weights_bucket_megabytes`` (a collective when the actor is
        FSDP-sharded: every rank calls this), and resets its prefix cache. At most one bucket of
        gathered tensors is held at a time: on the GPU (CUDA IPC) or in RAM (files)."""
        self.load_weights(policy_weights(actor_module, everything))

    @torch.no_grad()
    def load_weights(self, weights: dict[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> None:
        """Loads ``weights`` (parameter name -> tensor, all or some of the model's, as a dict or as
        pairs) into the engine process bucket by bucket, by CUDA IPC (:mod:`.cuda_ipc`) or through
        the folder in RAM (:func:`~.weight_files.weight_buckets`), then resets its prefix cache.

        Raises:
            RolloutEngineError: a tensor larger than a bucket (naming the key), no room in RAM for a
                bucket, the engine refused a bucket, or it died or missed its deadline while loading one.
        """
        self._wake_up()
        pairs = weights.items() if isinstance(weights, dict) else weights
        if self.ipc:
            self._load_by_ipc(pairs)
        else:
            for bucket in weight_buckets(pairs, self.bucket_bytes, self.dtype):
                write_weights_file(self._folder.name, bucket, self.dtype)
                self._call(self._reload(), "the engine to reload the weights", "reloading weights")
                drop_weight_files(self._folder.name)
        self._call(self._reset_prefix_cache(), "the engine to reset its prefix cache", "reloading weights")

    def _load_by_ipc(self, pairs: Iterable[tuple[str, torch.Tensor]]) -> None:
        """One weight update of vLLM's IPC engine: start, a bucket per call, finish; the buffer
        goes back to this process's allocator once the engine has closed its handle."""
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        llm, started = self.llm, False
        for info in cuda_ipc.update_infos(pairs, self.dtype, self.ipc_bytes, self.tp_group):
            try:  # started with the first bucket, so that a TP group's ranks hear of its failure too
                if not started:
                    self._ipc_step(llm.start_weight_update(), "the engine to start a weight update")
                    started = True
                what = f"the engine to load {len(info['names'])} tensors by CUDA IPC"
                self._ipc_step(llm.update_weights(WeightTransferUpdateRequest(update_info=info)), what)
            except RolloutEngineError as exc:
                cuda_ipc.share_outcome(self.tp_group, str(exc))
                raise
            cuda_ipc.share_outcome(self.tp_group, None)  # the group's ranks may now reuse their buffers
        if started:
            self._ipc_step(llm.finish_weight_update(), "the engine to finish a weight update")
        torch.cuda.ipc_collect()

    def _ipc_step(self, step, what: str) -> None:
        self._call(self._transfer(step), what, "reloading weights")

    async def _transfer(self, step) -> None:
        """Awaits one step of a CUDA IPC weight update; the engine's refusal is one line."""
        from vllm.v1.engine.exceptions import EngineDeadError

        try:
            await step
        except EngineDeadError:
            raise self._died("reloading weights") from None
        except Exception as exc:
            raise RolloutEngineError(
                f"vLLM async engine: loading the weights by CUDA IPC failed: {engine_error_text(exc)}; the engine "
                f"must run on this worker's GPU; to hand them over as files instead, set {WEIGHTS_DIR_ENV}"
            ) from exc

    async def _reload(self) -> None:
        from vllm.v1.engine.exceptions import EngineDeadError

        try:
            await self.llm.collective_rpc(
                "reload_weights", kwargs={"weights_path": self._folder.name, "is_checkpoint_format": True}
            )
        except EngineDeadError:
            raise self._died("reloading weights") from None

    async def _reset_prefix_cache(self) -> None:
        from vllm.v1.engine.exceptions import EngineDeadError

        try:
            await self.llm.reset_prefix_cache()
        except EngineDeadError:
            raise self._died("reloading weights") from None

    def _wake_up(self) -> None:
        if self.sleeping:
            self._call(self.llm.wake_up(), "the engine to wake up", "waking up")
            self.sleeping = False

    def _sleep(self) -> None:
        if self.sleep_mode and not self.sleeping:
            self._call(self.llm.sleep(level=1), "the engine to sleep", "going to sleep")
            self.sleeping = True

    # ------------------------------------------------------------------ generation
    def _generate(self, requests: list[dict], params: list) -> list:
        """All requests in flight at once; their final outputs in order."""

        async def run_all():
            return await asyncio.gather(*(self._one(r, p) for r, p in zip(requests, params)))

        return self._call(run_all(), f"{len(requests)} generation requests")

    async def agenerate(
        self,
        prompt_ids: list[int],
        sampling_kwargs: dict | None,
        max_new_tokens: int,
        stop_strings: list[str] | None = None,
    ) -> SampledIds:
        """One sequence's next turn, from any event loop: a request of its own.

        Args:
            prompt_ids: the whole context so far, unpadded.
            sampling_kwargs: ``do_sample`` / ``temperature`` / ``top_p`` / ``top_k`` overrides.
            max_new_tokens: the most ids to sample, >= 1.
            stop_strings: the turn also ends with the token that completes one of these.

        Returns:
            The new ids, up to and including EOS or the stop string's last token, with their
            log-probs under the sampling distribution.

        Raises:
            RolloutEngineError: the prompt does not fit ``max_model_len``, the engine process
                died, or no answer within ``rollout.engine_timeout_s``.
        """
        self._check_prompt_lengths([prompt_ids])
        sampling = resolve_sampling(sampling_kwargs or {}, self.config)
        params = self._sampling_params(sampling, max_new_tokens, 1, stop_strings)
        future = asyncio.run_coroutine_threadsafe(self._one({"prompt_token_ids": list(prompt_ids)}, params), self._loop)
        output = await self._await(future, f"one agent turn of {len(prompt_ids)} context tokens")
        return sampled_ids(output.outputs[0])
