"""Parsing and checking of the nodes' text widgets (shared by the training and reward nodes), so
that bad input fails at validation, before a graph runs, with the trainer's one-line messages."""

from __future__ import annotations

from pathlib import Path

from ..trainer.rewards.mix import bind_weights, parse_reward_spec


def parse_lines(text: str) -> list[str]:
    """Non-empty, non-comment lines of a multiline widget."""
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def parse_weights(text: str, base: str | Path | None = None) -> dict[str, str]:
    """``name=path`` lines -> ``{name: path}``; anything else is a one-line error. A relative path
    is taken under ``base`` (ComfyUI's models folder) when it exists there, so saved workflows do
    not depend on the folder ComfyUI was started from."""
    out: dict[str, str] = {}
    for line in parse_lines(text):
        name, sep, path = line.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ValueError(f"reward weights line {line!r}: expected name=path, "
                             "e.g. hps-v2.1=/models/hps.pt")
        path = path.strip()
        if base is not None and not Path(path).is_absolute() and (Path(base) / path).exists():
            path = str(Path(base) / path)
        out[name.strip()] = path
    return out


def check_rewards(reward: str, weights_text: str, base: str | Path | None = None) -> dict[str, str]:
    """The reward spec's names exist, each model reward has a weights path, and each path exists."""
    names = [t.name for t in parse_reward_spec(reward)]
    weights = parse_weights(weights_text, base)
    paths = bind_weights(names, [f"{name}={path}" for name, path in weights.items()])
    for name, path in paths.items():
        if not Path(path).exists():
            raise FileNotFoundError(f"weights of reward {name!r} not found: {path}")
    return paths
