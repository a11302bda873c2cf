"""Load a user's reward function from a Python file (config ``custom_reward_function.path/name``).

The function is called by the reward manager as
``fn(data_source=..., solution_str=..., ground_truth=..., extra_info=..., **reward_kwargs)``
and returns a float or a dict with a ``"score"`` key, like the built-in scorers.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
from typing import Any, Callable, Mapping

from hybridrl.errors import UserError

__all__ = ["RewardConfigError", "load_custom_reward_fn", "import_reward_file"]


class RewardConfigError(UserError, ValueError):
    """The reward configuration (custom function, manager, on_error, ...) is invalid."""


# full path -> ((mtime_ns, size) of the file when imported, module)
_LOADED: dict[str, tuple[tuple[int, int], Any]] = {}


def import_reward_file(path: str) -> Any:
    """Import the Python file at ``path`` (an absolute path) as a module and return it.

    The module is named ``hybridrl_custom_reward_<stem>_<hash of the path>`` and registered in
    ``sys.modules``, so that its functions pickle by reference (Ray, the scoring processes of
    ``reward.num_workers``, which import the same file under the same name) and dataclasses
    defined in the file work. Importing an unchanged file again returns the module already
    loaded (the same function objects); a file changed on disk since is executed again.

    Raises:
        RewardConfigError: the file cannot be imported (the message names it and the error).
    """
    stat = os.stat(path)
    stamp = (stat.st_mtime_ns, stat.st_size)
    loaded = _LOADED.get(path)
    if loaded is not None and loaded[0] == stamp and sys.modules.get(loaded[1].__name__) is loaded[1]:
        return loaded[1]
    digest = hashlib.sha1(path.encode()).hexdigest()[:12]
    stem = os.path.splitext(os.path.basename(path))[0]
    module_name = f"hybridrl_custom_reward_{stem}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise RewardConfigError(
            f"custom_reward_function.path={path!r} cannot be imported as a Python module; point it to a .py file"
        )
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        msg = str(exc).replace("\n", " ")
        raise RewardConfigError(
            f"custom_reward_function.path={path!r}: importing the file failed with "
            f"{type(exc).__name__}: {msg}; fix the file"
        ) from exc
    _LOADED[path] = (stamp, module)
    return module


def load_custom_reward_fn(
    path: str,
    name: str = "compute_score",
    reward_kwargs: Mapping[str, Any] | None = None,
) -> Callable[..., Any]:
    """Import the Python file at ``path`` and return its function ``name``.

    Args:
        path: the file (config ``custom_reward_function.path``); relative paths are resolved
            against the current working directory.
        name: the function in that file (config ``custom_reward_function.name``).
        reward_kwargs: extra keyword arguments bound to the function with ``functools.partial``
            (config ``custom_reward_function.reward_kwargs``); ``None`` or empty binds nothing.

    Returns:
        The function, or a ``functools.partial`` of it when ``reward_kwargs`` is non-empty.

    Raises:
        RewardConfigError: the file does not exist, cannot be imported, or does not define a
            callable named ``name`` (the message lists the callables it does define).
    """
    if not path:
        raise RewardConfigError(
            "custom_reward_function.path is empty; set it to a .py file that defines "
            f"{name or 'compute_score'}, or leave custom_reward_function unset"
        )
    full_path = os.path.abspath(os.path.expanduser(str(path)))
    if not os.path.isfile(full_path):
        raise RewardConfigError(
            f"custom_reward_function.path={path!r}: file {full_path} does not exist; "
            "set it to the .py file that defines your reward function"
        )
    module = import_reward_file(full_path)
    fn = getattr(module, name, None) if isinstance(name, str) and name else None
    if not callable(fn):
        defined = sorted(
            k
            for k, v in vars(module).items()
            if callable(v) and not k.startswith("_") and getattr(v, "__module__", None) == module.__name__
        )
        raise RewardConfigError(
            f"custom_reward_function.name={name!r} is not a function in {full_path}; "
            f"callables defined there: {defined or 'none'}. Set custom_reward_function.name "
            "to one of them"
        )
    if reward_kwargs:
        return functools.partial(fn, **dict(reward_kwargs))
    return fn
