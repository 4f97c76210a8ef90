"""Marked blocks of a page (between a begin and an end comment), which a generator rewrites and a person's
text around them keeps."""

from __future__ import annotations


def replace_marked(text: str, begin: str, end: str, block: str, what: str) -> str:
    """``text`` with everything from ``begin`` to ``end`` (markers included) replaced by ``block``;
    refused, naming ``what`` is missing, when the markers are not there in that order."""
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise ValueError(f"the page has no {what} between {begin!r} and {end!r}")
    return text[:start] + block + text[stop + len(end):]
