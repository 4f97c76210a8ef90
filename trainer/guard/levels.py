"""How much prompt-following a person will trade, in plain words, as a limit on the guard's fall.

On the embedded model the guard is the scene reward, and the words mean a fall of its mean on
held-out prompts of at most 0.01 / 0.02 / 0.05. Another guard (PickScore, CLIP, HPS) has another
scale, so there the same words mean the same fall *in units of the guard's own spread*: the standard
deviation of its scores over the base model's validation images, measured at the start of every run.
The scene reward's spread over the embedded model's held-out images is ``SCENE_SPREAD`` (measured on
the shipped base), so "closely" is ``0.02 / SCENE_SPREAD`` of a guard's spread on any model
(docs/picks.md gives both figures).
"""

from __future__ import annotations

from ..config.schema import GUARD_WORDS

KEEP_LEVELS: dict[str, float] = {"strictly": 0.01, "closely": 0.02, "loosely": 0.05}
"""The allowed fall of the scene reward's held-out mean, by word."""
DEFAULT_KEEP = "closely"
OFF = "off"
SCENE_SPREAD = 0.186
"""Standard deviation of the scene reward over the embedded base model's held-out images (256 pairs,
eval seed 12345, 10 Euler steps)."""
GUARDED_PICKS_WEIGHT = 0.3
"""The picks weight a guarded reward is written at (the node, ``treerpo bench taste``); the guard then
trains at each of ``guard.weights`` (``trainer/guard/weights.py``) and this is the first of them.
With the strength search (``guard.search: bisect``) the weight matters less than
it did: the oracle trained at 0.3, 0.5 and 0.8 and then scaled back reached similar taste on most of the
tastes tried, while the method at 0.6 reached less than at 0.3 (it trained far past the limit, and the
strengths the search then took were coarse); at 0.15 a taste against the prompt barely moved
(docs/picks.md, "What each lever gives", renders the measurements)."""
SCENE_SCALE_GUARDS = ("scene",)
"""Guards whose words are read on the scene reward's own scale."""


assert set(GUARD_WORDS) == {*KEEP_LEVELS, OFF}, "the config's words and their limits must agree"


def check_keep(keep: str) -> str:
    """``keep`` itself, or one line listing the words it may be."""
    if keep not in GUARD_WORDS:
        raise ValueError(f"guard.keep must be one of {', '.join(GUARD_WORDS)}, got {keep!r}")
    return keep


def guard_limit(keep: str, guard_terms: list[str], guard_spread: float,
                explicit: float | None = None) -> float:
    """The largest fall of the guard's mean that the person allows.

    ``explicit``: a limit given as a number (``guard.limit``), used as it is. Otherwise the word's fall
    on the scene reward's scale when the guard is the scene reward alone, else that fall in units of
    the guard's spread (``guard_spread``, the std of its scores over the base model's validation
    images)."""
    if explicit is not None:
        if explicit < 0:
            raise ValueError(f"guard.limit must be >= 0, got {explicit}")
        return float(explicit)
    fall = KEEP_LEVELS[check_keep(keep)]
    if all(term in SCENE_SCALE_GUARDS for term in guard_terms):
        return fall
    if not guard_spread > 0:
        raise ValueError("the guard reward gives every validation image the same score: it cannot measure "
                         "prompt-following here (choose another guard reward)")
    return fall / SCENE_SPREAD * guard_spread
