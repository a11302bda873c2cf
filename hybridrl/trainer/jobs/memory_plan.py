"""The memory plan: how much memory each role takes on one device, and the peak, from the model's
shape and the run's settings (``hybridrl plan``; ``hybridrl train`` prints its one-line total).

Every rank holds the same, so "per device" is any rank's (the busiest's). Sizes are in bytes in
the arithmetic and in GiB (2**30 bytes, which the tables call GB) in the result. The plan is an
estimate of what the tensors need, not of what the allocators keep: it ignores fragmentation and
CUDA's caching allocator slack, and counts glibc's freed-but-kept memory of
``trainer.cpu_malloc_reuse`` as one measured constant (:data:`CPU_MALLOC_KEPT_GB`).

What is modelled (``W`` workers, ``F`` = ``fsdp_size`` when 0 < fsdp_size < W, else W):

* **Trained roles** (actor, critic): FSDP2 shards the weights (``fsdp_config.model_dtype``, fp32),
  their gradients (same dtype) and AdamW's two moments (same dtype) 1/F. With LoRA
  (``lora_rank`` > 0) gradients and moments exist for the adapters only (``rank x (in + out)``
  per adapted linear of the decoder layers). ``param_offload`` (FSDP2's CPUOffloadPolicy, CUDA
  only) keeps the shards of weights, gradients and moments on the host; ``optimizer_offload``
  alone keeps the moments on the host outside the update (they come back for the whole update
  call, as the workers do it). On CPU the device memory
  is the host memory: offload saves nothing and is not counted.
* **Reference**: sharded 1/F in the resolved ``mixed_precision.param_dtype``; with LoRA it is the
  actor with its adapters off, no copy; ``ref.fsdp_config.param_offload`` moves it to the host.
* **Reward model**: sharded 1/F in its ``model_dtype``; forward passes only.
* **Unsharded parameters during a pass**: FSDP2 all-gathers the root unit (embeddings, final
  norm, untied head) for the whole pass and the decoder layers one at a time, plus the next one
  prefetched (all of them with ``reshard_after_forward=false``), in the param dtype; a training
  pass adds one layer's unsharded gradient (param dtype + fp32 for the reduce-scatter). One worker
  without offload runs without FSDP: autocast then keeps a param-dtype copy of every weight for
  the pass (none when the param dtype is the model dtype).
* **Activations** of one micro batch of ``T`` tokens on one device: rows at full length
  (``max_prompt_length + max_response_length``; with ``use_dynamic_bsz`` the token budget), an
  upper bound with or without padding removal; divided by the Ulysses SP size. Per token and
  layer autograd keeps ``c (2h + 2q + 2kv + 4i) + 2h r + 8h`` bytes (c: param-dtype bytes, r:
  the residual stream's; h, q, kv, i: hidden, query, key/value and MLP widths; the 8h: RMSNorm's
  fp32 upcasts). With gradient checkpointing only each layer's input stays (``L T h r``) plus
  one layer recomputed and the gradients through it; without it every layer's tensors. A
  forward-only pass holds one layer's widest moment (``c max(3i, 2q + 2kv) + 2h r + 8h`` per
  token). The attention mask adds ``T x row length`` bytes.
* **Logits**: the head runs on the response tokens only (``N``): a forward holds the head's
  output and its fp32 copy (``N V (c + 4)`` bytes), a training pass the fp32 logits and their
  fp32 gradient (``8 N V``), +4 per element when the temperature is not 1 or the entropy has a
  gradient; with ``entropy_from_logits_with_chunking`` one chunk of ``LOGITS_CHUNK_ELEMENTS / V``
  tokens at a time.
* **Rollout**: the HF engine keeps an unsharded copy in ``rollout.dtype`` and, while generating
  ``rollout.micro_batch_size`` sequences at a time (at most its share of the batch), a KV cache
  of ``mb (P + R) L 2 kv c`` bytes plus one layer's prefill of the prompts and the last token's
  logits and probabilities (fp32). vLLM on CUDA takes
  ``gpu_memory_utilization`` of the device (or its weights + ``kv_cache_memory_gb``) while it
  generates (the plan does not fit when that share cannot hold the weights), and keeps it between
  generations unless ``free_cache_engine``; vLLM on CPU keeps
  its weights and KV cache (``kv_cache_memory_gb``, 1 GiB by default). A weight sync moves one
  bucket (``checkpoint_engine.update_weights_bucket_megabytes``) at a time.
* **Process baseline**: the CUDA context, or on CPU the worker process's own resident memory,
  plus, with ``trainer.cpu_malloc_reuse``, the freed blocks glibc keeps (``malloc_kept``).

**Phases.** What stays resident (baseline, sharded weights and moments, the rollout copy) is on
the device all the time; generation, each log-prob/value pass, each update and each optimizer
step add their own tensors at different times. The peak is the largest phase::

    peak = resident + max(generate, old_log_prob, ref_log_prob, teacher_log_prob, values, reward_model,
                          update_critic, critic_step, update_actor, actor_step)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hybridrl.models.output_head import LOGITS_CHUNK_ELEMENTS
from hybridrl.trainer.jobs.model_shape import ModelShape

__all__ = [
    "PHASES",
    "GiB",
    "MemoryPlan",
    "Pass",
    "PlanInputs",
    "Role",
    "Rollout",
    "activation_bytes",
    "forward_layer_bytes",
    "gathered_bytes",
    "kv_cache_bytes",
    "layer_activation_bytes",
    "logits_bytes",
    "make_plan",
    "one_line",
]

GiB = float(1 << 30)
RESIDENT = "resident"
PHASES = (
    "generate",
    "old_log_prob",
    "ref_log_prob",
    "teacher_log_prob",
    "values",
    "reward_model",
    "update_critic",
    "critic_step",
    "update_actor",
    "actor_step",
)
# Process baselines, GiB. CPU: measured as VmRSS of a Python 3.11 process after importing torch
# 2.13 (CPU build), transformers 5.19 and hybridrl.workers.fsdp_workers and running a forward,
# backward and AdamW step of a 2-layer Llama of hidden size 64 under bf16 autocast: 0.46 GiB, 0.49
# GiB with ray imported (3 runs alike, AMD EPYC, Linux). CUDA: not measured here (no GPU on the
# development machines); the CUDA context with cuBLAS/NCCL workspaces usually takes 0.5-1 GiB, and
# the upper end is taken.
CPU_PROCESS_BASELINE_GB = 0.49
CUDA_PROCESS_BASELINE_GB = 1.0
# What glibc keeps resident with trainer.cpu_malloc_reuse (freed memory held for
# reuse), GiB: measured peaks of benchmarks/scale.py were 0.42-0.75 GiB above the plan without it
# over six runs (SmolLM2-135M and 360M shapes, 1 and 2 workers, with and without gradient
# checkpointing; AMD EPYC, docs/scale.md), mean 0.56; 0.65-0.74 GiB on one worker, where every
# freed block is kept (SmolLM2-135M and 360M shapes). It does not grow with the model: the kept
# blocks are the ones each micro batch allocates again.
CPU_MALLOC_KEPT_GB = 0.5


@dataclass(frozen=True)
class Pass:
    """One forward (``train=False``) or forward+backward pass over a micro batch on one device:
    ``tokens`` (after SP), ``logit_tokens`` projected on the vocabulary (0 for a scalar head),
    ``row_len`` tokens per packed or padded row, ``chunked`` logits, ``extra_logit_bytes`` per
    logit element (temperature copy, entropy with a gradient)."""

    tokens: int
    logit_tokens: int = 0
    row_len: int = 1
    train: bool = False
    chunked: bool = False
    extra_logit_bytes: int = 0


@dataclass(frozen=True)
class Role:
    """A model on every worker. ``params`` its parameter count, ``weight_bytes`` per parameter as
    held, ``compute_bytes`` the param dtype's, ``shard`` the FSDP divisor F, ``trainable``
    parameters with gradients and moments (0: frozen), ``fsdp`` whether FSDP2 wraps it (else
    autocast copies), ``own_copy`` False when it runs on another role's weights (the LoRA
    reference: the actor with its adapters off)."""

    shape: ModelShape
    params: int
    weight_bytes: float
    compute_bytes: int
    shard: int = 1
    trainable: int = 0
    param_offload: bool = False
    optimizer_offload: bool = False
    checkpointing: bool = True
    reshard_after_forward: bool = True
    fsdp: bool = True
    own_copy: bool = True
    passes: dict = field(default_factory=dict)  # phase name -> Pass


@dataclass(frozen=True)
class Rollout:
    """The generation engine on every worker: ``engine`` ``hf`` | ``vllm``, ``dtype_bytes`` of its
    copy, ``micro_batch`` sequences generated at once (HF), ``prompt_len`` + ``response_len``
    tokens each, ``vllm_gb`` what vLLM takes (GiB), ``vllm_sleeps`` between generations, the sync
    ``bucket_mb`` (MiB)."""

    shape: ModelShape
    params: int
    engine: str
    dtype_bytes: int
    micro_batch: int
    prompt_len: int
    response_len: int
    bucket_mb: float
    vllm_gb: float = 0.0
    vllm_sleeps: bool = False

    @property
    def weights_gb(self) -> float:
        """The engine's copy of the weights, GiB: ``params x dtype_bytes``."""
        return self.params * self.dtype_bytes / GiB

    @property
    def vllm_too_small(self) -> bool:
        """vLLM's share of the device cannot even hold the weights (no room for a KV cache)."""
        return self.engine == "vllm" and self.weights_gb >= self.vllm_gb


