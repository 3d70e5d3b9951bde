"""What a fresh install gets: every package agentbox imports is declared in
pyproject.toml (the test extras pull in much more, so a missing dependency
passes the suite and fails a user's first `agentbox serve`), and the wheel
carries every file the package reads at run time (templates, SQL, the manual).
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "agentbox"
# Imported only where an extra is installed (each import is lazy, behind the command
# that needs it): the distribution must be in that extra.
IN_AN_EXTRA = {"psycopg", "psycopg-pool", "mcp", "pystray", "pillow"}
# Not from the package index: PyGObject is the OS's (agentbox tray's menu on Linux).
FROM_THE_OS = {"gi"}
# Installed with, and pinned by, a declared dependency (pystray's X backend on Linux).
COMES_WITH = {"pydantic-core": "pydantic", "python-xlib": "pystray"}


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> tuple[set[str], set[str]]:
    """The base dependencies' names and the extras' names, normalised."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {normal(re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0]) for r in requirements}

    extras = set().union(*(names(r) for r in project["optional-dependencies"].values()))
    return names(project["dependencies"]), extras


def imported_top_levels() -> dict[str, Path]:
    """Every top-level module agentbox imports, anywhere (lazy imports too), outside the
    standard library and agentbox itself, with a file that imports it."""
    found: dict[str, Path] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                tops = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                tops = [node.module.split(".")[0]]
            else:
                continue
            for top in tops:
                if top not in sys.stdlib_module_names and top not in ("agentbox", "__future__"):
                    found.setdefault(top, path)
    return found


def test_every_package_agentbox_imports_is_declared() -> None:
    base, extras = declared()
    owners = importlib.metadata.packages_distributions()
    undeclared = []
    for top, where in sorted(imported_top_levels().items()):
        if top in FROM_THE_OS:
            continue
        dists = {normal(d) for d in owners.get(top, [])}
        assert dists, f"{top} (imported in {where.relative_to(ROOT)}) is not installed"
        for dist in dists:
            dist = COMES_WITH.get(dist, dist)
            if dist in base or (dist in IN_AN_EXTRA and dist in extras):
                continue
            undeclared.append(f"{dist} (import {top}, in {where.relative_to(ROOT)})")
    assert not undeclared, ("imported but not among pyproject.toml's dependencies: "
                            + ", ".join(undeclared))


def test_the_base_dependencies_are_all_used() -> None:
    """A base dependency nothing in agentbox imports is a download every user pays
    for (uvicorn's server and its standard extras are started by name, not imported
    for their extras)."""
    base, _ = declared()
    owners = importlib.metadata.packages_distributions()
    used = {normal(COMES_WITH.get(normal(d), d)) for top in imported_top_levels()
            for d in owners.get(top, [])}
    assert base - used == set(), f"declared, never imported: {sorted(base - used)}"


@pytest.mark.slow
def test_the_wheel_carries_every_file_the_package_reads(tmp_path: Path) -> None:
    """A wheel built from the checkout (as `pip install` from an index would get it)
    holds every file of agentbox/ that git tracks: a template or an SQL file left out
    of package-data works in the editable install the suite runs and fails installed."""
    # The tracked files alone: an editable install's agentbox.egg-info in the checkout
    # lists every file it found, and setuptools would take that list for package data.
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.splitlines()
    assert "pyproject.toml" in tracked, "git lists no file of the checkout"
    source = tmp_path / "source"
    for name in tracked:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path),
         str(source)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    wheel = next(tmp_path.glob("agentbox-*.whl"))
    inside = set(zipfile.ZipFile(wheel).namelist())
    tracked = [name for name in tracked if name.startswith("agentbox/")]
    missing = [name for name in tracked if name not in inside]
    assert not missing, f"not in the wheel: {missing}"
