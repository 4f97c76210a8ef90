"""docs/architecture.md's layer table lists every module of ``trainer/``, ``nodes/`` and ``web/``, and every
file path the page names exists: an inventory a newcomer can trust, kept true by this test instead of by
memory."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
WEB_FILES = (".js", ".json")


def modules_on_disk() -> set[str]:
    """``folder/name`` of every Python module of ``trainer/`` and ``nodes/`` (packages' ``__init__`` aside)
    and every file of ``web/`` the frontend loads."""
    found = {f"{p.parent.relative_to(ROOT).as_posix()}/{p.stem}"
             for folder in ("trainer", "nodes") for p in (ROOT / folder).rglob("*.py")
             if p.name != "__init__.py" and "__pycache__" not in p.parts}
    found |= {f"web/{p.name}" for p in (ROOT / "web").iterdir() if p.suffix in WEB_FILES}
    return found


def layer_table(page: str) -> set[str]:
    """``folder/name`` of every module the layer table lists: its first column names the folder, its second
    the modules in backticks (a note in parentheses after a name is not a module)."""
    section = page[page.index("## The layers"):page.index("\n## ", page.index("## The layers") + 3)]
    listed = set()
    for row in section.splitlines():
        cells = row.split(" | ")
        if not row.startswith("| `") or len(cells) < 3:
            continue
        folder = cells[0].removeprefix("| ").strip("`").rstrip("/")
        names = re.findall(r"`([^`]+)`", re.sub(r"\([^)]*\)", "", cells[1]))
        listed |= {f"{folder}/{name}" for name in names}
    return listed


def test_the_layer_table_lists_every_module_and_no_other() -> None:
    page = PAGE.read_text(encoding="utf-8")
    listed, present = layer_table(page), modules_on_disk()
    assert not present - listed, f"modules missing from docs/architecture.md: {sorted(present - listed)}"
    gone = sorted(listed - present)
    assert not gone, f"docs/architecture.md lists modules that are gone: {gone}"


def test_every_path_the_page_names_exists() -> None:
    page = PAGE.read_text(encoding="utf-8")
    paths = set(re.findall(r"(?<![\w./-])((?:trainer|nodes|web|scripts|tests|docs|workflows|configs)/"
                           r"[\w./-]*\w\.(?:py|json|js|md|yaml))(?!\w)", page))
    assert paths, "the page names files"
    gone = sorted(p for p in paths if not (ROOT / p).exists())
    assert not gone, f"docs/architecture.md names files that are gone: {gone}"


def test_the_inventory_check_sees_a_missing_and_a_gone_module() -> None:
    page = PAGE.read_text(encoding="utf-8")
    listed = layer_table(page.replace("`solvers`, ", "").replace("`plan`, ", "`plan`, `gone_module`, "))
    assert "trainer/core/solvers" not in listed and "trainer/core/gone_module" in listed
