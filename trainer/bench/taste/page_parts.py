"""Small pieces every section of the taste page uses: the markers of a section, a gain with its interval,
the commands and the code version that made the figures, and how well the guard stated its error.

Why apart from ``page.py``: the family's and the template's sections (``family_page.py``) use them too,
and ``page.py`` adds those sections' tables to the main one, so sharing them through ``page.py`` would
make the two modules import each other.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

MARK = "<!-- bench taste{key}: {edge} -->"


def marks(key: str) -> tuple[str, str]:
    """The begin and end lines of the section of ``key``."""
    return MARK.format(key=f" {key}", edge="begin"), MARK.format(key=f" {key}", edge="end")


def with_ci(e: dict[str, Any], digits: int = 3) -> str:
    """A mean with its 95% interval (the mean alone where one seed gives no interval)."""
    mean, half = e["mean"], e["ci95"]
    if not math.isfinite(half):
        return f"{mean:+.{digits}f}"
    return f"{mean:+.{digits}f} ({mean - half:+.{digits}f} to {mean + half:+.{digits}f})"


def run_commands(summaries: Sequence[dict[str, Any]], command: str) -> list[str]:
    """The commands that made the figures (each taste's run, in order) and this one when it adds something:
    a ``--report`` that only repeats a run which already wrote the page is left out, so reporting again
    leaves the page as it was."""
    runs = list(dict.fromkeys(s.get("command") or command for s in summaries))
    repeats = command in runs or command.replace(" --report", "") in runs
    return [*as_loop(runs), *([] if repeats else [command])]


def as_loop(runs: list[str]) -> list[str]:
    """Runs that differ only in the taste they name, written as one shell loop over the tastes (the same
    commands, in order), so that a page of many tastes stays readable; other runs as they are."""
    tastes = [re.search(r"--tastes (\S+)", run) for run in runs]
    shapes = {run.replace(m.group(0), "--tastes $t") for run, m in zip(runs, tastes, strict=True) if m}
    if len(runs) < 3 or not all(tastes) or len(shapes) != 1:
        return runs
    names = " ".join(m.group(1) for m in tastes if m)
    return [f"for t in {names}; do", f"  {shapes.pop()}", "done"]


def code_line(summaries: Sequence[dict[str, Any]]) -> str:
    """Which code version made the figures: one commit for a published run, else every version named."""
    from ..common.provenance import distinct, machines_line
    from ..common.provenance import version_name as name

    found = [v for s in summaries for v in s.get("code", [])]
    unique = distinct(found)
    if not unique:
        return "These runs recorded no code version (made before 0.3.1)."
    where = machines_line(found)
    where = f" {where}" if where else ""
    if len(unique) == 1:
        return f"Made at one code version: {name(unique[0])}.{where}"
    return "Made by **more than one code version**: " + ", ".join(map(name, unique)) + f".{where}"


def with_space(sentence: str) -> str:
    """A sentence to follow another on the same line: a space before it, nothing where it is empty."""
    return f" {sentence}" if sentence else ""


def calibration_words(calibration: dict[str, Any]) -> str:
    """One sentence on whether the guard's standard error was right on these runs (``stated_risk``'s
    ``calibration``); empty where fewer than two runs chose a checkpoint."""
    if calibration["n"] < 2:
        return ""
    return (f"The chosen checkpoints' test fall minus validation fall, in units of the spread the guard's "
            f"standard error states for it: mean {calibration['mean']:+.2f}, standard deviation "
            f"{calibration['sd']:.2f} over {calibration['n']} runs (0 and 1 when the stated error is right; "
            "a positive mean is the choice favouring points whose validation fall came out low)."
            + (" Every one of these runs validated on the same pairs and was tested on the same pairs, so "
               "their errors share one draw of the two sets and are not independent (where the runs move "
               "the images alike, a standard deviation below 1 shows it): the chances above treat the runs "
               "as independent, so a count far from the expected one is weaker evidence than its chance "
               "says."
               if calibration.get("shared") else ""))
