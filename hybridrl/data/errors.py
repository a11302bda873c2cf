"""The one error type of the data package (kept torch-free so preprocess scripts stay light)."""


class DataError(ValueError):
    """Bad data or data config; the message names the key or file, the problem and the fix."""
