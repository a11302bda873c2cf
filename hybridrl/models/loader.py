"""Load models and tokenizers from the local folder :func:`~hybridrl.models.paths.resolve_model_path`
finds: the causal LM (policy, reference), the critic (value model), an empty copy for an engine,
the dtype names of the config. transformers is imported inside the functions so that importing
this module stays cheap.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable

import torch

from hybridrl.models.attention import PINNED_ATTR
from hybridrl.models.materialize import (
    CheckpointWeightsError,
    checkpoint_name,
    empty_model,
    init_adapter_params,
    load_weights,
    materialize,
    write_full_tensor,
)
from hybridrl.models.paths import (
    ModelConfigError,
    check_config_json,
    resolve_model_path,
    unreadable_model_files,
)
from hybridrl.models.varlen import flash_attn_varlen

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------- loading


def _tokenizer_folder(path: str) -> str:
    """A folder with tokenizer files but no config.json is fine for a tokenizer."""
    local = os.path.abspath(os.path.expanduser(str(path)))
    if os.path.isdir(local) and any(
        os.path.isfile(os.path.join(local, f)) for f in ("tokenizer.json", "tokenizer_config.json")
    ):
        if os.path.isfile(os.path.join(local, "config.json")):  # transformers reads it too
            check_config_json(local)
        return local
    return resolve_model_path(path)


def load_tokenizer(
    path: str, trust_remote_code: bool = False, padding_side: str = "left", chat_template: str | None = None
):
    """Load the tokenizer of `path` (any form `resolve_model_path` accepts, or a tokenizer folder).

    As verl's `hf_tokenizer`, a tokenizer without a pad token gets ``pad_token = eos_token``.
    `padding_side` is "left" by default because generation pads prompts on the left.
    `chat_template` (``actor_rollout_ref.model.custom_chat_template``) replaces the tokenizer's.

    Raises:
        ModelPathError / ModelDependencyError: see `resolve_model_path`.
        ModelConfigError: `padding_side` is not "left" or "right".
    """
    if padding_side not in ("left", "right"):
        raise ModelConfigError(f"padding_side: got {padding_side!r}; use 'left' or 'right'")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        _tokenizer_folder(path), trust_remote_code=trust_remote_code, padding_side=padding_side
    )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if chat_template:
        tokenizer.chat_template = chat_template
    return tokenizer


_DTYPE_NAMES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}  # fmt: skip


def to_torch_dtype(dtype) -> torch.dtype:
    """A torch dtype from a dtype or its name ("bf16", "float32", ...); ModelConfigError otherwise."""
    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).lower().removeprefix("torch.")
    if name == "auto":  # the entry points resolve it for the device (hybridrl.config.precision)
        raise ModelConfigError(
            "dtype: 'auto' reached a model loader unresolved; call "
            "hybridrl.config.precision.resolve_precision(config, device) first"
        )
    if name not in _DTYPE_NAMES:
        raise ModelConfigError(f"dtype: got {dtype!r}; use one of {sorted(_DTYPE_NAMES)}")
    return _DTYPE_NAMES[name]


def _load_config(path: str, trust_remote_code: bool, override_config: dict | None):
    """AutoConfig of `path` with `override_config` applied (nested dicts update sub-configs)."""
    from transformers import AutoConfig, PretrainedConfig

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)

    def apply(cfg, overrides: dict, prefix: str) -> None:
        for key, value in overrides.items():
            if not hasattr(cfg, key):
                raise ModelConfigError(
                    f"override_config.{prefix}{key}: {type(cfg).__name__} has no such field; "
                    "check the spelling against the model's config.json"
                )
            current = getattr(cfg, key)
            if isinstance(value, dict) and isinstance(current, PretrainedConfig):
                apply(current, value, f"{prefix}{key}.")
            else:
                setattr(cfg, key, value)

    apply(config, dict(override_config or {}), "")
    config.use_cache = False  # training default; the rollout turns the cache on for generate
    return config


def _enable_checkpointing(model) -> None:
    """Non-reentrant activation checkpointing (as verl); the method was renamed in transformers 5."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _build(auto_cls, path: str, options: ModelOptions, **config_fields):
    """``(module, missing)``: ``auto_cls`` built from the resolved folder's config (overridden by
    ``options.override_config``, then ``config_fields``) with empty parameters, wrapped
    (``options.wrap``), sharded (``options.shard``) and materialised on ``options.device``, then
    filled from the checkpoint tensor by tensor (:mod:`hybridrl.models.materialize`). LoRA
    adapters are initialised from ``options.adapter_seed``. ``missing``: the parameter names no
    checkpoint tensor or adapter init filled (the caller decides: a value head is zeroed, anything
    else is an error). Errors as :func:`load_causal_lm`."""
    from transformers import GenerationConfig

    folder = resolve_model_path(path)
    overrides = dict(options.override_config or {})
    pinned = overrides.pop("attn_implementation", None)
    check_attn_implementation(pinned)
    with unreadable_model_files(folder):
        config = _load_config(folder, options.trust_remote_code, overrides)
        for key, value in config_fields.items():
            setattr(config, key, value)
        dtype = to_torch_dtype(options.dtype)
        model = empty_model(
            lambda: auto_cls.from_config(
                config,
                dtype=dtype,
                trust_remote_code=options.trust_remote_code,
                attn_implementation=pinned or options.attn_implementation,
            )
        )
        if pinned:
            setattr(model, PINNED_ATTR, True)
        if os.path.isfile(os.path.join(folder, "generation_config.json")):
            model.generation_config = GenerationConfig.from_pretrained(folder)
        if options.enable_gradient_checkpointing:
            _enable_checkpointing(model)
        module = options.wrap(model) if options.wrap is not None else model
        materialize(module, options.device, options.shard)
        missing = load_weights(module, folder, model.base_model_prefix)
    missing = init_adapter_params(module, missing, seed=options.adapter_seed)
    return module.eval(), missing


