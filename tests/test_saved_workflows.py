"""Saved workflows keep working from one release to the next (CHANGELOG.md, docs/nodes.md).

``tests/fixtures/saved_workflows/<commit>/`` holds the API- and UI-format workflows of the pack as saved at
a commit (``releases.json`` names the release each belongs to): 0.1.0 (d261ca4) and the graphs saved
before the guard on prompt-following existed (fdb3f89). ``web/node_layouts.json`` records each release's
node inputs.

- Without a server (the node definitions of ComfyUI loaded in a child process with this pack): the record's
  newest release is today's nodes; no change to a node's inputs breaks a graph saved with a recorded
  release (each problem one line naming the node and the input); every UI fixture reads back, migrated,
  as its API graph with the inputs added since at their old-behaviour values; those values are the nodes'
  own defaults for a missing input.
- In a real ComfyUI server: the saved pick-and-train graphs (the only API fixtures that differ from today's
  templates: tests/test_workflows.py runs the CPU ones and refuses the FLUX and Qwen ones for exactly their
  missing weight files, which are not here, and tests/test_flux_templates.py runs the FLUX fp8 ones on tiny
  weights; the UI fixtures that differ are read back and loaded below) validate with no node error and
  train, the one saved before the guard at its fixed weight (no guard line), and through ``treerpo
  run-workflow`` in their UI form.
- In the real frontend (headless Chromium, one server and browser session per view): every distinct UI
  fixture loads with its values where the migration puts them and queues its API graph, in the classic
  view, and the pick-and-train ones in Nodes 2.0 too; a node whose values fit no release says so in a
  badge.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from comfyui_server import REPO, Server, require_comfyui, start_server, stop_server

from dynamic_treerpo.trainer.comfyui_host.layouts import (
    CONTROL,
    Record,
    layouts_of,
    migrate_workflow,
    read_record,
    with_added_inputs,
)
from dynamic_treerpo.trainer.comfyui_host.workflow_format import node_inputs, ui_to_api

FIXTURES = REPO / "tests" / "fixtures" / "saved_workflows"
RELEASES = json.loads((FIXTURES / "releases.json").read_text())  # commit -> release
PROBE = """
import inspect, json, sys, tempfile
from pathlib import Path
from dynamic_treerpo.trainer.comfyui_host.runner import boot, comfyui_root
with tempfile.TemporaryDirectory() as tmp:
    host = boot(comfyui_root(sys.argv[1]), None, Path(tmp))
    import nodes
    defaults = {}
    for name, cls in nodes.NODE_CLASS_MAPPINGS.items():
        if name.startswith("TreeRPO"):
            for method in ("execute", "validate_inputs"):
                params = inspect.signature(getattr(cls, method)).parameters if hasattr(cls, method) else {}
                defaults[f"{name}.{method}"] = {k: p.default for k, p in params.items()
                                                if p.default is not inspect.Parameter.empty
                                                and isinstance(p.default, (str, int, float, bool))}
    print(json.dumps({"definitions": host.definitions(), "defaults": defaults}))
    host.loop.close()
