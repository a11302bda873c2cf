"""The user's Python file that a config key names (``custom_reward_function.path``,
``data.custom_cls.path``, ...), imported once as a module: the one loader the packages above share.

Standard library only (importing it stays light).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from typing import Any

from hybridrl.errors import ConfigError, UserError

__all__ = ["import_user_file", "load_user_object", "user_file_path"]

# full path -> ((mtime_ns, size) of the file when imported, module)
_LOADED: dict[str, tuple[tuple[int, int], Any]] = {}


def user_file_path(key: str, path, what: str, error: type[UserError] = ConfigError) -> str:
    """The absolute path of the file ``<key>=<path>`` names (``~`` expanded, relative to the
    working directory); ``what``: what the file should define, for the message.

    Raises:
        error: ``path`` is empty or no such file exists (one line naming ``key`` and the path).
    """
    if not path:
        raise error(f"{key} is empty; set it to the .py file that defines {what}")
    full = os.path.abspath(os.path.expanduser(str(path)))
    if not os.path.isfile(full):
        raise error(f"{key}={path!r}: file {full} does not exist; set it to the .py file that defines {what}")
    return full


def import_user_file(path: str, key: str, error: type[UserError] = ConfigError) -> Any:
    """Import the Python file at ``path`` (an absolute path) as a module and return it.

    The module is named ``hybridrl_user_<stem>_<hash of the path>`` and registered in
    ``sys.modules``, so that what it defines pickles by reference (Ray, worker processes, which
    import the same file under the same name) and dataclasses defined in the file work. Importing
    an unchanged file again returns the module already loaded (the same objects); a file changed
    on disk since is executed again.

    Raises:
        error: the file cannot be imported (one line naming ``key``, the file and the error).
    """
    stat = os.stat(path)
    stamp = (stat.st_mtime_ns, stat.st_size)
    loaded = _LOADED.get(path)
    if loaded is not None and loaded[0] == stamp and sys.modules.get(loaded[1].__name__) is loaded[1]:
        return loaded[1]
    digest = hashlib.sha1(path.encode()).hexdigest()[:12]
    stem = os.path.splitext(os.path.basename(path))[0]
    module_name = f"hybridrl_user_{stem}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise error(f"{key}={path!r} cannot be imported as a Python module; point it to a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        msg = str(exc).replace("\n", " ")
        raise error(
            f"{key}={path!r}: importing the file failed with {type(exc).__name__}: {msg}; fix the file"
        ) from exc
    _LOADED[path] = (stamp, module)
    return module


def load_user_object(key: str, path, name, what: str, error: type[UserError] = ConfigError) -> Any:
    """The object ``name`` that ``<key>=<path>`` points at, as verl loads one: ``pkg://a.b.c`` is the
    importable module ``a.b.c``, anything else a Python file (:func:`import_user_file`); ``what``:
    what it should be, for the messages.

    Raises:
        error: no name, a module that does not import, no such file, or no ``name`` in it (one line
            naming ``key``).
    """
    if not name:
        raise error(f"{key}={path!r} needs the name of {what} in it; set the key's class_name / name beside it")
    if str(path).startswith("pkg://"):
        module_name = str(path)[len("pkg://") :]
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise error(f"{key}={path!r}: module {module_name} does not import ({exc}); fix the path") from exc
    else:
        module = import_user_file(user_file_path(key, path, what, error), key, error)
    found = getattr(module, str(name), None)
    if found is None:
        raise error(f"{key}={path!r} defines no {name!r}; set the name of {what} defined there")
    return found
