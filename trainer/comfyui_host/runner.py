"""Run ComfyUI workflows headless, in this process (``treerpo run-workflow``); the two workflow
formats are converted by :mod:`trainer.comfyui_host.workflow_format`.

Running: the pack imports ComfyUI in two places only, ``nodes/comfy_door.py`` (the nodes' door) and this
module, which is not a node but a host of ComfyUI (as ``main.py`` is) and imports ComfyUI from the
folder the user points at (``make comfyui`` installs one). Every ComfyUI import sits inside a
function, so importing ``trainer`` never needs ComfyUI. The pack itself is loaded from this checkout
with ComfyUI's own custom-node loader, and the prompt runs through ComfyUI's own ``validate_prompt``
and ``PromptExecutor``, so a workflow behaves here as it does in the server.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .layouts import migrate_workflow
from .workflow_format import Definitions, is_ui_workflow, read_workflow, ui_to_api

PACK_ROOT = Path(__file__).resolve().parents[2]  # the checkout: the node pack's folder
def comfyui_root(path: Path | str | None = None) -> Path:
    """``path``, else ``$TREERPO_COMFYUI``, else the checkout's ``.comfyui``; it must hold main.py."""
    root = Path(path or os.environ.get("TREERPO_COMFYUI") or PACK_ROOT / ".comfyui").expanduser()
    if not (root / "main.py").is_file() or not (root / "execution.py").is_file():
        raise FileNotFoundError(f"no ComfyUI in {root}: run `make comfyui` (installs one into .comfyui), "
                                "or give --comfyui PATH / set TREERPO_COMFYUI")
    return root.resolve()


# ------------------------------------------------------------------------------ running


class WorkflowValidationError(ValueError):
    """ComfyUI refused the prompt; ``lines`` holds one readable line per error."""

    def __init__(self, lines: list[str]):
        super().__init__("; ".join(lines))
        self.lines = lines


class WorkflowExecutionError(RuntimeError):
    """A node raised while the prompt ran."""


def validation_lines(error: dict | None, node_errors: dict, prompt: dict) -> list[str]:
    """ComfyUI's validation result as one line per distinct error (ComfyUI repeats a node's own
    validation message once per input: those collapse to one line)."""
    lines: list[str] = []
    for node_id in sorted(node_errors, key=lambda k: (len(str(k)), str(k))):
        entry = node_errors[node_id]
        head = f"node {node_id} ({entry.get('class_type') or prompt.get(node_id, {}).get('class_type')})"
        for err in entry.get("errors", []):
            details = str(err.get("details", ""))
            if err.get("type") == "custom_validation_failed" and " - " in details:
                details = details.split(" - ", 1)[1]
            line = f"{head}: {err.get('message', 'invalid')}: {details}" if details else \
                f"{head}: {err.get('message', 'invalid')}"
            if line not in lines:
                lines.append(line)
    if not lines and error:
        details = f" ({error['details']})" if error.get("details") else ""
        lines.append(f"{error.get('message', 'invalid prompt')}{details}")
    return lines


@dataclass
class RunResult:
    """What a run left: files written under the output folder, and the nodes' text outputs."""

    output_dir: Path
    files: list[Path]
    texts: dict[str, list[str]] = field(default_factory=dict)
    seconds: float = 0.0


class _Host:
    """What ComfyUI's executor expects of its server: where it sends events. Reports node starts."""

    def __init__(self, prompt: dict, report: Callable[[str], None]):
        self.client_id: str | None = None
        self.last_node_id: str | None = None
        self.last_prompt_id: str | None = None
        self.sockets_metadata: dict = {}
        self._prompt, self._report = prompt, report

    def send_sync(self, event: str, data: Any, sid: str | None = None) -> None:
        if event == "executing" and isinstance(data, dict) and data.get("node") is not None:
            node = str(data["node"])
            self._report(f"running node {node} ({self._prompt.get(node, {}).get('class_type', '?')})")

    def queue_updated(self) -> None:
        pass


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def _quiet_logging(verbose: bool) -> Iterator[_Collect]:
    """ComfyUI logs through the root logger; keep its records (shown with --verbose or on failure)."""
    root = logging.getLogger()
    collect = _Collect()
    saved = root.level, list(root.handlers)
    root.handlers = [collect] + ([logging.StreamHandler(sys.stderr)] if verbose else [])
    root.setLevel(logging.INFO)
    try:
        yield collect
    finally:
        root.setLevel(saved[0])
        root.handlers = saved[1]


