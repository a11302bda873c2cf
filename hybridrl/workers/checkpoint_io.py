"""What one worker writes into (and reads from) a checkpoint folder.

``<local_path>/dcp/``: model and optimizer state with ``torch.distributed.checkpoint`` (DCP),
each rank writing its own shards. DCP re-shards on load, so a checkpoint written by 2 workers
resumes on 1 (or on 4), and the whole-model state dict of a single worker is the same format.
``extra_state_world_size_{W}_rank_{R}.pt``: lr scheduler and RNG state per rank.
``huggingface/``: config, generation config and tokenizer (rank 0), so that
``hybridrl merge`` can turn the folder into an HF model. A LoRA model (``model.lora_rank > 0``)
keeps only its trainable parameters (the adapter) in ``dcp/`` and adds ``lora_adapter/``
(peft's format, naming the base model), which ``hybridrl merge`` folds into the base weights.
The driver makes the whole step folder appear atomically (it writes into a temporary folder and
renames it). Loading reads the files without running anything from them (``dcp_safe``).
"""

from __future__ import annotations

import copy
import glob
import os
import random
import re

import numpy as np
import torch

from hybridrl.errors import CheckpointError
from hybridrl.models.lora import ADAPTER, is_lora_model, save_lora_adapter, saved_lora_rank
from hybridrl.workers.dcp_safe import quiet_single_process_dcp, safe_dcp_load

DCP_DIR = "dcp"
HF_DIR = "huggingface"


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _extra_state_path(local_path: str, rank: int, world_size: int) -> str:
    return os.path.join(local_path, f"extra_state_world_size_{world_size}_rank_{rank}.pt")


# What the state files (data.pt, extra_state_*.pt) may hold besides tensors and plain Python
# values: numpy's RNG state is an array. Loading allows nothing else (no code runs from a file).
_SAFE_NUMPY = (np.ndarray, np.dtype, np.dtype(np.uint32).__class__, np._core.multiarray._reconstruct)


def load_state_file(path: str):
    """A state file written with ``torch.save`` (tensors, numbers, strings, containers, numpy
    arrays), loaded with ``weights_only=True``: a file that asks to import or run anything else
    is refused, never executed.

    Raises:
        CheckpointError: the file is truncated, damaged, or holds objects beyond those (one line,
            naming the file).
    """
    try:
        with torch.serialization.safe_globals(list(_SAFE_NUMPY)):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - unpickling, zip and EOF errors all mean a bad file
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise CheckpointError(
            f"{path}: not a readable hybridrl state file ({type(exc).__name__}: {reason}); "
            "it is damaged or was not written by hybridrl"
        ) from None


