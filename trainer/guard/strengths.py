"""Where to measure a checkpoint at lower LoRA strengths (``guard.search: bisect``).

Along one checkpoint's line from the base model (strength 0) to the trained LoRA (strength 1) the taste
grows with the strength, so the strongest strength whose fall fits the limit holds the most of that
checkpoint's taste. The fall is far from proportional to the strength: on the embedded model it stays
near 0 up to about half strength and then climbs (docs/picks.md gives one run's measurements), so a
guess from a straight line lands well below the limit. Halving the interval
between the strongest strength known to fit and the weakest known not to finds it to 1/2^tries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


def bisect_strength(known: Iterable[tuple[float, bool]], tries: int, fits: Callable[[float], bool],
                    digits: int = 3) -> float:
    """The strongest strength found to fit, after at most ``tries`` measurements.

    ``known``: strengths already measured, each with whether it fit (strength 0, the base model, always
    fits and 1 is where the search starts from when it did not); ``fits(strength)``: measure one strength
    and say whether its fall, with the margin, is within the limit. Strengths are rounded to ``digits``
    decimals; the search stops early once the interval cannot be halved at that precision."""
    low, high = 0.0, 1.0
    for strength, ok in known:
        if ok:
            low = max(low, strength)
        else:
            high = min(high, strength)
    for _ in range(tries):
        middle = round((low + high) / 2, digits)
        if middle in (low, high) or low >= high:
            break
        if fits(middle):
            low = middle
        else:
            high = middle
    return low
