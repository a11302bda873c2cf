"""Model and tokenizer loading: local HF folders, GGUF files (cached conversion), the embedded
SmolLM2-135M-Instruct default, the value model (critic) and a tiny random model for tests."""

from hybridrl.models.loader import load_causal_lm, load_tokenizer, load_value_model, to_torch_dtype
from hybridrl.models.paths import (
    DEFAULT_CONFIG_KEY,
    ModelConfigError,
    ModelDependencyError,
    ModelPathError,
    embedded_model_gguf,
    resolve_model_path,
)

__all__ = [
    "DEFAULT_CONFIG_KEY",
    "ModelConfigError",
    "ModelDependencyError",
    "ModelPathError",
    "embedded_model_gguf",
    "load_causal_lm",
    "load_tokenizer",
    "load_value_model",
    "resolve_model_path",
    "to_torch_dtype",
]
