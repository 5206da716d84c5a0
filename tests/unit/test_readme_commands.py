"""Every command the README shows still exists and parses: a make target of the
Makefile, or `slicewise` / `slicewise-produce` arguments their parsers accept."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from slicewise import cli
from slicewise_dev import source

ROOT = Path(__file__).resolve().parents[2]
PARSERS = {"slicewise": cli.parser, "slicewise-produce": source.parser}


def shown_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def test_the_readme_shows_commands():
    assert len(shown_commands()) >= 10


@pytest.mark.parametrize("line", shown_commands())
def test_a_command_the_readme_shows_runs_as_shown(line):
    argv = shlex.split(line, comments=True)
    if argv[0] == "make":
        makefile = (ROOT / "Makefile").read_text()
        targets = re.findall(r"^([a-z][a-z-]*):", makefile, re.M)
        variables = [a.split("=")[0] for a in argv[1:] if "=" in a]
        assert set(argv[1:]) - {a for a in argv[1:] if "=" in a} <= set(targets), (
            f"{line!r}: no such make target"
        )
        assert all(f"$({v})" in makefile for v in variables), f"{line!r}: a variable make ignores"
        return
    if argv[0] in ("pip", "python"):
        assert_installs_our_wheel(argv)
        return
    program = Path(argv[0]).name
    assert argv[0] == f".venv/bin/{program}" and program in PARSERS, line
    PARSERS[program]().parse_args(argv[1:])  # argparse exits (fails the test) on a mistake


def assert_installs_our_wheel(argv: list[str]) -> None:
    """`python -m pip wheel ...` builds it; `pip install "slicewise[extras] @ .../<wheel>"`
    names extras the package declares and the wheel of its version."""
    if argv[0] == "python":
        assert argv[1:4] == ["-m", "pip", "wheel"], argv
        return
    assert argv[1] == "install", argv
    project = (ROOT / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', project, re.M).group(1)
    extras = set(
        re.findall(r"^([a-z]+) = \[", project.split("[project.optional-dependencies]")[1], re.M)
    )
    name, wheel = re.fullmatch(
        r"(slicewise(?:\[[a-z,]+\])?) @ file://\$PWD/dist/(.+)", argv[2]
    ).groups()
    assert set(re.findall(r"[a-z]+", name.removeprefix("slicewise"))) <= extras, argv
    assert wheel == f"slicewise-{version}-py3-none-any.whl", argv


def test_the_readme_is_a_guide_not_a_log():
    """A guide a newcomer reads in minutes (history goes to CHANGELOG.md, figures to
    bench/results/), and no commit hash: it goes stale with the next commit."""
    text = (ROOT / "README.md").read_text()
    assert len(text.encode()) <= 15_000, "README.md is over 15 KB"
    hashes = [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", text) if re.search(r"[a-f]", w)]
    assert not [w for w in hashes if re.search(r"\d", w)], f"commit hashes in README: {hashes}"
