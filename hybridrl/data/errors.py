"""The one error type of the data package (kept torch-free so preprocess scripts stay light)."""

from hybridrl.errors import UserError


class DataError(UserError, ValueError):
    """Bad data or data config; the message names the key or file, the problem and the fix."""
