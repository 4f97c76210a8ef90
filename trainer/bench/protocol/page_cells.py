"""The cells the protocol's tables share: a comparison's figure, its p-values and its verdict, formatted
alike wherever a table shows them (the page's sections and the short verdict block)."""

from __future__ import annotations

import math

from .claims import Test

TEST_HEADER = ("difference (95% CI) | seeds | p, t test | p, exact | Holm p, t test | Holm p, exact | "
               "verdict")
TEST_RULE = "---|---|---|---|---|---|---"


def p_value(p: float | None) -> str:
    """A p-value in three significant digits, or "n/a" where no test ran."""
    return "n/a" if p is None or math.isnan(p) else f"{p:.3g}"


def comparison_cells(t: Test) -> str:
    """``difference (95% CI) | seeds | p t | p exact | Holm t | Holm exact | verdict``."""
    c = t.comparison
    if c is None:
        return f"{t.value_text()} | | | | | | **{t.verdict}**"
    p_t = f"{p_value(t.p_value)} (no spread: the exact test's)" if c.no_spread else p_value(t.p_value)
    verdict = "no verdict (a measurement: see below)" if t.verdict == "descriptive" else t.verdict
    return (f"{t.value_text()} | {c.n} | {p_t} | {p_value(t.p_exact)} | {p_value(t.p_adjusted)} | "
            f"{p_value(t.p_exact_adjusted)} | **{verdict}**")


def verdict_word(t: Test) -> str:
    """The verdict as a short table says it: "met", "not met", or "inconclusive" for everything else."""
    return t.verdict if t.verdict in ("met", "not met") else "inconclusive"


def short_value(t: Test) -> str:
    """A claim's figure in two significant digits, its 95% interval and the comparator it is against:
    the README's short form of ``Test.value_text`` (the page keeps four digits)."""
    c = t.comparison
    if c is None:
        return t.note
    sign = "" if t.offset else "+"
    d, lo, hi = (v + t.offset for v in (c.difference, c.low, c.high))
    unit = " images" if t.key.startswith(("time:images", "convergence:images")) else t.unit  # as measured
    text = f"{d:{sign}.2g}{unit} ({lo:{sign}.2g} .. {hi:{sign}.2g})"
    if t.binding is not None and t.union is not None:
        text += f" vs {t.binding.against}"
    return text
