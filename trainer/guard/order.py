"""Which kept checkpoint the guard measures next: the last one first, earlier ones only while needed.

Why: measuring a checkpoint on the validation pairs costs as many images as the pairs (512 by default),
far more than a round of training on a short run, and the guard chooses the most taste within the limit.
Training raises the taste as it goes, so when the last checkpoint is within the limit (and raised the
taste) it is almost always the choice and the earlier ones need not be measured; when it is past, the
guard walks back until one is (the strength search then works between them). Replayed on the stored benchmark
runs, which measured every checkpoint, it chose the same points with fewer measurements
(``treerpo bench taste-cost --replay``; docs/results-taste.md). ``guard.measure: every`` measures each
checkpoint as it is kept instead (what the experimental steering needs). Pure function.
"""

from __future__ import annotations

from collections.abc import Iterable

from .choice import allowed
from .trail import Trail


def next_to_measure(trail: Trail, kept: Iterable[int], margin: float) -> int | None:
    """The kept checkpoint (an iteration) to measure next at full strength, or None when the guard has
    what it needs. Walking back from the last kept checkpoint: the first one not yet measured, unless a
    later one already measured is within the limit and raised the taste above the base model's (a
    continued run's new checkpoints come before its earlier, measured ones; a run whose taste fell is
    measured further back, where it may have been higher)."""
    base = trail.base.taste
    for iteration in sorted((it for it in set(kept) if it > 0), reverse=True):
        point = trail.find(iteration, 1.0)
        if point is None:
            return iteration
        if allowed(trail, point, margin) and point.taste > base:
            return None
    return None
