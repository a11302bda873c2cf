"""Test helper: a random-init model with the real tokenizer (importable from any test, since
tests/ is on sys.path through its conftest)."""

import os

import torch

from hybridrl.config.batch_sizes import WorkerBatchSizes
from hybridrl.models import load_tokenizer


def build_tiny_model(
    tokenizer_src: str,
    out_dir: str,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 1024,
    seed: int = 0,
) -> str:
    """Write a random-init Llama causal LM plus the tokenizer of `tokenizer_src` to `out_dir`.

    The vocabulary is ``len(tokenizer)`` and bos/eos/pad ids come from the tokenizer, so the
    tiny model works with real prompts; embeddings are tied. Weights depend only on `seed`
    (the global RNG state is left untouched). Returns the absolute `out_dir`.

    Raises:
        ModelPathError / ModelDependencyError: `tokenizer_src` cannot be resolved.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = load_tokenizer(tokenizer_src)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    out_dir = os.path.abspath(os.path.expanduser(out_dir))
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def actor_batch_sizes(actor_rollout_ref, world_size: int = 1) -> WorkerBatchSizes:
    """The per-worker batch sizes the driver hands an ``ActorRolloutRefWorker`` (``config.worker_batch_sizes``)."""
    from hybridrl.config import worker_batch_sizes

    return worker_batch_sizes(actor_rollout_ref.actor, actor_rollout_ref.rollout.n, world_size)


# Tests compare numbers in fp32; `auto` would be bf16 on a CPU with native bf16.
_FP32 = {
    "actor_rollout_ref": {
        "actor": {"fsdp_config": {"mixed_precision": {"param_dtype": "fp32"}}},
        "rollout": {"dtype": "float32"},
    },
    "critic": {"model": {"fsdp_config": {"mixed_precision": {"param_dtype": "fp32"}}}},
    "reward_model": {
        "model": {"fsdp_config": {"mixed_precision": {"param_dtype": "fp32"}}},
        "rollout": {"dtype": "float32"},
    },
}


def ppo_config_with(changes: dict | None = None):
    """The packaged PPO config as the run reads it (a structured DictConfig of
    ``hybridrl.trainer.ppo.config.PPOConfig``, interpolations resolved), in fp32, with ``changes``
    (nested dicts, e.g. ``{"data": {"max_prompt_length": 8}}``) merged in before resolving."""
    from omegaconf import OmegaConf

    from hybridrl.config.typed import to_structured
    from hybridrl.trainer.ppo.config import PPOConfig

    return to_structured(PPOConfig, OmegaConf.merge(_FP32, changes or {}), "")


def ppo_section(path: str, values: dict | None = None, others: dict | None = None):
    """The ``path`` section (e.g. ``"actor_rollout_ref.rollout"``) of :func:`ppo_config_with`, with
    ``values`` set in it and ``others`` (nested dicts) elsewhere in the config; every key the
    section has is there, typed, with the packaged default unless set."""
    from omegaconf import OmegaConf

    nested = values or {}
    for part in reversed(path.split(".")):
        nested = {part: nested}
    return OmegaConf.select(ppo_config_with(OmegaConf.merge(others or {}, nested)), path)