def check_attn_implementation(name: str | None) -> None:
    """``override_config.attn_implementation`` (verl's key; None: hybridrl chooses): the model is
    loaded with it and hybridrl keeps it (:func:`hybridrl.models.attention.attention_pinned`).

    Raises:
        ModelConfigError: ``flash_attention_2`` (or ``_3``) without an importable ``flash_attn``.
    """
    if name is None:
        return
    if not isinstance(name, str) or not name:
        raise ModelConfigError(
            f"override_config.attn_implementation: got {name!r}; use e.g. sdpa, eager, flash_attention_2"
        )
    if name.startswith("flash_attention") and flash_attn_varlen() is None:
        raise ModelConfigError(
            f"override_config.attn_implementation={name}: the flash_attn package does not import here; "
            "install flash-attn built for this torch and CUDA, or remove the key (hybridrl then picks "
            "a varlen kernel itself) or set it to sdpa"
        )


def empty_copy(model: torch.nn.Module, dtype, device) -> torch.nn.Module:
    """A plain model of ``model``'s class and config with ``dtype`` parameters on ``device``,
    their values undefined (fill them, e.g. with ``materialize.copy_weights``): how an engine
    gets its own copy of a (maybe sharded) policy without a second full copy in between."""
    import copy

    config = copy.deepcopy(model.config)
    dtype = to_torch_dtype(dtype)
    copy_model = empty_model(lambda: type(model)._from_config(config, dtype=dtype))
    copy_model.generation_config = copy.deepcopy(getattr(model, "generation_config", None))
    if getattr(model, PINNED_ATTR, False):
        setattr(copy_model, PINNED_ATTR, True)
    return materialize(copy_model, device).eval()