def _import_comfyui(root: Path) -> None:
    """Put ComfyUI first on ``sys.path`` so ``import nodes`` (and ``server``, ``execution``,
    ``comfy``...) are ComfyUI's. The pack never imports its own ``nodes/`` as a top-level module
    (it is ``dynamic_treerpo.nodes`` when installed, ``<folder>.nodes`` inside ComfyUI), so the
    checkout's folder cannot shadow ComfyUI's module even when run from the repo root."""
    root_text = str(root)
    sys.path[:] = [root_text] + [p for p in sys.path if p != root_text]
    import torch
    from comfy.cli_args import args  # parsed from no arguments: main.py alone reads argv

    if not torch.cuda.is_available():
        args.cpu = True  # before comfy.model_management picks the device
    args.disable_api_nodes = True
    import nodes

    found = Path(nodes.__file__).resolve()
    if found.parent != root:
        raise ImportError(f"`import nodes` gave {found}, not ComfyUI's ({root}): another module named "
                          "nodes shadows it")


@dataclass
class ComfyHost:
    """ComfyUI loaded in this process with the built-in nodes and this pack."""

    root: Path
    loop: asyncio.AbstractEventLoop
    modules: dict[str, Any]

    @property
    def node_classes(self) -> dict[str, Any]:
        return self.modules["nodes"].NODE_CLASS_MAPPINGS

    def definitions(self, types: set[str] | None = None) -> Definitions:
        """Node definitions shaped as ``/object_info`` entries (what the server sends the UI)."""
        out: Definitions = {}
        for name, cls in self.node_classes.items():
            if types is not None and name not in types:
                continue
            if hasattr(cls, "GET_NODE_INFO_V1"):
                out[name] = cls.GET_NODE_INFO_V1()
                continue
            input_types = cls.INPUT_TYPES()
            out[name] = {"input": input_types,
                         "input_order": {k: list(v) for k, v in input_types.items()},
                         "output": list(cls.RETURN_TYPES),
                         "output_name": list(getattr(cls, "RETURN_NAMES", None) or cls.RETURN_TYPES)}
        return out


def boot(root: Path, output_dir: Path | None, temp_dir: Path, verbose: bool = False) -> ComfyHost:
    """Import ComfyUI from ``root`` and load its built-in nodes plus this pack, as ``main.py`` does
    (minus the API nodes and other custom node packs)."""
    with _quiet_logging(verbose):
        _import_comfyui(root)
    import comfy.utils
    import execution
    import folder_paths
    import hook_breaker_ac10a0

    import nodes

    if output_dir is not None:
        folder_paths.set_output_directory(str(output_dir))
    folder_paths.set_temp_directory(str(temp_dir))
    os.makedirs(folder_paths.get_temp_directory(), exist_ok=True)
    extra = root / "extra_model_paths.yaml"
    if extra.is_file():
        import utils.extra_config

        utils.extra_config.load_extra_path_config(str(extra))
    comfy.utils.set_progress_bar_enabled(verbose)
    if not (PACK_ROOT / "__init__.py").is_file() or not (PACK_ROOT / "nodes").is_dir():
        raise ImportError(f"the node pack is not beside this trainer package ({PACK_ROOT}): run "
                          "`treerpo run-workflow` from a checkout of the pack")

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    with _quiet_logging(verbose) as log:
        hook_breaker_ac10a0.save_functions()
        try:
            loop.run_until_complete(nodes.init_extra_nodes(init_custom_nodes=False, init_api_nodes=False))
            builtin = set(nodes.NODE_CLASS_MAPPINGS)
            loaded = loop.run_until_complete(nodes.load_custom_node(str(PACK_ROOT), builtin,
                                                                    module_parent="custom_nodes"))
        finally:
            hook_breaker_ac10a0.restore_functions()
    if not loaded:
        messages = [r.getMessage().strip().splitlines()[-1] for r in log.records
                    if r.levelno >= logging.WARNING and r.getMessage().strip()]
        raise ImportError(f"the node pack in {PACK_ROOT} did not load in ComfyUI: "
                          f"{messages[-1] if messages else 'no reason logged'}")
    return ComfyHost(root, loop, {"nodes": nodes, "execution": execution, "folder_paths": folder_paths,
                                  "comfy.utils": comfy.utils})


def _snapshot(folder: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()} if folder.is_dir() else {}


