"""A dense decoder's shape from its ``config.json`` (never its weights), and its parameter counts.

The memory plan (:mod:`hybridrl.trainer.jobs.memory_plan`) sizes every role from these numbers. The
supported family is the Llama-style dense decoder: Llama (SmolLM2), Qwen2 / Qwen2.5, Qwen3 and
Mistral. Each decoder layer holds attention (q/k/v/o projections; Qwen2 adds a bias to q, k and
v; Llama's ``attention_bias`` to all four; Qwen3 adds an RMSNorm of ``head_dim`` on q and k), a
SwiGLU MLP (gate/up/down; Llama's ``mlp_bias``) and two RMSNorms; the model adds the token
embeddings, a final RMSNorm and the output head unless ``tie_word_embeddings``.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass

from hybridrl.models.paths import ModelConfigError, ModelPathError

__all__ = ["LORA_LINEARS", "SUPPORTED_MODEL_TYPES", "ModelShape", "model_shape_from_dict", "read_model_shape"]

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")
# Keys whose presence means a mixture of experts: not a dense decoder.
_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size", "num_experts_per_tok")
_REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
# The decoder layer's linear layers: the names peft's target_modules match ("all-linear": all of them).
LORA_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a model: sizes as in ``config.json``; ``head_dim`` resolved."""

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    head_dim: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False

    @property
    def q_dim(self) -> int:
        """Width of the query projection's output: heads x head_dim."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection's output: kv heads x head_dim."""
        return self.num_key_value_heads * self.head_dim

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """``name -> (in_features, out_features)`` of one decoder layer's linear layers."""
        h, i = self.hidden_size, self.intermediate_size
        return {
            "q_proj": (h, self.q_dim),
            "k_proj": (h, self.kv_dim),
            "v_proj": (h, self.kv_dim),
            "o_proj": (self.q_dim, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def layer_params(self) -> int:
        """Parameters of one decoder layer (count): projections, their biases, the norms."""
        h, i = self.hidden_size, self.intermediate_size
        weights = sum(a * b for a, b in self.linear_shapes().values())
        biases = (self.q_dim + 2 * self.kv_dim) * self.qkv_bias + h * self.o_bias + (2 * i + h) * self.mlp_bias
        norms = 2 * h + 2 * self.head_dim * self.qk_norm
        return weights + biases + norms

    def root_params(self, head: bool = True) -> int:
        """Parameters outside the decoder layers (count): embeddings, the final norm and, with
        ``head`` and untied embeddings, the output head."""
        untied_head = self.vocab_size * self.hidden_size if head and not self.tie_word_embeddings else 0
        return self.vocab_size * self.hidden_size + self.hidden_size + untied_head

    def param_count(self) -> int:
        """Parameters of the causal LM (count), as ``sum(p.numel() for p in model.parameters())``."""
        return self.num_hidden_layers * self.layer_params() + self.root_params()

    def scalar_head_param_count(self) -> int:
        """Parameters of the backbone under a one-output head (count): the critic and the reward
        model (``AutoModelForTokenClassification`` with ``num_labels=1``: weight and bias)."""
        return self.num_hidden_layers * self.layer_params() + self.root_params(head=False) + self.hidden_size + 1

    def lora_param_count(self, rank: int, target_modules="all-linear", exclude_modules=None) -> int:
        """Parameters of LoRA adapters of ``rank`` (count): ``rank x (in + out)`` per adapted linear.

        ``target_modules``: ``all-linear`` (every linear of the decoder layers, not the output
        head, as peft) or a list of names; ``exclude_modules``: a list of names left out (a
        regex string is not evaluated here and excludes nothing).
        """
        names = set(LORA_LINEARS) if target_modules == "all-linear" else set(_names(target_modules)) & set(LORA_LINEARS)
        names -= set(_names(exclude_modules)) if not isinstance(exclude_modules, str) else set()
        shapes = self.linear_shapes()
        return self.num_hidden_layers * sum(rank * sum(shapes[name]) for name in names)


def _names(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def _positive_int(raw: dict, key: str, where: str) -> int:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelConfigError(
            f"{where}: config.json's {key}={value!r} must be an integer >= 1; "
            "the memory plan reads the model's sizes from it"
        )
    return value


def model_shape_from_dict(raw: dict, config_key: str = "actor_rollout_ref.model.path") -> ModelShape:
    """The :class:`ModelShape` of a ``config.json``'s contents.

    Raises:
        ModelConfigError: a ``model_type`` outside :data:`SUPPORTED_MODEL_TYPES`, mixture-of-experts
            keys, or a size that is missing or not a positive integer (one line naming ``config_key``).
    """
    model_type = raw.get("model_type")
    supported = ", ".join(SUPPORTED_MODEL_TYPES)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelConfigError(
            f"{config_key}: model_type {model_type!r} is not supported by the memory plan; "
            f"it models dense decoders: {supported}"
        )
    moe = [key for key in _MOE_KEYS if raw.get(key)]
    if moe:
        raise ModelConfigError(
            f"{config_key}: config.json has {moe[0]}={raw[moe[0]]!r} (a mixture of experts), which "
            f"the memory plan does not model; it models dense decoders: {supported}"
        )
    sizes = {key: _positive_int(raw, key, config_key) for key in _REQUIRED}
    heads = sizes["num_attention_heads"]
    kv_heads = _positive_int(raw, "num_key_value_heads", config_key) if raw.get("num_key_value_heads") else heads
    head_dim = _positive_int(raw, "head_dim", config_key) if raw.get("head_dim") else sizes["hidden_size"] // heads
    attention_bias = bool(raw.get("attention_bias", False))
    return ModelShape(
        model_type=model_type,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or (model_type in ("llama", "qwen3") and attention_bias),
        o_bias=model_type in ("llama", "qwen3") and attention_bias,
        mlp_bias=model_type == "llama" and bool(raw.get("mlp_bias", False)),
        qk_norm=model_type == "qwen3",
        **sizes,
    )


@functools.lru_cache(maxsize=32)
def _read_json(path: str, mtime_ns: int) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def read_model_shape(
    folder: str, config_key: str = "actor_rollout_ref.model.path", override_config: dict | None = None
) -> ModelShape:
    """The shape of the model in ``folder`` (a folder with ``config.json``), with the role's
    ``model.override_config`` applied over the file, as the loader does.

    Raises:
        ModelPathError: no readable ``config.json`` there; ModelConfigError: as
        :func:`model_shape_from_dict` (one line naming ``config_key``).
    """
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise ModelPathError(
            f"{config_key}: '{folder}' has no config.json; the memory plan reads the model's sizes "
            "from it (set the key to a Hugging Face model folder)"
        )
    try:
        contents = _read_json(path, os.stat(path).st_mtime_ns)
    except (OSError, ValueError) as exc:
        raise ModelPathError(f"{config_key}: cannot read {path} ({type(exc).__name__}: {exc})") from None
    if not isinstance(contents, dict):
        raise ModelPathError(f"{config_key}: {path} does not hold a JSON object")
    return model_shape_from_dict({**contents, **dict(override_config or {})}, config_key)
