"""The reward spec as the guard splits it: the taste term (``picks``, or a benchmark's hidden taste) and
the terms that guard prompt-following, and the spec with the taste at another weight.

Pure functions of the spec: the guard (:mod:`.tracker`) measures its guard terms, the online picks
trainer (``trainer/training/from_picks.py``) scores the stored leaves with them, and the training layer
trains at each picks weight the guard tries (``trainer/training/weighted.py``).
"""

from __future__ import annotations

from ..rewards.mix import parse_reward_spec
from ..rewards.registry import PICKS


def guard_spec(reward: str, taste: str = PICKS, rescale: bool = True) -> str:
    """The terms of ``reward`` other than the taste, as a spec: the guard. ``rescale``: their weights
    rescaled to sum to 1 (the guard measures their mix on its own); off, as written (beside the taste, as
    the reward weighs them). A reward with no other term is an error: nothing would guard."""
    terms = [t for t in parse_reward_spec(reward) if t.name != taste]
    if not terms:
        raise ValueError(f"reward {reward!r} has no term besides {taste!r} to guard prompt-following with: "
                         "add one, e.g. scene (embedded model) or pickscore, or set guard.keep=off")
    total = sum(t.weight for t in terms) if rescale else 1.0  # a weight divided by 1.0 is itself, exactly
    return ",".join(f"{t.name}:{t.weight / total:g}" for t in terms)


def spec_at(reward: str, taste: str, weight: float) -> str:
    """``reward`` with the ``taste`` term at ``weight`` and the other terms sharing ``1 - weight`` as they
    were written: ``spec_at('picks:0.3,scene:0.7', 'picks', 0.5) == 'picks:0.5,scene:0.5'``."""
    terms = parse_reward_spec(reward)
    if taste not in {t.name for t in terms}:
        raise ValueError(f"reward {reward!r} has no {taste!r} term to weigh")
    others = sum(t.weight for t in terms if t.name != taste)
    if others <= 0:
        raise ValueError(f"reward {reward!r} has no term besides {taste!r} to share 1 - {weight:g}")
    return ",".join(f"{t.name}:{weight if t.name == taste else (1.0 - weight) * t.weight / others:.6g}"
                    for t in terms)