@dataclass(frozen=True)
class PlanInputs:
    """Everything the arithmetic reads; built from a run's config by :mod:`hybridrl.trainer.jobs.plan_config`."""

    device: str
    workers: int
    device_memory_gb: float
    baseline_gb: float
    actor: Role
    rollout: Rollout
    reference: Role | None = None
    critic: Role | None = None
    reward_model: Role | None = None
    teachers: tuple = ()  # (name, Role) of each distillation teacher
    notes: tuple = ()
    malloc_kept_gb: float = 0.0  # CPU_MALLOC_KEPT_GB when glibc keeps freed blocks (cpu_malloc_reuse)


@dataclass
class MemoryPlan:
    """The plan's result, GiB. ``roles``: ``{role: {component: GiB}}``, each component's size on
    the device while it is there, and ``when``: ``{role: {component: "resident" or the phases}}``;
    ``phases``: the device total of each phase; ``host_gb``: what offload keeps on the host, per
    role; ``suggestions``: what :func:`hybridrl.trainer.jobs.plan_cli.suggest` found."""

    per_device_gb: float
    peak_phase: str
    device_memory_gb: float
    fits: bool
    roles: dict
    phases: dict
    peak_by_role: dict
    host_gb: dict
    when: dict
    device: str
    workers: int
    model: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    suggestions: list = field(default_factory=list)


