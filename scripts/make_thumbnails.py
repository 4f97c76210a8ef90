"""Render the template browser's thumbnails: ``workflows/<title>.jpg`` beside each ``workflows/<title>.json``.

ComfyUI's template browser shows ``<name>.jpg`` from a pack's workflow folder on each template's card
(``/api/workflow_templates/<pack>/<name>.jpg``). The pictures are honest:

* a template that runs on the embedded model is run headless (``treerpo run-workflow`` on its API file,
  on the CPU) and the thumbnail is made of what it wrote: the images with their scores (the best leaf
  framed), or for training the images drawn after training and the reward curve;
* a template that needs FLUX.1-dev or Qwen-Image weights cannot run here: its thumbnail is the graph as
  ComfyUI's frontend draws it (opened in headless Chromium, as ``check_ui_workflows.py`` does), under a
  label saying which weights it needs and that it was not run.

    .venv/bin/python scripts/make_thumbnails.py                 # every template
    .venv/bin/python scripts/make_thumbnails.py best_of_tree    # some, by API id

Needs ComfyUI (``make comfyui``) and, for the graph pictures, a Chromium and Playwright (the test extra).
About a minute on two cores, training included.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from api_to_ui import TITLES  # noqa: E402

WORKFLOWS = REPO / "workflows"
SIDE = 512  # the cards are square
BACKGROUND = (32, 32, 32)
TEXT = (230, 230, 230)
MUTED = (160, 160, 160)
BEST = (74, 222, 128)
WARN = (251, 191, 36)
# templates that need weights this pack does not ship: what to say on their picture
NEEDS = {
    "flux_dev_template": ("Needs FLUX.1 dev weights", "and a GPU"),
    "flux_dev_train": ("Needs FLUX.1 dev weights", "and a GPU"),
    "flux_dev_train_fp8": ("Needs FLUX.1 dev weights", "and a 24 GB GPU"),
    "flux_pick_fp8": ("Needs FLUX.1 dev weights", "and a 24 GB GPU"),
    "qwen_image_train": ("Needs Qwen Image weights", "and a big GPU"),
}


def font(size: int, bold: bool = False) -> ImageFont.FreeTypeFont:
    """DejaVu Sans when installed (Debian's fonts-dejavu-core), else Pillow's own scalable font."""
    name = "DejaVuSans-Bold.ttf" if bold else "DejaVuSans.ttf"
    for folder in ("/usr/share/fonts/truetype/dejavu", "/usr/share/fonts/dejavu"):
        if (Path(folder) / name).is_file():
            return ImageFont.truetype(str(Path(folder) / name), size)
    return ImageFont.load_default(size)


def centred(draw: ImageDraw.ImageDraw, y: float, text: str, size: int, fill: tuple,
            bold: bool = False) -> None:
    draw.text((SIDE / 2, y), text, font=font(size, bold), fill=fill, anchor="mm")


# ------------------------------------------------------------------------------ runnable templates


def run_workflow(name: str, out: Path, file: Path | None = None) -> tuple[list[Path], dict[str, list[str]]]:
    """Run ``workflows/api/<name>.api.json`` (or ``file``) headless into ``out``: the files it wrote and the
    text outputs (``{node: lines}``) it printed."""
    command = [sys.executable, "-m", "dynamic_treerpo.trainer", "run-workflow",
               str(file or WORKFLOWS / "api" / f"{name}.api.json"), "--output", str(out)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env={**os.environ},
                          timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{name}: treerpo run-workflow failed:\n{done.stderr[-2000:]}")
    files, texts, node = [], {}, None
    for line in done.stdout.splitlines()[1:]:
        if line.startswith("node ") and line.endswith(" text:"):
            node = line.split()[1]
            texts[node] = []
        elif line.startswith("  ") and node is not None:
            texts[node].append(line[2:])
        elif line.startswith("  "):
            files.append(out / line.strip())
    return files, texts


def scores_of(lines: list[str]) -> list[float]:
    """The score column of a table printed by Best of Tree or Reward Score (``mean`` row left out)."""
    return [float(row.split("\t")[1]) for row in lines[1:] if not row.startswith("mean")]


def prompt_of(name: str, node: str, key: str) -> str:
    return json.loads((WORKFLOWS / "api" / f"{name}.api.json").read_text())[node]["inputs"][key]


def grid(canvas: Image.Image, images: list[Path], scores: list[float], top: int, cols: int, cell: int,
         best: int | None = None) -> int:
    """``images`` in ``cols`` columns from ``top``, each with its score under it, the ``best`` one framed;
    returns the y below the grid."""
    draw = ImageDraw.Draw(canvas)
    gap = (SIDE - cols * cell) // (cols + 1)
    rows = -(-len(images) // cols)
    for i, (file, score) in enumerate(zip(images, scores, strict=True)):
        x = gap + (i % cols) * (cell + gap)
        y = top + (i // cols) * (cell + 34)
        with Image.open(file) as image:
            canvas.paste(image.convert("RGB").resize((cell, cell), Image.Resampling.NEAREST), (x, y))
        mine = i == best
        draw.rectangle((x - 2, y - 2, x + cell + 1, y + cell + 1), outline=BEST if mine else (90, 90, 90),
                       width=4 if mine else 1)
        if mine:
            draw.rectangle((x, y, x + 52, y + 24), fill=BEST)
            draw.text((x + 26, y + 12), "best", font=font(17, True), fill=(11, 46, 19), anchor="mm")
        draw.text((x + cell / 2, y + cell + 17), f"{score:.3f}", font=font(20, mine),
                  fill=BEST if mine else TEXT, anchor="mm")
    return top + rows * (cell + 34)


def footer(canvas: Image.Image, prompt: str, note: str) -> None:
    draw = ImageDraw.Draw(canvas)
    lines = textwrap.wrap(f"\u201c{prompt}\u201d", 40)[:2]
    for k, line in enumerate(lines):
        centred(draw, SIDE - 74 + 24 * k - 12 * (len(lines) - 1), line, 19, TEXT)
    centred(draw, SIDE - 20, note, 18, MUTED)


def best_of_tree(name: str, out: Path) -> Image.Image:
    files, texts = run_workflow(name, out)
    scores = scores_of(texts["4"])
    leaves = sorted(f for f in files if "best_of_tree_leaves_" in f.name)
    canvas = Image.new("RGB", (SIDE, SIDE), BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    centred(draw, 26, "8 variations, the best one kept", 25, TEXT, bold=True)
    best = max(range(len(scores)), key=scores.__getitem__)
    below = grid(canvas, leaves, scores, 56, 4, 112, best)
    centred(draw, below + 14, "scene reward: higher is better", 18, MUTED)
    footer(canvas, prompt_of(name, "4", "prompt"), "made by this workflow on a CPU")
    return canvas


def sample_and_score(name: str, out: Path) -> Image.Image:
    files, texts = run_workflow(name, out)
    scores = scores_of(texts["7"])
    images = sorted(f for f in files if "sample_and_score_" in f.name)
    canvas = Image.new("RGB", (SIDE, SIDE), BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    mean = sum(scores) / len(scores)
    centred(draw, 26, f"4 images, scored: mean {mean:.3f}", 25, TEXT, bold=True)
    grid(canvas, images, scores, 54, 2, 140)
    footer(canvas, prompt_of(name, "2", "text"), "made by this workflow on a CPU; scene reward")
    return canvas


SAMPLE_PROMPT_NODE = "6"  # train_embedded's text encode node, whose prompt the trained model draws


def train_embedded(name: str, out: Path) -> Image.Image:
    files, _ = run_workflow(name, out)
    samples = sorted(f for f in files if "train_samples_" in f.name)
    history = next(f for f in files if "train_history_" in f.name)
    canvas = Image.new("RGB", (SIDE, SIDE), BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    centred(draw, 26, "a LoRA trained in 12 rounds", 25, TEXT, bold=True)
    with Image.open(history) as plot:
        panel = first_panel(plot.convert("RGB"))
    panel.thumbnail((SIDE - 24, 200), Image.Resampling.LANCZOS)
    canvas.paste(panel, ((SIDE - panel.width) // 2, 50))
    below = 50 + panel.height
    centred(draw, below + 24, "drawn by the trained model:", 19, MUTED)
    cell, gap = 110, (SIDE - 4 * 110) // 5
    for i, file in enumerate(samples[:4]):
        with Image.open(file) as image:
            canvas.paste(image.convert("RGB").resize((cell, cell), Image.Resampling.NEAREST),
                         (gap + i * (cell + gap), below + 44))
    footer(canvas, prompt_of(name, SAMPLE_PROMPT_NODE, "text"), "made by this workflow on a CPU")
    return canvas


def first_panel(plot: Image.Image) -> Image.Image:
    """The top panel of TreeRPO Plot History's figure (the reward, mean and best per round): down to the
    first white band across the figure below its title."""
    gray = plot.convert("L")
    width, height = gray.size
    white = [all(gray.getpixel((x, y)) > 250 for x in range(0, width, 4)) for y in range(height)]
    run = 0
    for y in range(height // 5, height):
        run = run + 1 if white[y] else 0
        if run >= 5:
            return plot.crop((0, 0, width, y - run + 1))
    return plot


EXAMPLE_PICKS = {1: True, 6: True, 3: False}  # leaf -> liked (True) or disliked (False), on the thumbnail


def pick_and_train(name: str, out: Path) -> Image.Image:
    """Only the sampling node runs (training waits for a person's picks): the first tree it stored, as the
    picking panel shows it, with example marks drawn as the panel draws a person's."""
    graph = json.loads((WORKFLOWS / "api" / f"{name}.api.json").read_text())
    sampling = {k: v for k, v in graph.items() if v["class_type"] in ("TreeRPOEmbeddedLoader",
                                                                       "TreeRPOSampleToPick")}
    out.mkdir(parents=True, exist_ok=True)
    (out / "sample.api.json").write_text(json.dumps(sampling))
    run_workflow(name, out, out / "sample.api.json")
    node = next(v for v in sampling.values() if v["class_type"] == "TreeRPOSampleToPick")
    trees = sorted((out / "treerpo_picks" / node["inputs"]["picks_folder"] / "trees").iterdir())
    leaves = sorted(trees[0].glob("leaf_*.png"))
    canvas = Image.new("RGB", (SIDE, SIDE), BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    centred(draw, 26, "Click what you like, train on it", 25, TEXT, bold=True)
    cell, cols = 112, 4
    gap = (SIDE - cols * cell) // (cols + 1)
    for i, file in enumerate(leaves):
        x, y = gap + (i % cols) * (cell + gap), 60 + (i // cols) * (cell + 16)
        with Image.open(file) as image:
            canvas.paste(image.convert("RGB").resize((cell, cell), Image.Resampling.NEAREST), (x, y))
        mark = EXAMPLE_PICKS.get(i)
        colour = (90, 90, 90) if mark is None else BEST if mark else (248, 113, 113)
        draw.rectangle((x - 2, y - 2, x + cell + 1, y + cell + 1), outline=colour,
                       width=1 if mark is None else 4)
        draw.text((x + 6, y + 4), str(i + 1), font=font(15, True), fill=TEXT)
        if mark is not None:
            label = "like" if mark else "no"
            draw.rectangle((x + cell - 48, y + cell - 24, x + cell, y + cell), fill=colour)
            draw.text((x + cell - 24, y + cell - 12), label, font=font(16, True), fill=(20, 20, 20),
                      anchor="mm")
    below = 60 + 2 * (cell + 16)
    centred(draw, below + 14, "the marks are an example: yours train the LoRA", 18, MUTED)
    footer(canvas, node["inputs"]["prompts"].splitlines()[0], "trees made by this workflow on a CPU")
    return canvas


RUNS: dict[str, Callable[[str, Path], Image.Image]] = {
    "best_of_tree": best_of_tree, "sample_and_score": sample_and_score, "train_embedded": train_embedded,
    "pick_and_train": pick_and_train}


# ------------------------------------------------------------------------------ templates that need weights


# In the page: the box around every node (title bars and badges included) on the screen, in pixels.
GRAPH_BOX = r"""
() => {
  const canvas = app.canvas, ds = canvas.ds, box = canvas.canvas.getBoundingClientRect();
  const rects = app.graph.nodes.map((node) => node.boundingRect);
  const x0 = Math.min(...rects.map((r) => r[0])), x1 = Math.max(...rects.map((r) => r[0] + r[2]));
  const y0 = Math.min(...rects.map((r) => r[1])) - 24, y1 = Math.max(...rects.map((r) => r[1] + r[3]));
  const screen = (x, y) => [(x + ds.offset[0]) * ds.scale + box.left,
                            (y + ds.offset[1]) * ds.scale + box.top];
  const [left, top] = screen(x0, y0), [right, bottom] = screen(x1, y1);
  return [left - 12, top - 12, right + 12, bottom + 12].map(Math.round);
}
"""


def graph_pictures(names: list[str], tmp: Path) -> dict[str, Image.Image]:
    """Each workflow as ComfyUI's frontend draws it, fitted into a 1400x900 page (the canvas alone)."""
    import check_ui_workflows as ui
    from comfyui_server import comfyui_dir

    comfyui = comfyui_dir()
    if comfyui is None:
        raise FileNotFoundError("no ComfyUI: run `make comfyui`")
    server = ui.start_server(comfyui.resolve(), tmp / "comfyui")
    tools = None
    try:
        tools, _ = ui.open_frontend(server, ui.find_browser(None))
        pictures = {}
        for name in names:
            ui.check_file(tools, WORKFLOWS / f"{TITLES[name]}.json", server.url)  # opened, dialogs closed
            shot = ui.save_screenshot(tools, tmp, name)  # fitted into view
            box = tools.evaluate(f"({GRAPH_BOX})()")
            with Image.open(shot) as page:
                pictures[name] = page.convert("RGB").crop(tuple(box))
        return pictures
    finally:
        if tools is not None:
            tools.close()
        ui.stop_server(server)


def needs_weights(name: str, graph: Image.Image) -> Image.Image:
    canvas = Image.new("RGB", (SIDE, SIDE), BACKGROUND)
    draw = ImageDraw.Draw(canvas)
    first, second = NEEDS[name]
    draw.rectangle((0, 0, SIDE, 132), fill=(58, 44, 8))
    centred(draw, 34, first, 30, WARN, bold=True)
    centred(draw, 72, second, 26, WARN, bold=True)
    centred(draw, 110, "not run here; the graph as ComfyUI draws it", 18, TEXT)
    graph.thumbnail((SIDE - 16, SIDE - 180), Image.Resampling.LANCZOS)
    canvas.paste(graph, ((SIDE - graph.width) // 2, 132 + (SIDE - 172 - graph.height) // 2))
    centred(draw, SIDE - 20, "files to download: workflows/README.md", 18, MUTED)
    return canvas


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"API ids (default: all of {', '.join(TITLES)})")
    args = parser.parse_args(argv)
    names = args.names or list(TITLES)
    unknown = [n for n in names if n not in RUNS and n not in NEEDS]
    if unknown:
        print(f"make_thumbnails: no thumbnail recipe for {unknown}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="treerpo_thumbnails_") as tmp:
        pictures = {n: RUNS[n](n, Path(tmp) / n) for n in names if n in RUNS}
        needs = [n for n in names if n in NEEDS]
        graphs = graph_pictures(needs, Path(tmp)) if needs else {}
        pictures |= {n: needs_weights(n, graph) for n, graph in graphs.items()}
        for name in names:
            target = WORKFLOWS / f"{TITLES[name]}.jpg"
            pictures[name].save(target, quality=88, optimize=True)
            print(f"wrote {target.relative_to(REPO)} ({target.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
