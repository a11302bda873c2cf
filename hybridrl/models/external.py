"""``model.external_lib``: a user's module imported before a model loads (verl's key), e.g. one
that registers a model class with transformers' ``AutoModel`` classes."""

from __future__ import annotations

import importlib


def import_external_lib(name: str | None) -> None:
    """Imports the module ``name`` (dotted, importable from ``sys.path``) for its side effects;
    nothing when ``name`` is None or empty.

    Raises:
        ModuleNotFoundError: no module of that name can be found.
        Exception: whatever the module raises while it is imported.
    """
    if name:
        importlib.import_module(name)
