"""Supported package versions and the differences between them, in one layer below everything else.

``versions``: the supported ranges and the one-line refusal of a version outside them.
``transformers_api``: every difference between transformers 4 and 5 the pack meets.
"""

from .versions import SUPPORTED, Supported, UnsupportedVersion, check_versions, require

__all__ = ["SUPPORTED", "Supported", "UnsupportedVersion", "check_versions", "require"]