def layer_activation_bytes(
    shape: ModelShape, tokens: int, compute_bytes: int, residual_bytes: int | None = None
) -> float:
    """Bytes autograd keeps for one decoder layer over ``tokens`` tokens:
    ``tokens x (c (2h + 2q + 2kv + 4i) + 2h r + 8h)`` (c = ``compute_bytes``, r =
    ``residual_bytes``, the residual stream's dtype, c by default): the norms' inputs (r), their
    fp32 upcasts (4 bytes) and outputs cast for the matmuls (c), q/k/v and the attention output,
    the MLP's gate, up, activation and product (c)."""
    h, i = shape.hidden_size, shape.intermediate_size
    r = compute_bytes if residual_bytes is None else residual_bytes
    per_token = compute_bytes * (2 * h + 2 * shape.q_dim + 2 * shape.kv_dim + 4 * i) + 2 * h * r + 8 * h
    return float(tokens) * per_token


def forward_layer_bytes(shape: ModelShape, tokens: int, compute_bytes: int, residual_bytes: int | None = None) -> float:
    """Bytes of one decoder layer's widest moment in a forward without autograd, over ``tokens``
    tokens: ``tokens x (c max(3i, 2q + 2kv) + 2h r + 8h)``: the MLP's three intermediate tensors
    or the attention's q, k, v and output, beside the residual, the normed input and its fp32 upcast."""
    h, i = shape.hidden_size, shape.intermediate_size
    r = compute_bytes if residual_bytes is None else residual_bytes
    widest = max(3 * i, 2 * shape.q_dim + 2 * shape.kv_dim)
    return float(tokens) * (compute_bytes * widest + 2 * h * r + 8 * h)