@dataclass(frozen=True)
class ModelOptions:
    """How :func:`load_causal_lm` / :func:`load_value_model` build a model.

    Attributes:
        dtype: dtype of the parameters (a torch dtype or a name: "fp32", "bf16", ...).
        trust_remote_code, attn_implementation: as transformers takes them.
        override_config: config fields to replace, e.g. ``{"attention_dropout": 0.0}``; its
            ``attn_implementation`` (verl's key) replaces ``attn_implementation`` and pins it
            (:func:`check_attn_implementation`).
        enable_gradient_checkpointing: non-reentrant activation checkpointing (as verl).
        device: where the parameters live ("cpu", "cuda", ...).
        wrap: called on the empty model before it is sharded; returns the module to keep (e.g.
            with LoRA adapters: ``lambda m: apply_lora(m, ...)``).
        shard: shards the (wrapped) empty module in place (FSDP2 ``fully_shard``): each rank
            then holds and reads only its shard.
        adapter_seed: LoRA adapters are drawn from it (the same on every rank and world size).
    """

    dtype: object = torch.float32
    trust_remote_code: bool = False
    attn_implementation: str = "sdpa"
    override_config: dict | None = None
    enable_gradient_checkpointing: bool = False
    device: str = "cpu"
    wrap: Callable | None = None
    shard: Callable | None = None
    adapter_seed: int = 0


def load_causal_lm(path: str, dtype=torch.float32, **options):
    """Load an ``AutoModelForCausalLM`` from any form `resolve_model_path` accepts, without ever
    holding more than this rank's shard of it plus one checkpoint tensor
    (:mod:`hybridrl.models.materialize`).

    Args:
        dtype: torch dtype or its name ("float32", "bf16", ...).
        options: the other fields of :class:`ModelOptions` (``trust_remote_code``,
            ``override_config``, ``enable_gradient_checkpointing``, ``device``, ``wrap``, ``shard``, ...).

    Returns the model (in eval mode) with ``config.use_cache = False`` (training); logits are
    ``(bs, seqlen, vocab_size)``.

    Raises:
        ModelPathError / ModelDependencyError: see `resolve_model_path`.
        ModelConfigError: unknown dtype or override_config key.
        CheckpointWeightsError: a parameter the checkpoint lacks.
    """
    from transformers import AutoModelForCausalLM

    module, missing = _build(AutoModelForCausalLM, path, ModelOptions(dtype=dtype, **options))
    if missing:
        raise CheckpointWeightsError(
            f"{resolve_model_path(path)}: the checkpoint has no {sorted(missing)[:3]}; "
            "is it a causal language model of this architecture?"
        )
    return module


def load_value_model(path: str, dtype=torch.float32, **options):
    """Load the PPO critic: the causal-LM backbone with a scalar head, as verl does.

    `AutoModelForTokenClassification` with ``num_labels=1`` and no dropout on the head; the value
    of each token is ``logits[..., 0]``. A head missing from
    the checkpoint (the usual case: a causal-LM checkpoint) is initialised to ZERO: the first
    values are exactly 0 whatever the hidden-state scale of the backbone (which differs a lot
    between models), so step-0 GAE advantages are the plain discounted returns instead of
    random noise; the head receives gradients at once and the backbone from the next step. A
    head present in the checkpoint (a trained critic) is kept.

    Arguments and errors: as `load_causal_lm`.
    """
    from transformers import AutoModelForTokenClassification

    # no dropout on values: it would make the critic's targets noisy
    module, missing = _build(
        AutoModelForTokenClassification,
        path,
        ModelOptions(dtype=dtype, **options),
        num_labels=1,
        classifier_dropout=0.0,
    )
    prefix = module.base_model_prefix if hasattr(module, "base_model_prefix") else ""
    backbone = [name for name in missing if checkpoint_name(name).startswith(prefix + ".")]
    if backbone:
        raise CheckpointWeightsError(f"{resolve_model_path(path)}: the checkpoint has no {sorted(backbone)[:3]}")
    params = dict(module.named_parameters())
    for name in missing:
        write_full_tensor(params[name], torch.zeros(params[name].shape))
    return module
