"""The saved workflows (workflows/): each runs to success in a real ComfyUI server and in-process
through ``treerpo run-workflow``; the UI files are the same graphs as the API files and use only
nodes, inputs and widgets the server knows; the FLUX and Qwen-Image templates are refused for exactly
their missing model files, and their loaders name where to get each. The UI files are the template
browser's templates: named in plain words, each with its thumbnail; and the nodes' plain-words input
labels reach the frontend (locales/en/nodeDefs.json, served at /i18n)."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from comfyui_server import REPO, Server, require_comfyui, start_server, stop_server
from PIL import Image

from dynamic_treerpo.trainer.comfyui_host.workflow_format import node_inputs, ui_to_api

TREERPO = [sys.executable, "-m", "dynamic_treerpo.trainer"]  # the `treerpo` command


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


API_TO_UI = _script("api_to_ui")  # the UI files' names (TITLES) and how they are written
NODE_LABELS = _script("node_labels")

WORKFLOWS = REPO / "workflows"
NAMES = ("train_embedded", "sample_and_score", "best_of_tree", "flux_dev_template", "flux_dev_train",
         "qwen_image_train", "pick_and_train", "flux_dev_train_fp8", "flux_pick_fp8")
FLUX_FILES = {"flux1-dev.safetensors", "clip_l.safetensors", "t5xxl_fp16.safetensors", "ae.safetensors",
              "HPS_v2.1_compressed.pt"}
QWEN_FILES = {"qwen_image_fp8_e4m3fn.safetensors", "qwen_2.5_vl_7b_fp8_scaled.safetensors",
              "qwen_image_vae.safetensors", "HPS_v2.1_compressed.pt"}
# the 24 GB templates: FLUX.1-dev kept in fp8 by UNETLoader, T5-XXL in fp8; the picks one guards with
# PickScore
FLUX_FP8_FILES = {"flux1-dev.safetensors", "clip_l.safetensors", "t5xxl_fp8_e4m3fn.safetensors",
                  "ae.safetensors"}
TEMPLATE_FILES = {"flux_dev_template": FLUX_FILES, "flux_dev_train": FLUX_FILES,
                  "qwen_image_train": QWEN_FILES,
                  "flux_dev_train_fp8": FLUX_FP8_FILES | {"HPS_v2.1_compressed.pt"},
                  "flux_pick_fp8": FLUX_FP8_FILES | {"PickScore_v1"}}
REWARD_FILES = {"HPS_v2.1_compressed.pt", "PickScore_v1"}  # named by a node's weights widget, not a loader
# how ComfyUI reports a pack node's refusal (raised by validate_inputs so that it is reported once): on the
# output node itself, or on a node upstream of it
REFUSED = ("exception_during_validation", "exception_during_inner_validation")
TEMPLATE_SOURCES = {"flux1-dev.safetensors": "black-forest-labs/FLUX.1-dev",
                    "t5xxl_fp16.safetensors": "comfyanonymous/flux_text_encoders",
                    "t5xxl_fp8_e4m3fn.safetensors": "comfyanonymous/flux_text_encoders",
                    "qwen_image_fp8_e4m3fn.safetensors": "Comfy-Org/Qwen-Image_ComfyUI",
                    "qwen_2.5_vl_7b_fp8_scaled.safetensors": "Comfy-Org/Qwen-Image_ComfyUI"}
# image output node -> (file name prefix, image count, image side) of each runnable workflow
IMAGES = {
    "train_embedded": {"5": ("treerpo/train_history", 1, None), "10": ("treerpo/train_samples", 4, 64)},
    "sample_and_score": {"6": ("treerpo/sample_and_score", 4, 64)},
    "best_of_tree": {"5": ("treerpo/best_of_tree_best", 1, 64), "6": ("treerpo/best_of_tree_leaves", 8, 64)},
}
LORA = "loras/treerpo_embedded.safetensors"


def api(name: str) -> dict:
    return json.loads((WORKFLOWS / "api" / f"{name}.api.json").read_text())


def ui_file(name: str) -> Path:
    """``workflows/<title>.json`` of the API id ``name``."""
    return API_TO_UI.ui_path(WORKFLOWS / "api" / f"{name}.api.json")


def ui(name: str) -> dict:
    return json.loads(ui_file(name).read_text())


@pytest.fixture(scope="module")
def comfyui() -> Path:
    return require_comfyui()


@pytest.fixture(scope="module")
def server(comfyui: Path, tmp_path_factory) -> Iterator[Server]:
    srv = start_server(comfyui, tmp_path_factory.mktemp("comfyui"))
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def object_info(server: Server) -> dict:
    return server.get("/object_info")


def run_cli(comfyui: Path, *args: str) -> subprocess.CompletedProcess:
    """``treerpo run-workflow`` from the repo root, where this checkout's ``nodes/`` folder must not
    shadow ComfyUI's ``nodes`` module."""
    env = {**os.environ, "TREERPO_COMFYUI": str(comfyui), "PYTHONUNBUFFERED": "1"}
    return subprocess.run([*TREERPO, "run-workflow", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


def load_png(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


def check_outputs(name: str, output: Path, listed: list[Path] | None = None) -> None:
    """The images, LoRA and score tables a user of the workflow gets, in ``output``."""
    for prefix, count, side in IMAGES[name].values():
        files = sorted(output.glob(f"{prefix}_*.png"))
        assert len(files) == count, (prefix, files)
        for file in files:
            image = load_png(file)
            assert image.std() > 5, file  # content, not a flat field
            if side is not None:
                assert image.shape[:2] == (side, side), (file, image.shape)
        if listed is not None:
            assert set(files) <= set(listed), (files, listed)
    if name == "train_embedded":
        from safetensors.torch import load_file

        state = load_file(output / LORA)
        ups = [v for k, v in state.items() if k.endswith("lora_up.weight")]
        assert ups and any(float(v.abs().max()) > 0 for v in ups)  # trained, not the zero init
        assert all(k.startswith("diffusion_model.") for k in state)  # ComfyUI's key format
    if name == "best_of_tree":  # the best image is the leaf with the highest reward
        leaves = [load_png(f) for f in sorted(output.glob("treerpo/best_of_tree_leaves_*.png"))]
        best = load_png(next(output.glob("treerpo/best_of_tree_best_*.png")))
        matches = [i for i, leaf in enumerate(leaves) if np.array_equal(leaf, best)]
        assert len(matches) == 1, matches


def table_rows(text: str) -> list[list[str]]:
    return [line.split("\t") for line in text.strip().splitlines()]


def check_tables(name: str, texts: dict[str, list[str]]) -> None:
    if name == "sample_and_score":
        rows = table_rows(texts["7"][0])
        assert rows[0] == ["image", "scene"] and rows[-1][0] == "mean" and len(rows) == 6, rows
        assert abs(np.mean([float(r[1]) for r in rows[1:-1]]) - float(rows[-1][1])) < 1e-3
    if name == "best_of_tree":
        rows = table_rows(texts["4"][0])[1:]
        scores = [float(r[1]) for r in rows]
        assert len(rows) == 8 and [r[-1] for r in rows].count("<- best") == 1
        assert rows[int(np.argmax(scores))][-1] == "<- best"


def test_the_template_browser_lists_the_packs_ui_workflows(server: Server) -> None:
    """ComfyUI serves a pack's ``workflows/*.json`` as its templates, under the pack's folder name: every
    UI workflow is listed (the API files in ``workflows/api/`` are not) under its plain-words name (the
    browser's title and description) and is served as it is on disk, with its thumbnail (a small JPEG)."""
    from comfyui_server import PACK_NAME

    listed = server.get("/workflow_templates")
    assert sorted(listed[PACK_NAME]) == sorted(ui_file(name).stem for name in NAMES)
    for name in NAMES:
        title = ui_file(name).stem
        assert "_" not in title and title == API_TO_UI.TITLES[name]
        quoted = urllib.parse.quote(title)
        assert server.get(f"/api/workflow_templates/{PACK_NAME}/{quoted}.json") == ui(name)
        with urllib.request.urlopen(f"{server.url}/api/workflow_templates/{PACK_NAME}/{quoted}.jpg") as reply:
            assert reply.headers["Content-Type"] == "image/jpeg"
            data = reply.read()
        assert len(data) < 100_000, (title, len(data))
        with Image.open(io.BytesIO(data)) as image:
            assert image.format == "JPEG" and image.size == (512, 512), (title, image.size)
        assert (ui_file(name).with_suffix(".jpg")).read_bytes() == data


def test_templates_open_fitted_to_the_window(object_info: dict) -> None:
    """No saved view (``extra.ds``) in a template: the frontend then fits the graph into the window when it
    opens it (scripts/api_to_ui.py; tests/test_ui_frontend.py checks every node is whole in view)."""
    for name in NAMES:
        assert "ds" not in ui(name).get("extra", {}), name


def test_every_input_has_a_plain_words_label_that_reaches_the_frontend(server: Server,
                                                                        object_info: dict) -> None:
    """Every input of every pack node declares a label (``display_name``) without the raw id's underscores;
    frontend 1.32.9 reads labels from translations only, so locales/en/nodeDefs.json holds them (written by
    scripts/node_labels.py from the schemas) and the server serves them at /i18n. Saved workflows and API
    graphs keep the input ids (the tests above)."""
    pack = {k: v for k, v in object_info.items() if k.startswith("TreeRPO")}
    for node, definition in pack.items():
        for group in ("required", "optional"):
            for name, spec in definition["input"].get(group, {}).items():
                label = (spec[1] if len(spec) > 1 else {}).get("display_name")
                assert label and "_" not in label, (node, name, label)
    written = json.loads(NODE_LABELS.LOCALE_FILE.read_text(encoding="utf-8"))
    assert written == NODE_LABELS.labels(object_info), "stale: run scripts/node_labels.py"
    served = server.get("/i18n")["en"]["nodeDefs"]
    assert all(served[node] == labels for node, labels in written.items())


# ------------------------------------------------------------------------------ formats


@pytest.mark.parametrize("name", NAMES)
def test_ui_file_converts_back_to_the_api_graph(name: str, object_info: dict) -> None:
    assert ui_to_api(ui(name), object_info) == api(name)


@pytest.mark.parametrize("name", NAMES)
def test_ui_file_is_what_api_to_ui_writes_now(name: str, object_info: dict) -> None:
    """A stale UI file (a node's widgets or outputs changed) fails here: regenerate it with
    ``python scripts/api_to_ui.py workflows/api/*.api.json``."""
    fresh = API_TO_UI.ui_workflow(api(name), object_info, name)
    assert fresh == ui(name), f"{ui_file(name).name} is stale: run scripts/api_to_ui.py"


@pytest.mark.parametrize("name", NAMES)
def test_ui_file_uses_only_nodes_inputs_and_widgets_the_server_knows(name: str, object_info: dict) -> None:
    workflow = ui(name)
    nodes = {n["id"]: n for n in workflow["nodes"]}
    for node in workflow["nodes"]:
        assert node["type"] in object_info, node["type"]
        definition = object_info[node["type"]]
        specs = {s.name: s for s in node_inputs(definition)}
        widgets = [s for s in specs.values() if s.widget]
        assert len(node["widgets_values"]) == len(widgets) + sum(s.control for s in widgets), node["type"]
        for entry in node["inputs"]:
            spec = specs.get(entry["name"])
            assert spec is not None and spec.type == entry["type"], (node["type"], entry)
        assert [(o["name"], o["type"]) for o in node["outputs"]] == list(zip(
            definition["output_name"], definition["output"], strict=True))
    for link_id, src, src_slot, dst, dst_slot, link_type in workflow["links"]:
        assert nodes[src]["outputs"][src_slot]["type"] == link_type
        assert link_id in nodes[src]["outputs"][src_slot]["links"]
        assert nodes[dst]["inputs"][dst_slot]["link"] == link_id
        assert nodes[dst]["inputs"][dst_slot]["type"] in (link_type, "*")


def test_ui_conversion_skips_notes_and_follows_reroutes_and_bypassed_nodes(object_info: dict) -> None:
    """What a user's edited UI file may hold: a note, a reroute on a link, a bypassed node."""
    workflow = ui("sample_and_score")
    decode = next(n for n in workflow["nodes"] if n["type"] == "TreeRPOEmbeddedDecode")
    save = next(n for n in workflow["nodes"] if n["type"] == "SaveImage")
    link = next(lk for lk in workflow["links"] if lk[3] == save["id"])
    workflow["nodes"] += [
        {"id": 50, "type": "Note", "inputs": [], "outputs": [], "widgets_values": ["a note"]},
        {"id": 51, "type": "Reroute", "inputs": [{"name": "", "type": "*", "link": 90}],
         "outputs": [{"name": "", "type": "IMAGE", "links": [91]}], "widgets_values": []},
        {"id": 52, "type": "ImageInvert", "mode": 4,
         "inputs": [{"name": "image", "type": "IMAGE", "link": 91}],
         "outputs": [{"name": "IMAGE", "type": "IMAGE", "links": [link[0]]}], "widgets_values": []}]
    workflow["links"] += [[90, decode["id"], 0, 51, 0, "IMAGE"], [91, 51, 0, 52, 0, "IMAGE"]]
    link[1:3] = [52, 0]
    assert ui_to_api(workflow, object_info) == api("sample_and_score")


# ------------------------------------------------------------------------------ running


@pytest.mark.parametrize("name", list(IMAGES))
def test_workflow_runs_in_the_server(name: str, server: Server) -> None:
    result = server.run(api(name), timeout=500)
    assert result["status"]["status_str"] == "success", result["status"]
    output = server.base / "output"
    for node, (prefix, count, _) in IMAGES[name].items():
        images = result["outputs"][node]["images"]
        assert len(images) == count and all(i["type"] == "output" for i in images)
        assert all(f"{i['subfolder']}/{i['filename']}".startswith(prefix) for i in images)
    check_outputs(name, output)
    check_tables(name, {node: ui.get("text", []) for node, ui in result["outputs"].items()})


@pytest.mark.parametrize(("name", "kind"), [(n, "api") for n in IMAGES] + [("sample_and_score", "ui")])
def test_workflow_runs_in_process_with_treerpo_run_workflow(name: str, kind: str, comfyui: Path,
                                                            tmp_path: Path) -> None:
    file = WORKFLOWS / "api" / f"{name}.api.json" if kind == "api" else ui_file(name)
    out = (tmp_path / "out").resolve()
    done = run_cli(comfyui, str(file), "--output", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].endswith(f"output folder: {out}"), lines
    listed = [out / line.strip() for line in lines[1:] if line.startswith("  ") and "\t" not in line]
    check_outputs(name, out, listed)
    if name == "train_embedded":
        assert out / LORA in listed
    texts: dict[str, list[str]] = {}  # the summary's "node N text:" blocks
    for i, line in enumerate(lines):
        if line.startswith("node ") and line.endswith(" text:"):
            block = []
            for following in lines[i + 1:]:
                if not following.startswith("  "):
                    break
                block.append(following[2:])
            texts[line.split()[1]] = ["\n".join(block)]
    check_tables(name, texts)
    for node in api(name).values():  # the progress report names each node that ran
        assert f"({node['class_type']})" in done.stderr


@pytest.mark.parametrize("name", TEMPLATE_FILES)
def test_template_is_refused_by_the_server_for_its_missing_files_only(server: Server, name: str) -> None:
    files = TEMPLATE_FILES[name]
    status, body = server.post_prompt(api(name))
    assert status == 400 and body["error"]["type"] == "prompt_outputs_failed_validation", body
    named: set[str] = set()
    for node_id, entry in body["node_errors"].items():
        for error in entry["errors"]:
            assert error["type"] in ("value_not_in_list", *REFUSED), (node_id, error)
            found = {f for f in files if f in error["details"]}
            assert len(found) == 1, (node_id, error)  # each error is about one missing file
            named |= found
    assert named == files


@pytest.mark.parametrize("name", TEMPLATE_FILES)
def test_template_loaders_name_their_downloads(object_info: dict, name: str) -> None:
    nodes = ui(name)["nodes"]
    models = {m["name"]: m for n in nodes for m in n["properties"].get("models", [])}
    assert set(models) == TEMPLATE_FILES[name] - REWARD_FILES
    assert all(m["url"].startswith("https://huggingface.co/") and m["url"].endswith(file)
               for file, m in models.items())
    for file, repo in TEMPLATE_SOURCES.items():
        if file in models:
            assert f"huggingface.co/{repo}/" in models[file]["url"]


@pytest.mark.parametrize("name", TEMPLATE_FILES)
def test_template_in_process_exits_2_with_one_line_per_missing_file(comfyui: Path, tmp_path: Path,
                                                                    name: str) -> None:
    files = TEMPLATE_FILES[name]
    done = run_cli(comfyui, str(ui_file(name)), "--output", str(tmp_path))
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    named = [{f for f in files if f in line} for line in lines]
    assert all(len(found) == 1 for found in named), lines
    assert set().union(*named) == files and len(lines) == len(files), lines
    assert all(line.startswith("treerpo run-workflow: invalid: node ") for line in lines), lines


def test_a_failing_node_exits_1_with_its_message(comfyui: Path, tmp_path: Path) -> None:
    """A folder that passes validation (it exists and has embedded.json) but whose file is broken fails when
    the node runs: exit 1 and the node's one-line message, no traceback. (A missing folder is refused at
    validation: exit 2, see the template tests.)"""
    broken = tmp_path / "models" / "broken_embedded"
    broken.mkdir(parents=True)
    (broken / "embedded.json").write_text("{not json")
    graph = api("sample_and_score")
    graph["1"]["inputs"]["weights"] = str(broken)
    file = tmp_path / "broken.api.json"
    file.write_text(json.dumps(graph))
    os.environ["TREERPO_ALLOW_ANY_PATH"] = "1"  # the folder lies outside ComfyUI's model folders
    try:
        done = run_cli(comfyui, str(file), "--output", str(tmp_path / "out"))
    finally:
        del os.environ["TREERPO_ALLOW_ANY_PATH"]
    assert done.returncode == 1, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("treerpo run-workflow: error: node 1 (TreeRPOEmbeddedLoader) failed: ")
    assert "broken_embedded" in last and "Traceback" not in done.stderr


def test_missing_comfyui_is_one_line_saying_make_comfyui(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TREERPO_COMFYUI"}
    command = [*TREERPO, "run-workflow", str(ui_file("best_of_tree")),
               "--comfyui", str(tmp_path)]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "make comfyui" in done.stderr, done.stderr
