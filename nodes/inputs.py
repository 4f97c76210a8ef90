"""Parsing and checking of the nodes' text widgets (shared by the training and reward nodes), so
that bad input fails at validation, before a graph runs, with the trainer's one-line messages."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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


# ------------------------------------------------------------------------------ validation
# ComfyUI reports a message returned by ``validate_inputs`` once per input the method takes, each labelled
# with that input's name (so one bad value reads as several errors about other inputs), and skips its own
# min/max check of those inputs. The nodes therefore check those ranges themselves and *raise* one
# ``ValueError`` that starts with the input's name: ComfyUI reports a raised error once, with HTTP 400,
# before anything runs.


@contextmanager
def about(input_name: str) -> Iterator[None]:
    """Any ValueError / FileNotFoundError inside becomes one error naming ``input_name``."""
    try:
        yield
    except (ValueError, TypeError, FileNotFoundError) as err:
        message = str(err)
        if message.startswith(f"{input_name}: "):
            raise ValueError(message) from None
        raise ValueError(f"{input_name}: {message}") from None


def check_ranges(schema: Any, **values: float) -> None:
    """Each value within the min/max its input declares in ``schema`` (a V3 ``io.Schema``)."""
    declared = {i.id: i for i in schema.inputs}
    for name, value in values.items():
        spec = declared[name]
        low, high = getattr(spec, "min", None), getattr(spec, "max", None)
        if (low is not None and value < low) or (high is not None and value > high):
            raise ValueError(f"{name}: {value} is outside the allowed range {low} to {high}")


def check_embedded_text(text: str, input_name: str) -> None:
    """Text the embedded model's encoder can read, else one error listing the words it knows."""
    from ..trainer.embedded.architecture import known_words, unknown_words

    unknown = unknown_words(text)
    if unknown:
        words = ", ".join(repr(w) for w in unknown)
        raise ValueError(f"{input_name}: the embedded model does not know {words}; "
                         f"it knows: {' '.join(known_words())} (and commas)")


MIX = "mix"  # the reward dropdown's entry for a weighted list typed in reward_mix


def reward_spec(reward: str, reward_mix: str) -> str:
    """The reward named by the dropdown, or with ``mix`` the weighted list typed beside it."""
    if reward != MIX:
        return reward
    if not reward_mix.strip():
        raise ValueError("reward_mix: with reward 'mix', list the rewards and weights here, "
                         "e.g. hps-v2.1:0.7, ocr:0.3")
    return reward_mix.strip()

