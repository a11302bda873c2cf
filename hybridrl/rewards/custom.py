"""Load a user's reward function from a Python file (config ``custom_reward_function.path/name``).

The function is called by the reward manager as
``fn(data_source=..., solution_str=..., ground_truth=..., extra_info=..., **reward_kwargs)``
and returns a float or a dict with a ``"score"`` key, like the built-in scorers.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

from hybridrl.config.user_file import import_user_file, user_file_path
from hybridrl.errors import UserError

__all__ = ["RewardConfigError", "load_custom_reward_fn", "import_reward_file"]


class RewardConfigError(UserError, ValueError):
    """The reward configuration (custom function, manager, on_error, ...) is invalid."""


def import_reward_file(path: str) -> Any:
    """Import the reward file at ``path`` (an absolute path) as a module and return it
    (:func:`hybridrl.config.user_file.import_user_file`: registered in ``sys.modules`` under a name
    fixed by the path, so its functions pickle by reference; an unchanged file is imported once).

    Raises:
        RewardConfigError: the file cannot be imported (the message names it and the error).
    """
    return import_user_file(path, "custom_reward_function.path", RewardConfigError)


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
    full_path = user_file_path(
        "custom_reward_function.path", path, f"your reward function {name or 'compute_score'}", RewardConfigError
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
