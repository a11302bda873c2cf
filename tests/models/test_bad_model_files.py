"""Model files that cannot be read give one line naming the file, never a library traceback."""

import os
import shutil

import pytest

from hybridrl.models import ModelPathError, load_causal_lm, resolve_model_path


def _gguf(tmp_path, content: bytes):
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    return str(path)


def _folder(tmp_path, tiny_model_dir, damage):
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    damage(folder)
    return str(folder)


def _cut(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


CASES = {
    "not a gguf": (lambda tmp, tiny: _gguf(tmp, b"not gguf at all"), r"not a complete GGUF file"),
    "gguf header only": (lambda tmp, tiny: _gguf(tmp, b"GGUF\x03\x00\x00\x00"), r"not a complete GGUF file"),
    "config.json not json": (
        lambda tmp, tiny: _folder(tmp, tiny, lambda f: (f / "config.json").write_text("{no")),
        r"config.json",
    ),
    "no weights": (
        lambda tmp, tiny: _folder(tmp, tiny, lambda f: os.remove(f / "model.safetensors")),
        r"no \*\.safetensors file",
    ),
    "truncated safetensors": (
        lambda tmp, tiny: _folder(tmp, tiny, lambda f: _cut(f / "model.safetensors")),
        r"SafetensorError",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_unreadable_model_files_are_one_line(case, tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("HYBRIDRL_CACHE", str(tmp_path / "cache"))  # a GGUF is converted into this cache
    make, expected = CASES[case]
    path = make(tmp_path, tiny_model_dir)
    with pytest.raises(ModelPathError, match=expected) as err:
        load_causal_lm(resolve_model_path(path), dtype="fp32")
    assert str(err.value).startswith(path) and "cannot be read" in str(err.value) and "\n" not in str(err.value)


def test_config_json_not_json_is_named_before_the_tokenizer_loads(tmp_path, tiny_model_dir):
    """The tokenizer loads first in every entry point: a config.json that is not JSON is named by
    it (one line), not left to transformers' traceback."""
    from hybridrl.models import load_tokenizer

    path = _folder(tmp_path, tiny_model_dir, lambda f: (f / "config.json").write_text("{no"))
    with pytest.raises(ModelPathError, match=r"config\.json") as err:
        load_tokenizer(path)
    message = str(err.value)
    assert os.path.join(path, "config.json") in message and "not valid JSON" in message and "\n" not in message
    with pytest.raises(ModelPathError, match=r"config\.json"):
        resolve_model_path(path)
