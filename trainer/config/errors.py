"""The one error type of config loading (its own module: the YAML layout and the loader share it)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad config value, key or file; the message is one line and names the dotted key."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(part.strip() for part in str(message).splitlines() if part.strip()))
