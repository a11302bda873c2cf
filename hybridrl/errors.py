"""The base of every error that is the user's to fix, so it prints as one line.

Standard library only, so every layer may import it. A :class:`UserError` says what is wrong with
the user's config, data, files, model or reward function: which key or file, what is wrong, what
to do. The command line (:func:`hybridrl.cli.run_cli`) and the Ray worker guard print such an
error as one ``hybridrl: error: ...`` line; any other exception is a bug (ours or a library's)
and keeps its traceback. ``HYBRIDRL_DEBUG=1`` keeps the traceback of user errors too.

Each package's errors subclass ``UserError`` and also the built-in they always were
(``ValueError``, ``RuntimeError``, ...), so ``except ValueError`` written against earlier
versions, or against verl, still catches them.
"""

from __future__ import annotations

import os

__all__ = ["UserError", "ConfigError", "CheckpointError", "is_user_error", "keeps_traceback"]


class UserError(Exception):
    """Something the user must change; the message is one self-contained line."""


class ConfigError(UserError, ValueError):
    """A config key is unknown, has a bad value, or conflicts with another key.

    The message stands alone: which key(s), what is wrong, what to change. Every layer raises it
    (the config checks, the workers, the agents), so it lives here; ``hybridrl.config`` re-exports it.
    """


class CheckpointError(UserError, ValueError):
    """A checkpoint folder is incomplete, damaged, or does not fit this run (one line naming it).
    The driver and the workers both read checkpoints, so it lives here."""


def is_user_error(exc: BaseException) -> bool:
    """True for a :class:`UserError` or a missing file (``FileNotFoundError`` names its path)."""
    return isinstance(exc, (UserError, FileNotFoundError))


def keeps_traceback(exc: BaseException) -> bool:
    """True when ``exc`` should propagate with its traceback: it is not a user error, or
    ``HYBRIDRL_DEBUG`` is set."""
    return bool(os.environ.get("HYBRIDRL_DEBUG")) or not is_user_error(exc)