def _progress_hook(report: Callable[[str], None]) -> Callable[..., None]:
    """Node progress (training iterations, sampling steps) at most every 5 s, and at the end."""
    from comfy_execution.utils import get_executing_context

    last: dict[str, float] = {}  # node -> when it last reported (or first updated)
    shown: set[str] = set()

    def hook(value: float, total: float, preview: Any = None, prompt_id: Any = None,
             node_id: Any = None) -> None:
        context = get_executing_context()
        node = str(node_id or (context.node_id if context is not None else "?"))
        now = time.monotonic()
        started = last.setdefault(node, now)
        if now - started >= 5.0 or (value >= total and node in shown):
            last[node] = now
            shown.add(node)
            report(f"  node {node}: {int(value)}/{int(total)}")

    return hook


def execute(host: ComfyHost, prompt: dict[str, dict], extra_pnginfo: dict | None = None,
            report: Callable[[str], None] = lambda _: None, verbose: bool = False) -> RunResult:
    """Validate ``prompt`` with ComfyUI's ``validate_prompt`` and run it with ``PromptExecutor``.

    Raises WorkflowValidationError (any node error: nothing runs) or WorkflowExecutionError.
    """
    execution, folder_paths = host.modules["execution"], host.modules["folder_paths"]
    prompt_id = str(uuid.uuid4())
    with _quiet_logging(verbose):
        valid, error, outputs, node_errors = host.loop.run_until_complete(
            execution.validate_prompt(prompt_id, prompt, None))
    if not valid or node_errors:
        raise WorkflowValidationError(validation_lines(error, node_errors, prompt))

    output_dir = Path(folder_paths.get_output_directory())
    before = _snapshot(output_dir)
    server = _Host(prompt, report)
    executor = execution.PromptExecutor(server, cache_type=execution.CacheType.CLASSIC,
                                        cache_args={"lru": 0, "ram": 0})
    extra_data: dict[str, Any] = {"client_id": "treerpo-run-workflow"}
    if extra_pnginfo:
        extra_data["extra_pnginfo"] = extra_pnginfo
    host.modules["comfy.utils"].set_progress_bar_global_hook(_progress_hook(report))
    start = time.perf_counter()
    with _quiet_logging(verbose) as log:
        host.loop.run_until_complete(executor.execute_async(prompt, prompt_id, extra_data, outputs))
    seconds = time.perf_counter() - start
    if not verbose:  # warnings while running matter (e.g. "lora key not loaded"); errors come below
        warned = {r.getMessage().strip().splitlines()[0] for r in log.records
                  if r.levelno == logging.WARNING and r.getMessage().strip()}
        for message in sorted(warned):
            report(f"ComfyUI warning: {message}")
    if not executor.success:
        failures = [data for event, data in executor.status_messages if event == "execution_error"]
        if failures:
            data = failures[-1]
            message = str(data.get("exception_message", "")).strip().splitlines() or ["(no message)"]
            raise WorkflowExecutionError(f"node {data.get('node_id')} ({data.get('node_type')}) failed: "
                                         f"{message[0]}")
        raise WorkflowExecutionError("the prompt was interrupted")
    after = _snapshot(output_dir)
    files = sorted(p for p, stamp in after.items() if before.get(p) != stamp)
    texts = {node: [str(t) for t in ui["text"]] for node, ui in executor.history_result["outputs"].items()
             if isinstance(ui, dict) and ui.get("text")}
    return RunResult(output_dir, files, texts, seconds)


def run_workflow(path: Path, comfyui: Path | str | None = None, output: Path | None = None,
                 report: Callable[[str], None] = lambda _: None, verbose: bool = False) -> RunResult:
    """Read a workflow file (API or UI format), boot ComfyUI with this pack, run it."""
    data = read_workflow(path)
    root = comfyui_root(comfyui)
    if output is not None:
        output = Path(output).resolve()
        output.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="treerpo_comfyui_") as tmp:
        host = boot(root, output, Path(tmp), verbose=verbose)
        try:
            if is_ui_workflow(data):
                types = {n["type"] for n in data["nodes"]}
                prompt = ui_to_api(migrate_workflow(data), host.definitions(types))
                extra = {"workflow": data}
            else:
                prompt, extra = data, None
            return execute(host, prompt, extra, report=report, verbose=verbose)
        finally:
            host.loop.close()


def format_result(result: RunResult) -> str:
    """The run's summary: the output folder, each file written there, and text outputs."""
    lines = [f"ran in {result.seconds:.1f} s; output folder: {result.output_dir}"]
    lines += [f"  {p.relative_to(result.output_dir)}" for p in result.files] or ["  (no files written)"]
    for node, texts in result.texts.items():
        lines.append(f"node {node} text:")
        lines += ["  " + line for text in texts for line in text.splitlines()]
    return "\n".join(lines)