def activation_bytes(
    shape: ModelShape, step: Pass, compute_bytes: int, checkpointing: bool, residual_bytes: int | None = None
) -> float:
    """Bytes of a pass's decoder activations on one device (without the logits), ``T`` tokens:

    * forward only: one layer's widest moment (:func:`forward_layer_bytes`);
    * training with gradient checkpointing: every layer's input (``L T h r``), one layer
      recomputed, and the gradients through its widest tensors (``T (2i + 2h) c``);
    * training without it: every layer's tensors and those gradients;

    plus the attention mask (``T x row_len`` bytes, bool). ``r`` (``residual_bytes``) is the
    residual stream's dtype: the param dtype under FSDP2's mixed precision, the model dtype under
    autocast on one worker."""
    r = compute_bytes if residual_bytes is None else residual_bytes
    mask = float(step.tokens) * step.row_len
    if not step.train:
        return forward_layer_bytes(shape, step.tokens, compute_bytes, r) + mask
    layer = layer_activation_bytes(shape, step.tokens, compute_bytes, r)
    hidden = float(step.tokens) * shape.hidden_size * r
    grads = float(step.tokens) * (2 * shape.intermediate_size + 2 * shape.hidden_size) * compute_bytes
    if checkpointing:
        return shape.num_hidden_layers * hidden + layer + grads + mask
    return shape.num_hidden_layers * layer + grads + mask


