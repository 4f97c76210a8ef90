"""Parsing and checking of the nodes' text widgets (shared by the training and reward nodes), so
that bad input fails at validation, before a graph runs, with the trainer's one-line messages."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..trainer.rewards.mix import bind_weights, parse_reward_spec


def parse_lines(text: str) -> list[str]:
    """Non-empty, non-comment lines of a multiline widget."""
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


ALLOW_ANY_PATH = "TREERPO_ALLOW_ANY_PATH"


def confined(path: str | Path, roots: Sequence[str | Path], what: str) -> str:
    """``path`` resolved, refused (one line) when it lies outside every folder of ``roots``
    (ComfyUI's model folders): a shared workflow must not make the server read arbitrary files.
    Setting the environment variable ``TREERPO_ALLOW_ANY_PATH=1`` for ComfyUI lifts the rule."""
    resolved = Path(path).expanduser().resolve()
    if os.environ.get(ALLOW_ANY_PATH) == "1" or not roots:
        return str(resolved)
    if any(resolved.is_relative_to(Path(root).resolve()) for root in roots):
        return str(resolved)
    raise ValueError(f"{what} {path} is outside ComfyUI's model folders (e.g. {roots[0]}): put it there, "
                     f"or start ComfyUI with {ALLOW_ANY_PATH}=1")


def parse_weights(text: str, base: str | Path | None = None,
                  roots: Sequence[str | Path] = ()) -> dict[str, str]:
    """``name=path`` lines -> ``{name: path}``; anything else is a one-line error. A relative path
    is taken under ``base`` (ComfyUI's models folder), so saved workflows do not depend on the
    folder ComfyUI was started from; with ``roots``, a path outside them is refused."""
    out: dict[str, str] = {}
    for line in parse_lines(text):
        name, sep, path = line.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ValueError(f"reward weights line {line!r}: expected name=path, "
                             "e.g. hps-v2.1=rewards/hps.pt")
        path = path.strip()
        if base is not None and not Path(path).is_absolute():
            path = str(Path(base) / path)
        what = f"weights path of reward {name.strip()!r}"
        out[name.strip()] = confined(path, roots, what) if roots else path
    return out


def check_rewards(reward: str, weights_text: str, base: str | Path | None = None,
                  roots: Sequence[str | Path] = ()) -> dict[str, str]:
    """The reward spec's names exist, each model reward has a weights path, and each path exists
    (inside ``roots``, when given)."""
    names = [t.name for t in parse_reward_spec(reward)]
    weights = parse_weights(weights_text, base, roots)
    paths = bind_weights(names, [f"{name}={path}" for name, path in weights.items()])
    for name, path in paths.items():
        if not Path(path).exists():
            raise FileNotFoundError(f"weights of reward {name!r} not found: {path}")
    return paths