"""


def api_files(commit: str) -> list[Path]:
    return sorted((FIXTURES / commit / "api").glob("*.api.json"))


def ui_files(commit: str) -> list[Path]:
    return sorted((FIXTURES / commit).glob("*.json"))


def distinct(files: list[Path]) -> list[Path]:
    """One file of each content (the releases share most of their files)."""
    seen: dict[str, Path] = {}
    for file in files:
        seen.setdefault(hashlib.sha256(file.read_bytes()).hexdigest(), file)
    return list(seen.values())


@pytest.fixture(scope="module")
def comfyui() -> Path:
    return require_comfyui()


@pytest.fixture(scope="module")
def probe(comfyui: Path) -> dict:
    """Today's node definitions (as /object_info gives them) and the pack's Python defaults, from a child
    process (ComfyUI's modules stay out of this one)."""
    done = subprocess.run([sys.executable, "-c", PROBE, str(comfyui)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


# ------------------------------------------------------------------------------ what breaks a saved graph
def compatibility_problems(record: Record, definitions: dict) -> list[str]:
    """One line per change of today's nodes that would break graphs saved with recorded releases or a
    fixture (the releases named together): a node or input removed, an input required now that such graphs
    lack, a widget retyped or turned into a socket, a widget they lack with no value that keeps their
    behaviour, a combo value a fixture uses that is no longer offered."""
    now = layouts_of(definitions)
    found: dict[tuple[str, str], list[str]] = {}  # (node.input, what is wrong; {} for releases) -> releases
    for version, nodes in record.releases:
        def note(subject: str, what: str) -> None:
            found.setdefault((subject, what), []).append(version)  # noqa: B023 (called in this iteration)

        for node, old in nodes.items():
            if node not in now:
                note(node, "removed, but graphs saved with {} use it")
                continue
            new = now[node]
            kinds = dict(zip(new.widgets, new.kinds, strict=True))
            for name in (*old.required, *old.optional):
                if name not in (*new.required, *new.optional):
                    note(f"{node}.{name}", "removed or renamed, but graphs saved with {} set it")
            for slot, kind in zip(old.widgets, old.kinds, strict=True):
                if slot in kinds and kinds[slot] != kind:
                    note(f"{node}.{slot}", f"{kinds[slot]} now, but graphs saved with {{}} hold a {kind}; "
                                           "add an input of the new type instead")
                elif slot not in kinds and name_of(slot) in (*new.required, *new.optional):
                    note(f"{node}.{slot}", "no longer a widget, but graphs saved with {} hold its value")
            required_now = [n for n in new.required if n not in old.required]
            for name in required_now:
                why = "may lack it (optional then)" if name in old.optional else "lack it"
                note(f"{node}.{name}", f"required now, but graphs saved with {{}} {why}; make it optional "
                                       "with a default that keeps their behaviour")
            added = record.added.get(node, {})
            for slot in new.widgets:
                if (slot not in old.widgets and not slot.endswith(CONTROL) and slot not in added
                        and slot not in required_now):
                    note(f"{node}.{slot}", "graphs saved with {} lack it; give it a value that keeps their "
                                           "behaviour in web/node_layouts.json's 'added'")
    problems = [f"{subject}: {what.format(', '.join(ins))}" for (subject, what), ins in found.items()]
    for commit in RELEASES:
        for file in api_files(commit):
            for node in json.loads(file.read_text()).values():
                kind = node["class_type"]
                if kind not in now:
                    continue
                for spec in node_inputs(definitions[kind]):
                    value = node["inputs"].get(spec.name)
                    raw = definitions[kind]["input"]["optional" if spec.optional else "required"][spec.name]
                    options = raw[0] if isinstance(raw[0], list) else spec.options.get("options", [])
                    if spec.type == "COMBO" and isinstance(value, str) and value not in options:
                        problems.append(f"{kind}.{spec.name}: {value!r}, saved in {commit}/{file.name}, is "
                                        "no longer an option")
    return sorted(set(problems))


def name_of(slot: str) -> str:
    """The input a widget slot belongs to (a control slot belongs to its seed input)."""
    return slot.removesuffix(CONTROL)


def _semver(version: str) -> tuple[int, ...]:
    return tuple(int(n) for n in version.split("-")[0].split("."))


def test_no_change_to_a_node_breaks_a_graph_saved_with_a_release(probe: dict) -> None:
    problems = compatibility_problems(read_record(), probe["definitions"])
    assert not problems, "\n".join(problems)


def test_the_record_holds_todays_nodes_as_its_newest_release(probe: dict) -> None:
    """A change of a node's inputs is a release: recorded (scripts/record_node_layouts.py) under the raised
    version of pyproject.toml; and each recorded release is the one its fixtures were saved with."""
    import tomllib

    record = read_record()
    version, newest = record.current
    package = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    if newest != layouts_of(probe["definitions"]):
        assert _semver(package) > _semver(version), (
            f"the nodes' inputs changed since {version}, the newest release in web/node_layouts.json, but "
            f"pyproject.toml still says {package}: raise the version, say what changed in CHANGELOG.md, and "
            "run scripts/record_node_layouts.py")
        raise AssertionError(f"web/node_layouts.json does not record {package}'s node inputs yet: run "
                             "scripts/record_node_layouts.py")
    versions = [v for v, _ in record.releases]
    assert len(set(versions)) == len(versions) and set(RELEASES.values()) <= set(versions), versions
    assert _semver(version) <= _semver(package), f"recorded {version}, but pyproject.toml says {package}"
    for commit, release in RELEASES.items():  # a released layout is never rewritten
        for file in ui_files(commit):
            for node in json.loads(file.read_text())["nodes"]:
                layout = record.layout(release, node["type"])
                if layout is not None:
                    assert layout.fits(node["widgets_values"]), f"{release} no longer fits {file.name}"


@pytest.mark.parametrize("commit", sorted(RELEASES))
def test_every_saved_ui_workflow_reads_back_as_its_api_graph(commit: str, probe: dict) -> None:
    for ui_file in ui_files(commit):
        api_file = FIXTURES / commit / "api" / f"{API_TO_UI.api_id_of(ui_file)}.api.json"
        migrated = migrate_workflow(json.loads(ui_file.read_text()))
        expected = with_added_inputs(json.loads(api_file.read_text()))
        assert ui_to_api(migrated, probe["definitions"]) == expected, ui_file.name


def test_an_added_input_s_old_behaviour_is_the_nodes_own_default(probe: dict) -> None:
    """What the web UI fills in for an old graph is what the server uses for an old API graph."""
    for node, values in read_record().added.items():
        for name, value in values.items():
            for method in ("execute", "validate_inputs"):
                assert probe["defaults"][f"{node}.{method}"].get(name) == value, (node, method, name)


# ------------------------------------------------------------------------------ a real server
def _script(path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


API_TO_UI = _script(REPO / "scripts" / "api_to_ui.py")
API_TO_UI.api_id_of = lambda ui_file: API_TO_UI.api_path(ui_file).name[: -len(".api.json")]
PICK = "pick_and_train"
SMALL = {"TreeRPOSampleToPick": {"trees_per_prompt": 1}, "TreeRPOTrainFromPicks": {"iterations": 1}}
"""What the runs here change of a saved graph: the fewest trees and training rounds (time, not inputs)."""
SMALL_SETTINGS = "\n".join(["", "data.prompts_per_iteration=2", "tree.steps=4", "tree.depth=2",
                            "sampling.eval_steps=3", "guard.pairs=4", "guard.checkpoints=1",
                            "guard.strength_tries=0"])
"""Lines appended to the training node's settings box (later lines win): the smallest round and guard
measurement, so that the whole file adds about two minutes to the suite instead of four."""


def small_inputs(kind: str, inputs: dict) -> dict:
    """The inputs of a node of ``kind`` that the runs here change: :data:`SMALL`, and the training node's
    settings box with :data:`SMALL_SETTINGS` after the saved lines."""
    changed = dict(SMALL.get(kind, {}))
    if kind == "TreeRPOTrainFromPicks":
        changed["settings"] = inputs["settings"] + SMALL_SETTINGS
    return changed


def small(prompt: dict) -> dict:
    prompt = json.loads(json.dumps(prompt))
    for node in prompt.values():
        node["inputs"].update(small_inputs(node["class_type"], node["inputs"]))
    return prompt


def _post(server: Server, path: str, body: dict) -> dict:
    request = urllib.request.Request(server.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.load(reply)


@pytest.fixture(scope="module")
def server(comfyui: Path, tmp_path_factory) -> Iterator[Server]:
    """A server whose picks folder ``my_taste`` (the saved graphs' folder) has labelled trees."""
    srv = start_server(comfyui, tmp_path_factory.mktemp("comfyui"))
    sample = {"1": {"class_type": "TreeRPOEmbeddedLoader", "inputs": {"weights": "", "shift": 3.0}},
              "2": {"class_type": "TreeRPOSampleToPick", "inputs": {
                  "model": ["1", 0], "prompts": "two red circles\na blue square on the left",
                  "trees_per_prompt": 2, "seed": 0, "steps": 4, "depth": 2, "branching": 2, "window_start": 0,
                  "noise_level": 0.6, "picks_folder": "my_taste"}}}
    assert srv.run(sample)["status"]["status_str"] == "success"
    trees = json.load(urllib.request.urlopen(srv.url + "/treerpo/picks/my_taste/state", timeout=30))["trees"]
    for tree, (liked, disliked) in zip(trees, [([0], [3]), ([1, 2], [0]), ([2], []), ([3], [1])],
                                       strict=False):
        _post(srv, f"/treerpo/picks/my_taste/{tree['id']}", {"liked": liked, "disliked": disliked})
    yield srv
    stop_server(srv)


def api_fixtures_to_run() -> list[Path]:
    """Saved API graphs this test runs: every distinct one that differs from today's templates, and the
    pick-and-train ones (tests/test_workflows.py runs and validates the other templates as they are)."""
    today = {f.name: f.read_bytes() for f in (REPO / "workflows" / "api").glob("*.api.json")}
    files = distinct([f for commit in sorted(RELEASES) for f in api_files(commit)])
    return [f for f in files if today.get(f.name) != f.read_bytes() or f.name == f"{PICK}.api.json"]


def run_once(server: Server, prompt: dict, timeout: float = 600) -> dict:
    """``POST /prompt`` once: no node refused (a refused output is dropped silently otherwise), then the
    run's history entry."""
    status, body = server.post_prompt(prompt)
    assert status == 200 and body.get("node_errors") == {}, body
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        history = server.get(f"/history/{body['prompt_id']}")
        if body["prompt_id"] in history:
            return history[body["prompt_id"]]
        time.sleep(0.5)
    raise AssertionError(f"the prompt did not finish in {timeout} s")


def test_saved_api_graphs_validate_and_train_in_a_real_server(server: Server) -> None:
    files = api_fixtures_to_run()
    assert {f.name for f in files} == {f"{PICK}.api.json"} and len(files) == 2, files  # else: run them too
    loras = server.base / "output" / "loras"
    for file in files:
        saved = json.loads(file.read_text())
        shutil.rmtree(loras, ignore_errors=True)
        result = run_once(server, small(saved))
        assert result["status"]["status_str"] == "success", (file, result["status"])
        assert len(list(loras.glob("*.safetensors"))) == 1, file  # it trained and saved its LoRA
        train = next(k for k, n in saved.items() if n["class_type"] == "TreeRPOTrainFromPicks")
        guarded = "treerpo_guard" in result["outputs"].get(train, {})
        # saved before the guard: its fixed weight (no guard line); saved with it: guarded, as then
        assert guarded == ("keep_following" in saved[train]["inputs"]), (file, result["outputs"].get(train))


def test_saved_ui_graphs_run_headless_with_treerpo_run_workflow(server: Server, tmp_path: Path,
                                                               comfyui: Path) -> None:
    record = read_record()
    for commit in sorted(RELEASES):
        ui_file = next(f for f in ui_files(commit) if API_TO_UI.api_id_of(f) == PICK)
        workflow = json.loads(ui_file.read_text())
        for node in workflow["nodes"]:  # the same small run, set by input name in the layout it was saved in
            layout = record.layout(RELEASES[commit], node["type"])
            if layout is None:
                continue
            saved = dict(zip(layout.widgets, node["widgets_values"], strict=True))
            for name, value in small_inputs(node["type"], saved).items():
                node["widgets_values"][layout.widgets.index(name)] = value
        out = tmp_path / commit
        (out / "treerpo_picks").mkdir(parents=True)
        picks = server.base / "output" / "treerpo_picks" / "my_taste"
        shutil.copytree(picks, out / "treerpo_picks" / "my_taste")
        file = tmp_path / f"{commit}.json"
        file.write_text(json.dumps(workflow))
        env = {**os.environ, "TREERPO_COMFYUI": str(comfyui), "PYTHONUNBUFFERED": "1"}
        done = subprocess.run([sys.executable, "-m", "dynamic_treerpo.trainer", "run-workflow", str(file),
                               "--output", str(out)], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, (commit, done.stderr[-3000:])
        assert any(p.name.endswith(".safetensors") for p in (out / "loras").iterdir()), done.stdout


# ------------------------------------------------------------------------------ the real frontend
@pytest.mark.parametrize("view", ["classic", "nodes2"])
def test_saved_ui_graphs_load_migrated_in_the_real_frontend(view: str, tmp_path: Path, capsys) -> None:
    """Every distinct UI fixture (the pick-and-train ones in Nodes 2.0, where only their loading differs)
    opens with its values where the migration puts them and queues its API graph with the inputs added
    since, all in one server and browser session per view; a node whose values fit no release (one value
    lost) shows a badge that says so. Screenshots (whole graph, and a close-up of the nodes the migration
    moved or could not read) in pytest's temporary folder."""
    from test_ui_frontend import run_script

    files = distinct([f for commit in sorted(RELEASES) for f in ui_files(commit)])
    if view == "nodes2":
        files = [f for f in files if API_TO_UI.api_id_of(f) == PICK]
    files.append(unreadable_copy(next(f for f in files if API_TO_UI.api_id_of(f) == PICK), tmp_path))
    options = [*map(str, files), "--saved", *(["--vue-nodes"] if view == "nodes2" else [])]
    output = run_script(options, tmp_path / "screenshots" / view, capsys)
    assert output.count(": OK") == len(files) and "all OK" in output, output
    assert output.count("its 8 saved values fit no release") == 1, output  # the badge's words


def unreadable_copy(ui_file: Path, tmp_path: Path) -> Path:
    """``ui_file`` with the training node's last saved value lost (a count no release had), under the same
    name (the checker finds its API id by name) in ``<tmp_path>/unreadable/``."""
    workflow = json.loads(ui_file.read_text())
    train = next(n for n in workflow["nodes"] if n["type"] == "TreeRPOTrainFromPicks")
    train["widgets_values"] = train["widgets_values"][:8]
    out = tmp_path / "unreadable" / ui_file.name
    out.parent.mkdir()
    out.write_text(json.dumps(workflow))
    return out
