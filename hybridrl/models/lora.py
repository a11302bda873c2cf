"""LoRA through ``peft``: one implementation for the SFT and the RL trainers.

Wrapping (:func:`apply_lora`), the reference policy as the same module with its adapter off
(:class:`AdapterDisabled`), the merged weights the rollout generates with
(:func:`merged_lora_weights`), the adapter folder of a checkpoint (:func:`save_lora_adapter`)
and folding a saved adapter into its base model (:func:`merge_lora_adapter`).

Every function works on a plain module and on one sharded with FSDP2 (wrap with peft first,
then shard); on a sharded module the gathering ones are collectives that every rank calls.
Source: "LoRA: Low-Rank Adaptation of Large Language Models", Hu et al., arXiv:2106.09685.
"""

from __future__ import annotations

import os
from typing import Iterator

import torch

from hybridrl.errors import ConfigError
from hybridrl.models.materialize import checkpoint_name, full_tensor, is_adapter_param
from hybridrl.models.paths import ModelDependencyError

LORA_ADAPTER_DIR = "lora_adapter"  # peft's adapter_config.json + adapter_model.safetensors
ADAPTER = "default"  # peft's name of the one adapter


def _peft():
    try:
        import peft
    except ImportError as err:
        raise ModelDependencyError(
            "LoRA (lora_rank > 0) needs the peft package: run `pip install 'hybridrl[lora]'`, or set lora_rank=0"
        ) from err
    return peft


def lora_settings(model_cfg) -> dict | None:
    """``{lora_rank, lora_alpha, target_modules, exclude_modules}`` of a ``model`` config section,
    ``{adapter_path}`` when it names a saved adapter (``lora_adapter_path``: its own rank and
    targets), or None when ``lora_rank`` is 0 (full fine-tuning)."""
    adapter_path = getattr(model_cfg, "lora_adapter_path", None)
    if adapter_path:
        return {"adapter_path": str(adapter_path)}
    rank = int(model_cfg.lora_rank)
    if rank <= 0:
        return None
    targets = model_cfg.target_modules
    excluded = model_cfg.exclude_modules
    return {
        "lora_rank": rank,
        "lora_alpha": model_cfg.lora_alpha,
        "target_modules": targets if isinstance(targets, str) else list(targets),
        "exclude_modules": excluded if excluded is None or isinstance(excluded, str) else list(excluded),
    }


def load_lora_adapter(model: torch.nn.Module, adapter_path: str, config_key: str = "model", seed: int | None = None):
    """Wraps ``model`` (empty or not) with the adapters of the saved peft folder ``adapter_path``:
    its rank, alpha and target modules (``adapter_config.json``), trainable. The saved weights go
    in with :func:`fill_saved_adapter` once the model's weights exist. ``seed`` is unused.

    Raises:
        ModelDependencyError: ``peft`` is not installed.
        ConfigError: the folder holds no adapter config (one line naming
            ``<config_key>.lora_adapter_path``).
    """
    peft = _peft()
    folder = _adapter_folder(adapter_path, config_key)
    config = peft.LoraConfig.from_pretrained(folder)
    config.inference_mode = False
    return peft.get_peft_model(model, config)


@torch.no_grad()
def fill_saved_adapter(module: torch.nn.Module, adapter_path: str, config_key: str = "model") -> None:
    """Copies the saved adapter weights of ``adapter_path`` into the adapter parameters of ``module``
    (wrapped by :func:`load_lora_adapter`; plain or FSDP2-sharded: each rank copies its shard).

    Raises:
        ConfigError: the saved weights do not match the adapter's parameters (names or shapes).
    """
    from safetensors.torch import load_file

    from hybridrl.models.materialize import write_full_tensor

    folder = _adapter_folder(adapter_path, config_key)
    files = [f for f in ("adapter_model.safetensors",) if os.path.isfile(os.path.join(folder, f))]
    if not files:
        raise ConfigError(f"{config_key}.lora_adapter_path={adapter_path}: no adapter_model.safetensors there")
    saved = load_file(os.path.join(folder, files[0]))
    params = {name: p for name, p in module.named_parameters() if is_adapter_param(name)}
    for name, param in params.items():
        key = name.replace(f".{ADAPTER}.", ".")
        if key not in saved or tuple(saved[key].shape) != tuple(param.shape):
            found = tuple(saved[key].shape) if key in saved else "missing"
            raise ConfigError(
                f"{config_key}.lora_adapter_path={adapter_path}: {key} is {found} in the saved adapter, "
                f"the model needs {tuple(param.shape)}; save the adapter from this model"
            )
        write_full_tensor(param, saved[key])


def _adapter_folder(adapter_path: str, config_key: str) -> str:
    folder = os.path.expanduser(str(adapter_path))
    if not os.path.isfile(os.path.join(folder, "adapter_config.json")):
        raise ConfigError(
            f"{config_key}.lora_adapter_path={adapter_path}: no adapter_config.json there; point it at a folder "
            f"peft's save_pretrained wrote (a checkpoint's actor/{LORA_ADAPTER_DIR})"
        )
    return folder


