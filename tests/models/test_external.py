"""model.external_lib: hybridrl.models.external.import_external_lib imports a user's module."""

import sys

import pytest

from hybridrl.models.external import import_external_lib


def test_imports_the_named_module_for_its_side_effects(tmp_path, monkeypatch):
    (tmp_path / "my_model_registry.py").write_text("import builtins\nbuiltins._hybridrl_external_seen = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_model_registry", raising=False)
    import builtins

    monkeypatch.setattr(builtins, "_hybridrl_external_seen", False, raising=False)
    import_external_lib("my_model_registry")
    assert builtins._hybridrl_external_seen is True
    assert "my_model_registry" in sys.modules


@pytest.mark.parametrize("name", [None, ""])
def test_no_name_imports_nothing(name):
    before = set(sys.modules)
    import_external_lib(name)
    assert set(sys.modules) == before


def test_a_missing_module_raises():
    with pytest.raises(ModuleNotFoundError):
        import_external_lib("hybridrl_no_such_module_xyz")