def logits_bytes(
    shape: ModelShape, step: Pass, compute_bytes: int, chunk_elements: int = LOGITS_CHUNK_ELEMENTS
) -> float:
    """Bytes of the (tokens x vocab) logits of a pass for ``N`` response tokens, ``N V b``: a
    forward holds the head's output and its fp32 copy (``b = c + 4``; 4 in fp32), a training
    pass the fp32 logits kept for backward and their fp32 gradient (``b = 8``), plus
    ``extra_logit_bytes``; when chunked, one chunk of ``chunk_elements / V`` tokens at a time
    (plus the ``N x h`` hidden states the chunks are projected from)."""
    if step.logit_tokens <= 0:
        return 0.0
    forward = 4 + (compute_bytes if compute_bytes < 4 else 0)
    per_element = (max(forward, 8) if step.train else forward) + step.extra_logit_bytes
    tokens = step.logit_tokens
    kept = 0.0
    if step.chunked:
        tokens = min(tokens, max(1, chunk_elements // shape.vocab_size))
        kept = float(step.logit_tokens) * shape.hidden_size * compute_bytes
    return float(tokens) * shape.vocab_size * per_element + kept


def kv_cache_bytes(shape: ModelShape, sequences: int, seq_len: int, dtype_bytes: int) -> float:
    """Bytes of a KV cache for ``sequences`` of ``seq_len`` tokens: ``n s L 2 kv_heads head_dim c``."""
    return float(sequences) * seq_len * shape.num_hidden_layers * 2 * shape.kv_dim * dtype_bytes


def gathered_bytes(role: Role, train: bool) -> float:
    """Bytes of unsharded parameters during a pass: FSDP2's gathered root unit plus two decoder
    layers in flight (every layer without ``reshard_after_forward``), and in training one layer's
    unsharded gradient (param dtype + fp32); without FSDP, autocast's param-dtype copy of every
    weight (0 when the param dtype is the model dtype)."""
    shape, c = role.shape, role.compute_bytes
    if not role.fsdp:
        return float(role.params) * c if c != role.weight_bytes else 0.0
    layers = shape.num_hidden_layers if not role.reshard_after_forward else min(2, shape.num_hidden_layers)
    gathered = (shape.root_params() + layers * shape.layer_params()) * c
    if train:
        gathered += shape.layer_params() * (c + 4)
    return float(gathered)


def _trained_role_items(name: str, role: Role, update: str, step: str, forward: str | None, on_cuda: bool):
    """``(role, component, bytes, phases)`` of a trained role (actor or critic)."""
    offload = role.param_offload and on_cuda
    moments_away = (role.optimizer_offload and on_cuda) or offload
    weights = role.params * role.weight_bytes / role.shard
    grads = role.trainable * role.weight_bytes / role.shard
    moments = 2 * role.trainable * role.weight_bytes / role.shard
    items = [
        (name, "weights", 0.0 if offload else weights, (RESIDENT,)),
        (name, "gradients", 0.0 if offload else grads, (update, step)),
        (name, "optimizer_states", 0.0 if offload else moments, (update, step) if moments_away else (RESIDENT,)),
        # torch's AdamW (foreach) holds one fp32 temporary the size of the trainable shard in
        # its step (measured: +256 MB for 256 MB of parameters; the fused kernel needs none)
        (name, "optimizer_step_temporaries", 0.0 if offload else role.trainable * 4 / role.shard, (step,)),
    ]
    host = (
        {"weights": weights, "gradients": grads, "optimizer_states": moments}
        if offload
        else ({"optimizer_states": moments} if moments_away else {})
    )
    items += _pass_items(name, role, update, prefix="")
    if forward:
        items += _pass_items(name, role, forward, prefix=f"{forward}_")
    return items, host


def _pass_items(name: str, role: Role, phase: str, prefix: str):
    step = role.passes[phase]
    residual = role.compute_bytes if role.fsdp else int(role.weight_bytes)  # autocast keeps the model dtype
    return [
        (name, f"{prefix}gathered_params", gathered_bytes(role, step.train), (phase,)),
        (
            name,
            f"{prefix}activations",
            activation_bytes(role.shape, step, role.compute_bytes, role.checkpointing, residual),
            (phase,),
        ),
        (name, f"{prefix}logits", logits_bytes(role.shape, step, role.compute_bytes), (phase,)),
    ]


def _frozen_role_items(name: str, role: Role, phase: str, on_cuda: bool):
    offload = role.param_offload and on_cuda
    weights = role.params * role.weight_bytes / role.shard if role.own_copy else 0.0
    items = [(name, "weights", 0.0 if offload else weights, (RESIDENT,))] + _pass_items(name, role, phase, prefix="")
    return items, ({"weights": weights} if offload and weights else {})


def _rollout_items(rollout: Rollout, on_cuda: bool):
    shape = rollout.shape
    bucket = rollout.bucket_mb * (1 << 20)
    if rollout.engine == "vllm":
        engine = max(rollout.vllm_gb, rollout.weights_gb) * GiB
        when = ("generate",) if (on_cuda and rollout.vllm_sleeps) else (RESIDENT,)
        return [
            ("rollout", "engine_weights_and_kv_cache", engine, when),
            ("rollout", "weight_sync_bucket", bucket, ("generate",)),
        ]
    mb, seq = rollout.micro_batch, rollout.prompt_len + rollout.response_len
    prefill = forward_layer_bytes(shape, mb * rollout.prompt_len, rollout.dtype_bytes)
    last_logits = 2.0 * mb * shape.vocab_size * 4
    return [
        ("rollout", "weights", float(rollout.params) * rollout.dtype_bytes, (RESIDENT,)),
        ("rollout", "kv_cache", kv_cache_bytes(shape, mb, seq, rollout.dtype_bytes), ("generate",)),
        ("rollout", "activations", prefill + last_logits, ("generate",)),
        ("rollout", "weight_sync_bucket", bucket, ("generate",)),
    ]


def plan_items(inputs: PlanInputs) -> tuple[list, dict]:
    """Every ``(role, component, bytes, phases)`` on one device, and the offloaded bytes per role."""
    on_cuda = inputs.device == "cuda"
    items = [("process", "baseline", inputs.baseline_gb * GiB, (RESIDENT,))]
    if inputs.malloc_kept_gb:
        items.append(("process", "malloc_kept", inputs.malloc_kept_gb * GiB, (RESIDENT,)))
    host = {}
    actor_items, host["actor"] = _trained_role_items(
        "actor", inputs.actor, "update_actor", "actor_step", "old_log_prob", on_cuda
    )
    items += actor_items + _rollout_items(inputs.rollout, on_cuda)
    if inputs.reference is not None:
        ref_items, host["reference"] = _frozen_role_items("reference", inputs.reference, "ref_log_prob", on_cuda)
        items += ref_items
    for name, teacher in inputs.teachers:  # distillation: frozen like the reference, one pass each step
        teacher_items, host[name] = _frozen_role_items(name, teacher, "teacher_log_prob", on_cuda)
        items += teacher_items
    if inputs.critic is not None:
        critic_items, host["critic"] = _trained_role_items(
            "critic", inputs.critic, "update_critic", "critic_step", "values", on_cuda
        )
        items += critic_items
    if inputs.reward_model is not None:
        rm_items, host["reward_model"] = _frozen_role_items(
            "reward_model", inputs.reward_model, "reward_model", on_cuda
        )
        items += rm_items
    return items, {role: parts for role, parts in host.items() if parts}


def make_plan(inputs: PlanInputs) -> MemoryPlan:
    """The plan of ``inputs``: components per role, the total of each phase, the peak and whether
    it fits ``inputs.device_memory_gb`` (all GiB)."""
    items, host = plan_items(inputs)
    roles: dict = {}
    when_of: dict = {}
    for role, component, size, phases_of in items:
        roles.setdefault(role, {})[component] = size / GiB
        when_of.setdefault(role, {})[component] = ",".join(phases_of)
    resident = sum(size for _, _, size, when in items if RESIDENT in when)
    phases = {
        phase: (resident + sum(size for _, _, size, when in items if phase in when)) / GiB
        for phase in PHASES
        if any(phase in when for *_, when in items)
    }
    peak_phase = max(phases, key=phases.get)
    by_role: dict = {}
    for role, _, size, when in items:
        if RESIDENT in when or peak_phase in when:
            by_role[role] = by_role.get(role, 0.0) + size / GiB
    peak = phases[peak_phase]
    notes = list(inputs.notes)
    if inputs.rollout.vllm_too_small:
        notes.append(
            f"vLLM's share of the device ({inputs.rollout.vllm_gb:.1f} GB) cannot hold the weights "
            f"({inputs.rollout.weights_gb:.1f} GB) and a KV cache: it does not start"
        )
    return MemoryPlan(
        per_device_gb=peak,
        peak_phase=peak_phase,
        device_memory_gb=inputs.device_memory_gb,
        fits=peak <= inputs.device_memory_gb and not inputs.rollout.vllm_too_small,
        roles=roles,
        phases=phases,
        peak_by_role=by_role,
        host_gb={role: {k: v / GiB for k, v in parts.items()} for role, parts in host.items()},
        when=when_of,
        device=inputs.device,
        workers=inputs.workers,
        notes=notes,
        model=_model_facts(inputs.actor),
    )


def _model_facts(actor: Role) -> dict:
    shape = actor.shape
    return {
        "model_type": shape.model_type,
        "params": shape.param_count(),
        "trainable": actor.trainable,
        "num_hidden_layers": shape.num_hidden_layers,
        "hidden_size": shape.hidden_size,
        "num_attention_heads": shape.num_attention_heads,
        "vocab_size": shape.vocab_size,
    }


def one_line(plan: MemoryPlan) -> str:
    """``memory plan: 3.2 GB per device at peak (update_actor: actor 1.9, rollout 0.7, ...) of 24.0 GB: fits``."""
    parts = ", ".join(
        f"{role} {gb:.1f}" for role, gb in sorted(plan.peak_by_role.items(), key=lambda kv: -kv[1]) if gb >= 0.05
    )
    verdict = "fits" if plan.fits else "does NOT fit"
    return (
        f"memory plan: {plan.per_device_gb:.1f} GB per device at peak ({plan.peak_phase}: {parts}) "
        f"of {plan.device_memory_gb:.1f} GB on {plan.device} x {plan.workers}: {verdict}"
    )
