"""The package versions the pack supports, checked where the pack or a feature loads.

Why: the pack installs into environments that dozens of other ComfyUI packs share. Its floors are
the lowest versions with which every feature gives the same results as the newest ones (CI runs the
fast tests at both ends), and a version outside a range is refused in one line that names the
package, the version found and the range, never run into silently different output.

``requirements.txt`` and ``pyproject.toml`` list the same ranges (``tests/test_packaging.py`` keeps the
three equal).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata

from packaging.version import InvalidVersion, Version


@dataclass(frozen=True)
class Supported:
    """One package's supported range, ``floor <= version < below``, and what the pack uses it for."""

    package: str
    floor: str
    below: str | None
    used_for: str

    @property
    def specifier(self) -> str:
        """The range as requirements.txt writes it, e.g. ``>=4.45,<6``."""
        return f">={self.floor}" + (f",<{self.below}" if self.below else "")

    def admits(self, version: str) -> bool:
        found = Version(version)
        if found < Version(self.floor):
            return False
        return self.below is None or found.release < Version(self.below).release


# Every requirement of requirements.txt, with the same range. Each floor is the lowest version at which
# the floor CI job (`make test-floor`) gives the default environment's images, scores and LoRA; each
# ceiling the next major release, which nobody has tested yet.
SUPPORTED: dict[str, Supported] = {s.package: s for s in (
    Supported("numpy", "1.25", None, "tensors to and from images; statistics"),
    Supported("pyyaml", "6.0.1", None, "training configs"),
    Supported("safetensors", "0.4.2", None, "every weight and LoRA file"),
    Supported("tqdm", "4.66", None, "progress bars of the headless trainer"),
    Supported("pillow", "10.1", None, "image grids, previews, reading images to score"),
    Supported("scipy", "1.10", None, "the scene reward's shape labelling; the benchmark's statistics"),
    Supported("matplotlib", "3.7", None, "Plot History and the Train LoRA node's reward curve"),
    Supported("transformers", "4.45", "6", "text encoders; the CLIP, PickScore and ImageReward rewards"),
    Supported("tokenizers", "0.20", "1", "the embedded model's tokenizer"),
    Supported("diffusers", "0.31", "1",
              "the embedded model's transformer; FLUX.1 and SD3 in the headless trainer"),
    Supported("peft", "0.13", "1", "the LoRA that training adds to every model"),
    Supported("huggingface_hub", "0.23.2", "3", "model folders of transformers and diffusers"),
)}
# What the pack checks when it loads: the packages whose API or outputs differ across releases.
CHECKED_AT_LOAD = ("transformers", "tokenizers", "diffusers", "peft", "huggingface_hub")


class UnsupportedVersion(ImportError):
    """A package's installed version is outside the range the pack supports (one-line message)."""


def installed_version(package: str) -> str | None:
    """The installed distribution's version, None when it is not installed."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def refusal(package: str, found: str | None, specifier: str, feature: str = "Dynamic-TreeRPO") -> str:
    """The one line that refuses ``found``: package, version found, range supported, what to run."""
    have = "is not installed" if found is None else f"{found} is installed"
    return (f"{feature} supports {package}{specifier}, but {package} {have}: "
            f"pip install '{package}{specifier}'")


def check_versions(packages: Iterable[str] | None = None) -> None:
    """Raise :class:`UnsupportedVersion` for the first package outside its range."""
    for name in packages if packages is not None else CHECKED_AT_LOAD:
        spec = SUPPORTED[name]
        found = installed_version(name)
        try:
            ok = found is not None and spec.admits(found)
        except InvalidVersion:
            ok = False
        if not ok:
            raise UnsupportedVersion(refusal(name, found, spec.specifier))


def require(package: str, floor: str, feature: str) -> None:
    """A feature that needs more than the pack's floor: refuse it, in one line, below ``floor``."""
    check_versions([package] if package in SUPPORTED else [])
    found = installed_version(package)
    if found is None or Version(found) < Version(floor):
        raise UnsupportedVersion(refusal(package, found, f">={floor}", feature))
