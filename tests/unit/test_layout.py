"""docs/LAYOUT.md names every module of both packages, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def layout_block(layout: str) -> str:
    return layout.split("```text\n", 1)[1].split("```", 1)[0]


def named_modules(block: str) -> set[str]:
    """The `.py` files the block names under include/, as `include/<pkg>/<file>.py`.

    A line at column 0 opens a folder; an indented line names its files in the first
    column, before the description (two or more spaces further on).
    """
    found: set[str] = set()
    folder = None
    for line in block.splitlines():
        head = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        if not line.startswith(" "):
            folder = head if head.startswith("include/") else None
        elif folder:
            found |= {folder + name for name in head.split() if name.endswith(".py")}
    return found


def test_the_readme_layout_matches_the_packages() -> None:
    named = named_modules(layout_block((ROOT / "docs" / "LAYOUT.md").read_text()))
    on_disk = {
        p.relative_to(ROOT).as_posix()
        for pkg in ("slicewise", "slicewise_dev")
        for p in (ROOT / "include" / pkg).rglob("*.py")
        if p.name != "__init__.py"
    }
    assert named, "no module found in docs/LAYOUT.md's block"
    assert named - on_disk == set(), (
        f"docs/LAYOUT.md names modules that do not exist: {named - on_disk}"
    )
    assert on_disk - named == set(), f"modules missing from docs/LAYOUT.md: {on_disk - named}"
