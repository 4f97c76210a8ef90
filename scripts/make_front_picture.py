"""The README's first picture: the picking panel in ComfyUI beside a before/after grid of a learnt taste.

Both halves are files the project makes: the panel is a screenshot that tests/test_ui_picks.py saves
(``screenshots/classic/picks_panel.png`` in pytest's temporary folder; the test prints where), and the
grid is a ``before_after.png`` of ``treerpo bench taste`` at the shipped default (now
``docs/images/taste_lower_objects_default.png``: ``--tastes lower_objects --trees 50 --at 50 --seeds 1
--frontier-weights 0.5``, its figures in ``docs/data/taste/taste_front/lower_objects/taste.json``). Run it
again when either changes:

    .venv/bin/python scripts/make_front_picture.py --panel PICKS_PANEL.png \
        --grid docs/images/taste_lower_objects_default.png --out docs/images/front.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from matplotlib import font_manager
from PIL import Image, ImageDraw, ImageFont

BACKGROUND = (255, 255, 255)
INK = (30, 30, 30)
# Where the sampling node with its panel sits in the 1400x900 screenshot of the pick-and-train template
# (left, top, right, bottom): the node's title bar to the line under its buttons.
PANEL_BOX = (494, 160, 955, 762)
HEIGHT = 420  # both halves are scaled to fit this height of picture under their titles
GAP, MARGIN, TITLE = 24, 16, 44
FIGURES = Path(__file__).resolve().parents[1] / "docs/data/taste/taste_front/lower_objects/taste.json"


def font(size: int, bold: bool = False) -> ImageFont.FreeTypeFont:
    """matplotlib's own DejaVu Sans: present wherever the project installs, unlike system fonts."""
    name = font_manager.findfont(font_manager.FontProperties(family="DejaVu Sans",
                                                             weight="bold" if bold else "normal"))
    return ImageFont.truetype(name, size)


def scaled(image: Image.Image, height: int) -> Image.Image:
    return image.resize((round(image.width * height / image.height), height), Image.Resampling.LANCZOS)


def compose(panel: Image.Image, grid: Image.Image, titles: tuple[str, str], note: str) -> Image.Image:
    """The panel and the grid side by side, each under a title, a note under the grid."""
    left = scaled(panel.convert("RGB").crop(PANEL_BOX), HEIGHT)
    right = scaled(grid.convert("RGB"), round(HEIGHT * 0.75))
    width = MARGIN * 2 + left.width + GAP + right.width
    out = Image.new("RGB", (width, MARGIN + TITLE + HEIGHT + 40), BACKGROUND)
    draw = ImageDraw.Draw(out)
    head, small = font(20, bold=True), font(16)
    x = MARGIN
    draw.text((x, MARGIN), titles[0], font=head, fill=INK)
    out.paste(left, (x, MARGIN + TITLE))
    x += left.width + GAP
    draw.text((x, MARGIN), titles[1], font=head, fill=INK)
    top = MARGIN + TITLE + (HEIGHT - right.height) // 2
    out.paste(right, (x, top))
    draw.multiline_text((x, top + right.height + 10), note, font=small, fill=INK, spacing=6)
    return out


def default_note(summary: dict) -> str:
    """The grid's caption, its figure read from the run that drew it (a figure typed here would go stale)."""
    n = list(summary["by_trees"])[-1]
    share, seeds = summary["by_trees"][n]["share_of_frontier"], len(summary["seeds"])
    return ("A taste for objects lower in the frame, on held-out prompts. Rows: before; after "
            f"{n} trees\nof picks with the shipped default ({seeds} seed{'s' if seeds > 1 else ''}: "
            f"{share:.0%} of the oracle's gain); an oracle's best")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--panel", type=Path, required=True, help="picks_panel.png of tests/test_ui_picks.py")
    parser.add_argument("--grid", type=Path, required=True, help="a taste's before/after grid")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--left-title", default="1. Click the images you like")
    parser.add_argument("--right-title", default="2. Train a LoRA on your picks")
    parser.add_argument("--figures", type=Path, default=FIGURES,
                        help="the grid's taste.json, whose share of the frontier the note quotes")
    parser.add_argument("--note", default=None, help="the note under the grid (default: from --figures)")
    args = parser.parse_args(argv)
    note = args.note or default_note(json.loads(args.figures.read_text(encoding="utf-8")))
    titles = (args.left_title, args.right_title)
    picture = compose(Image.open(args.panel), Image.open(args.grid), titles, note)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    picture.save(args.out, optimize=True)
    print(f"{args.out}: {picture.width}x{picture.height}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