def apply_lora(
    model: torch.nn.Module,
    lora_rank: int,
    lora_alpha: float = 16,
    target_modules="all-linear",
    exclude_modules=None,
    task_type: str = "CAUSAL_LM",
    config_key: str = "model",
    seed: int | None = None,
):
    """Wraps ``model`` with fresh LoRA adapters; only the adapter (and, for a token-classification
    task, the value/score head) stays trainable. ``lora_B`` starts at zero, so the wrapped
    model computes exactly what ``model`` did.

    Args:
        model: a transformers model (modified in place: its linear layers get adapters).
        lora_rank: ``r`` > 0; ``lora_alpha``: the update is scaled by ``lora_alpha / lora_rank``.
        target_modules: ``"all-linear"`` (every linear layer but the output head) or module names.
        exclude_modules: module names (or a regex) kept without adapters.
        task_type: ``CAUSAL_LM`` (actor) or ``TOKEN_CLS`` (critic: the ``score`` head is trained whole).
        config_key: the config section named in error messages (``actor_rollout_ref.model``).
        seed: draws the random ``lora_A`` from this seed, without touching the global RNG (the
            workers pass one so that every rank of a sharded model starts from the same adapter);
            None: from the global RNG.

    Returns:
        the ``peft.PeftModel``.

    Raises:
        ModelDependencyError: ``peft`` is not installed.
        ConfigError: ``target_modules`` names no module of the model.
    """
    peft = _peft()
    if task_type == "TOKEN_CLS":  # the head is trained whole (peft's modules_to_save), not adapted
        exclude_modules = _with_heads_excluded(exclude_modules)
    config = peft.LoraConfig(
        task_type=task_type,
        r=int(lora_rank),
        lora_alpha=lora_alpha,
        target_modules=target_modules,
        exclude_modules=exclude_modules,
        bias="none",
    )
    try:
        with torch.random.fork_rng(devices=[], enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            return peft.get_peft_model(model, config)
    except ValueError as err:
        reason = str(err).splitlines()[0].split(". ")[0].rstrip(".")  # peft's first sentence
        raise ConfigError(
            f"{config_key}.target_modules={target_modules!r}: {reason}; use all-linear or names of "
            "the model's linear layers (e.g. [q_proj,v_proj])"
        ) from err


def _with_heads_excluded(exclude_modules):
    """``exclude_modules`` (None, names or a regex, as peft takes it) plus the value/score heads."""
    heads = ["score", "classifier"]
    if exclude_modules is None:
        return heads
    if isinstance(exclude_modules, str):  # peft full-matches a string against module names
        return rf"(?:{exclude_modules})|(?:.*\.)?(?:{'|'.join(heads)})"
    return list(exclude_modules) + heads


def is_lora_model(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a ``peft`` model (False when peft is not even installed)."""
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(module, PeftModel)


class AdapterDisabled(torch.nn.Module):
    """The base model of a LoRA model, without a second copy of its weights: every call runs the
    LoRA model inside ``disable_adapter()``. The reference policy of a LoRA actor."""

    def __init__(self, peft_model: torch.nn.Module) -> None:
        super().__init__()
        self.peft_model = peft_model

    def __getattr__(self, name: str):
        """Everything else (``config``, ``get_output_embeddings``, ...) is the wrapped model's."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "peft_model":
                raise
            return getattr(self.peft_model, name)

    def forward(self, *args, **kwargs):
        with self.peft_model.disable_adapter():
            return self.peft_model(*args, **kwargs)


@torch.no_grad()
def merged_lora_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, W + (lora_alpha / r) B A)`` of each adapted layer in turn, named as in the plain HF model.

    ``W`` is the frozen base weight ``(out, in)``, ``A`` ``(r, in)``, ``B`` ``(out, r)``; the
    product is formed in fp32 and returned in ``W``'s dtype, on ``W``'s device. The other
    weights of a LoRA model never change, so these are all a rollout copy of the base model
    needs to generate with the current policy. One layer is gathered at a time (a collective on
    a sharded model: every rank consumes the whole iterator).

    Raises:
        NotImplementedError: a DoRA or bias-carrying adapter (never built by :func:`apply_lora`).
    """
    from peft.tuners.lora import LoraLayer
    from peft.utils.other import transpose

    for name, layer in model.named_modules():
        if not isinstance(layer, LoraLayer) or ADAPTER not in layer.lora_A:
            continue
        if layer.use_dora.get(ADAPTER) or layer.lora_bias.get(ADAPTER):
            raise NotImplementedError(f"{name}: DoRA / LoRA-bias adapters cannot be merged for the rollout")
        weight = full_tensor(layer.get_base_layer().weight)
        lora_a, lora_b = full_tensor(layer.lora_A[ADAPTER].weight), full_tensor(layer.lora_B[ADAPTER].weight)
        delta = transpose(lora_b.float() @ lora_a.float(), layer.fan_in_fan_out) * layer.scaling[ADAPTER]
        yield f"{checkpoint_name(name)}.weight", (weight.float() + delta).to(weight.dtype)


def save_lora_adapter(model: torch.nn.Module, folder: str, rank: int = 0) -> None:
    """``folder/lora_adapter/``: ``adapter_config.json`` + ``adapter_model.safetensors`` in
    peft's format (``PeftModel.from_pretrained`` loads it). A collective on a sharded model;
    rank 0 writes."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, ignore_frozen_params=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options)  # the adapter (and trained heads) only
    if rank == 0:
        model.save_pretrained(os.path.join(folder, LORA_ADAPTER_DIR), state_dict=state, safe_serialization=True)


def saved_lora_rank(folder: str) -> int:
    """``r`` of the adapter saved under ``folder/lora_adapter``, 0 when there is none."""
    import json

    path = os.path.join(folder, LORA_ADAPTER_DIR, "adapter_config.json")
    if not os.path.isfile(path):
        return 0
    with open(path) as f:
        return int(json.load(f).get("r", 0))


def merge_lora_adapter(base_model: torch.nn.Module, adapter_dir: str) -> torch.nn.Module:
    """``base_model`` with the saved adapter folded into its weights (peft's ``merge_and_unload``):
    a plain transformers model with the base model's parameter names.

    Raises:
        ModelDependencyError: ``peft`` is not installed.
    """
    peft = _peft()
    return peft.PeftModel.from_pretrained(base_model, adapter_dir).merge_and_unload()
