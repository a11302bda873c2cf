"""The error raised for a bad config: one line that names the key, the value and the fix."""


class ConfigError(ValueError):
    """A config key is unknown, has a bad value, or conflicts with another key.

    The message stands alone: which key(s), what is wrong, what to change.
    """