def rng_state() -> dict:
    state = {"cpu": torch.get_rng_state(), "numpy": np.random.get_state(), "random": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    np.random.set_state(state["numpy"])
    random.setstate(state["random"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def wait_for_device_copies() -> bool:
    """``torch.cuda.synchronize()`` where there is CUDA: asynchronous copies (the optimizer
    offload's ``non_blocking`` moves) are done before a save reads the state. True when it waited;
    a no-op on CPU."""
    if not torch.cuda.is_available():
        return False
    torch.cuda.synchronize()
    return True


def _state_dict_options(module):
    """LoRA: the frozen base weights stay out of the checkpoint (they are the base model's)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    lora = is_lora_model(module)
    return StateDictOptions(ignore_frozen_params=lora, strict=not lora)


def _model_and_optim_state(module, optimizer, options) -> tuple[dict, dict]:
    """``get_state_dict``; with ``ignore_frozen_params`` also without a frozen weight that is tied
    to another name (e.g. ``lm_head.weight``), which torch keeps (it skips duplicates by name)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(module, optimizer, options=options)
    if options.ignore_frozen_params:
        trainable = {n for n, p in module.named_parameters(remove_duplicate=False) if p.requires_grad}
        model_state = {k: v for k, v in model_state.items() if k in trainable}
    return model_state, optim_state


def _hf_class_name(module) -> str:
    """The transformers class of ``module``, under a LoRA (peft) and an FSDP2 wrapper."""
    from torch.distributed.fsdp import FSDPModule

    base = module.get_base_model() if is_lora_model(module) else module
    return next(cls.__name__ for cls in type(base).__mro__ if not issubclass(cls, FSDPModule))


def save_worker_state(
    local_path, module, optimizer, lr_scheduler, rank, world_size, tokenizer=None, worker_state: dict | None = None
) -> None:
    """Writes this rank's part of the checkpoint; a collective for a sharded module (every rank calls it).

    ``worker_state``: small plain values of the worker's own (e.g. the actor's ``param_version``),
    kept in the extra state file and returned by :func:`load_worker_state`."""
    import torch.distributed.checkpoint as dcp

    os.makedirs(local_path, exist_ok=True)
    wait_for_device_copies()
    model_state, optim_state = _model_and_optim_state(module, optimizer, _state_dict_options(module))
    with quiet_single_process_dcp():
        dcp.save(
            {"model": model_state, "optim": optim_state},
            checkpoint_id=os.path.join(local_path, DCP_DIR),
            no_dist=not _distributed(),
        )
    if is_lora_model(module):
        save_lora_adapter(module, local_path, rank)
    torch.save(
        {"lr_scheduler": lr_scheduler.state_dict(), "rng": rng_state(), "worker": dict(worker_state or {})},
        _extra_state_path(local_path, rank, world_size),
    )
    if rank == 0:
        hf_dir = os.path.join(local_path, HF_DIR)
        config = copy.deepcopy(module.config)
        # What `hybridrl merge` rebuilds: the class trained (a critic's or reward model's scalar
        # head, not the causal LM the backbone was loaded from, as `from_pretrained` leaves it).
        config.architectures = [_hf_class_name(module)]
        config.save_pretrained(hf_dir)
        if getattr(module, "generation_config", None) is not None and module.can_generate():
            module.generation_config.save_pretrained(hf_dir)
        if tokenizer is not None:
            tokenizer.save_pretrained(hf_dir)


def _saved_world_size(local_path: str) -> int:
    sizes = {
        int(m.group(1))
        for path in glob.glob(os.path.join(local_path, "extra_state_world_size_*_rank_*.pt"))
        if (m := re.search(r"world_size_(\d+)_rank_", os.path.basename(path)))
    }
    if len(sizes) != 1 or not os.path.isdir(os.path.join(local_path, DCP_DIR)):
        raise CheckpointError(
            f"{local_path} is not a complete worker checkpoint (expected {DCP_DIR}/ and one set of "
            "extra_state_world_size_*_rank_*.pt files); point trainer.resume_from_path at a global_step_* folder"
        )
    return sizes.pop()


def _check_lora_rank(local_path: str, module) -> None:
    """A checkpoint resumes only into a model with the same LoRA rank (0: full fine-tuning)."""
    saved = saved_lora_rank(local_path)
    current = int(module.peft_config[ADAPTER].r) if is_lora_model(module) else 0
    if saved != current:
        raise CheckpointError(
            f"{local_path} was written with model.lora_rank={saved} but this run has lora_rank={current}; "
            "resume with the same lora_rank, or start over with trainer.resume_mode=disable"
        )


def load_worker_state(local_path, module, optimizer, lr_scheduler, rank, world_size) -> dict:
    """Loads model and optimizer (re-sharded to this worker group) and the lr schedule; returns
    the ``worker_state`` saved with them (``{}`` for a checkpoint written without one).

    RNG state is restored when the number of workers is unchanged; with another number the
    ranks do not correspond, so each rank keeps its own generator (sampling continues
    correctly, just not bit-identically to an uninterrupted run).

    ``dcp/`` is read by :func:`~hybridrl.workers.dcp_safe.safe_dcp_load` (``.metadata`` and
    bytes items as plain data only), the extra state file with ``weights_only=True``: nothing
    in the folder runs code, even if it was changed after the driver verified it.

    Raises:
        CheckpointError: the folder is not a complete checkpoint, was written with another
            LoRA rank (``model.lora_rank``; 0 = full fine-tuning), or a file in it is damaged or
            refused (one line naming it).
    """
    from torch.distributed.checkpoint.state_dict import set_state_dict

    saved_world = _saved_world_size(local_path)
    _check_lora_rank(local_path, module)
    options = _state_dict_options(module)
    model_state, optim_state = _model_and_optim_state(module, optimizer, options)
    state = {"model": model_state, "optim": optim_state}
    safe_dcp_load(state, os.path.join(local_path, DCP_DIR), no_dist=not _distributed())
    set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=options)
    extra = load_state_file(_extra_state_path(local_path, min(rank, saved_world - 1), saved_world))
    lr_scheduler.load_state_dict(extra["lr_scheduler"])
    if saved_world == world_size:
        set_rng_state(extra["rng"])
    return dict(extra.get("worker") or {})
