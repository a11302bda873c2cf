"""``hybridrl merge --local_dir <ckpt>/actor --target_dir <hf_dir>``: a checkpoint folder (DCP
shards from any number of workers) -> one Hugging Face folder (safetensors + config +
tokenizer) that ``transformers.AutoModel*.from_pretrained`` loads, as verl's model merger does.

A LoRA checkpoint (it has ``lora_adapter/``) is folded into its base model (peft's
``merge_and_unload``): the base named in the adapter's config, or ``--base_model``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

from hybridrl.models import ModelDependencyError, ModelPathError, load_causal_lm, load_value_model, to_torch_dtype
from hybridrl.models.lora import LORA_ADAPTER_DIR, merge_lora_adapter
from hybridrl.trainer.run.checkpoint import CheckpointError
from hybridrl.trainer.run.checkpoint_files import verify_dcp, verify_manifest
from hybridrl.workers.checkpoint_io import DCP_DIR, HF_DIR
from hybridrl.workers.dcp_safe import safe_dcp_load


def _model_class(config):
    """The causal-LM class, or the token-classification class for a critic / reward head."""
    import transformers

    architectures = getattr(config, "architectures", None) or []
    if any(name.endswith("ForTokenClassification") for name in architectures):
        return transformers.AutoModelForTokenClassification
    if any(name.endswith("ForSequenceClassification") for name in architectures):
        return transformers.AutoModelForSequenceClassification
    return transformers.AutoModelForCausalLM


def load_merged_model(local_dir: str, dtype=None, base_model: str | None = None):
    """The whole model of a worker checkpoint folder (``<global_step_N>/actor`` or ``/critic``).

    ``base_model``: for a LoRA checkpoint, the base model's folder (default: the path recorded
    in ``lora_adapter/adapter_config.json``).

    Its files are checked first: against the step folder's ``checksums.json`` when there is
    one, and the DCP folder is read without unpickling anything but plain data
    (``checkpoint_files.verify_dcp``).

    Raises:
        CheckpointError: the folder has no ``dcp/`` shards or no ``huggingface/`` config, a file
            is damaged or refused (one line naming it), or the base model of its LoRA adapter
            is not found.
        ModelDependencyError: a LoRA checkpoint and no ``peft``.
    """
    from transformers import AutoConfig

    hf_dir, dcp_dir = os.path.join(local_dir, HF_DIR), os.path.join(local_dir, DCP_DIR)
    if not os.path.isfile(os.path.join(hf_dir, "config.json")) or not os.path.isdir(dcp_dir):
        raise CheckpointError(
            f"--local_dir {local_dir} is not a worker checkpoint (needs {HF_DIR}/config.json and {DCP_DIR}/); "
            "pass e.g. checkpoints/<project>/<experiment>/global_step_10/actor"
        )
    step_dir, worker = os.path.split(os.path.abspath(local_dir))
    verify_manifest(step_dir, under=worker)
    verify_dcp(dcp_dir)
    config = AutoConfig.from_pretrained(hf_dir)
    adapter_dir = os.path.join(local_dir, LORA_ADAPTER_DIR)
    if os.path.isfile(os.path.join(adapter_dir, "adapter_config.json")):
        model = _fold_lora(adapter_dir, config, base_model)
    else:
        model = _load_dcp(dcp_dir, config)
    if model.can_generate() and os.path.isfile(os.path.join(hf_dir, "generation_config.json")):
        from transformers import GenerationConfig

        model.generation_config = GenerationConfig.from_pretrained(hf_dir)
    return model.to(dtype) if dtype is not None else model


def _fold_lora(adapter_dir: str, config, base_model: str | None):
    """The base model (fp32, as trained) with the saved adapter merged into its weights."""
    import json

    if base_model is None:
        with open(os.path.join(adapter_dir, "adapter_config.json")) as f:
            base_model = json.load(f).get("base_model_name_or_path")
    is_critic = _model_class(config).__name__ == "AutoModelForTokenClassification"
    try:
        base = (load_value_model if is_critic else load_causal_lm)(base_model)
    except (ModelPathError, OSError, TypeError) as err:
        raise CheckpointError(
            f"{adapter_dir} is a LoRA adapter of the base model {base_model!r}, which cannot be "
            f"loaded ({type(err).__name__}); pass --base_model <its HF folder>"
        ) from err
    return merge_lora_adapter(base, adapter_dir)


def _load_dcp(dcp_dir: str, config):
    """A model of ``config`` with the full weights of the DCP shards (fp32), read without
    unpickling anything but plain data (``workers/dcp_safe.py``).

    Raises:
        CheckpointError: the shards do not load (one line).
    """
    import torch

    with torch.device("meta"):
        model = _model_class(config).from_config(config, dtype=torch.float32)
    model = model.to_empty(device="cpu")
    state = {"model": model.state_dict()}
    # Tied weights (lm_head = embeddings) may be stored once: load what is there, then re-tie.
    safe_dcp_load(state, dcp_dir, allow_partial_load=True)
    model.load_state_dict(state["model"])
    model.tie_weights()
    return model


def merge(local_dir: str, target_dir: str, dtype=None, base_model: str | None = None) -> str:
    """Writes the HF folder atomically (a temporary folder renamed into place); returns it."""
    from transformers import AutoTokenizer

    model = load_merged_model(local_dir, dtype, base_model)
    parent = os.path.dirname(os.path.abspath(target_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".merge-", dir=parent)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        hf_dir = os.path.join(local_dir, HF_DIR)
        if os.path.isfile(os.path.join(hf_dir, "tokenizer_config.json")):
            AutoTokenizer.from_pretrained(hf_dir).save_pretrained(tmp)
        if os.path.exists(target_dir):
            shutil.rmtree(target_dir)
        os.replace(tmp, target_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hybridrl merge", description=__doc__.split("\n")[0])
    parser.add_argument("--local_dir", required=True, help="worker checkpoint folder, e.g. .../global_step_10/actor")
    parser.add_argument("--target_dir", required=True, help="where to write the Hugging Face folder")
    parser.add_argument("--dtype", default=None, help="save in this dtype (bf16, fp16, fp32); default: as trained")
    parser.add_argument(
        "--base_model",
        default=None,
        help="LoRA checkpoints: the base model's folder (default: the one the adapter names)",
    )
    args = parser.parse_args(argv)

    try:
        path = merge(
            args.local_dir, args.target_dir, to_torch_dtype(args.dtype) if args.dtype else None, args.base_model
        )
    except (CheckpointError, ModelDependencyError) as exc:
        print(f"hybridrl: error: {exc}", file=sys.stderr)
        return 2
    print(f"hybridrl: merged {args.local_dir} -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
