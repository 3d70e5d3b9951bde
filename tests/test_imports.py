"""The package's imports run one way and never in a circle.

Every `import` in every module of agentbox/ counts: at the top, inside functions
(lazy imports), under `if TYPE_CHECKING`. An import names the module it loads:
`from agentbox.review import digest` imports agentbox.review.digest, `from
agentbox.store import Store` imports the package agentbox.store (its
`__init__.py`, a module like any other), relative imports are resolved. The
parent packages Python initialises on the way (agentbox/__init__.py, the agent
API, for every `agentbox.x`) are not counted as imports of the importer: they
are only part of a circle when they import back, and then that import is in the
graph like any other.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "agentbox"

# The rooms, by the first part under agentbox. (the package itself: "agentbox").
CORE = {"events", "runs", "signing", "config", "logs", "addresses", "portable", "manual", "models",
        "files", "bundled", "proof", "ownership", "jsontext"}
ROOMS = {"http", "engine", "review", "desktop", "store", "archive"}
# The app hook (agentbox/apps.py: App, Host): above the engine and the HTTP core,
# which it lends to the apps; the server (http/app.py) assembles the apps through it.
HOOK = {"apps"}
SHELLS = {"cli", "client", "browser", "mcp_server", "terminal", "__main__"}  # the client side
ANYTHING = CORE | ROOMS | HOOK | SHELLS | {"agentbox"}

# What each room may import (its own modules are always allowed). The engine (the
# run engine on the store, the HTTP core on both, the core modules below them) knows
# no app: the review, its archive and the desktop side are apps on top of it, which
# reach the engine through agentbox.apps (docs/apps.md), never the other way.
# No exceptions.
APPS = {"review", "archive", "desktop"}
MAY_IMPORT: dict[str, set[str]] = {
    "http": {"engine", "store", "apps"} | CORE,
    "apps": {"http", "engine", "store"} | CORE,
    "engine": {"store"} | CORE,
    "store": {"events", "runs", "logs", "portable", "signing", "addresses", "models",
              "jsontext"},
    # The review is an app: the agent API, the app hook and the pages it stands on.
    "review": {"engine", "store", "archive", "http", "apps"} | CORE,
    # The archive of exports keeps the review's files and records (its own tables).
    "archive": {"store"} | CORE,
    "desktop": {"client", "browser", "terminal", "review", "store", "engine", "http",
                "apps"} | CORE,
    "client": set(CORE),
    "terminal": {"review", "engine"} | CORE,  # the mix review's names
}
for _core in CORE:
    MAY_IMPORT[_core] = set(CORE)
# The apps' answer models, which the client reads its answers into: pydantic and
# agentbox.models only (test_the_apps_answers_are_light holds it), so a program that
# only talks to agentbox imports no app with them.
ANSWERS = {"agentbox.review.answers", "agentbox.desktop.answers"}
MAY_IMPORT_MODULES = {"client": ANSWERS}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imported(name: str, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The agentbox modules one import statement of module `name` loads."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = name.split(".")
            if modules()[name].name != "__init__.py":
                package = package[:-1]
            package = package[: len(package) - node.level + 1]
            base = ".".join([*package, base] if base else package)
        # `from package import module` loads the module; `from module import name`, it.
        targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules() else base
                   for alias in node.names]
    for target in targets:
        while target not in modules() and "." in target:
            target = target.rsplit(".", 1)[0]  # agentbox.x.y.Name -> the module agentbox.x.y
        if target in modules() and target != name:
            yield target


@cache
def graph() -> dict[str, frozenset[str]]:
    found = {}
    for name, path in modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        found[name] = frozenset(target for node in ast.walk(tree)
                                if isinstance(node, ast.Import | ast.ImportFrom)
                                for target in imported(name, node))
    return found


def circles(edges: dict[str, frozenset[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each
    sorted: every circle of imports lies inside one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(edges.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def room(name: str) -> str:
    """agentbox.http.api -> http; agentbox.config -> config; agentbox -> agentbox."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "agentbox"


def test_no_import_circle() -> None:
    found = circles(graph())
    assert found == [], "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def wrong_way(edges: dict[str, frozenset[str]] | None = None) -> set[tuple[str, str]]:
    """(importer, imported) for each import against MAY_IMPORT."""
    wrong = set()
    for name, targets in (graph() if edges is None else edges).items():
        allowed = MAY_IMPORT.get(room(name), ANYTHING) | {room(name)}
        wrong |= {(name, target) for target in targets if room(target) not in allowed
                  and target not in MAY_IMPORT_MODULES.get(room(name), set())}
    return wrong


def test_imports_run_one_way() -> None:
    assert sorted(wrong_way()) == []


def test_the_engine_imports_no_app() -> None:
    """The pinned direction, said on its own: agentbox.engine, agentbox.store,
    agentbox.events, agentbox.config and the HTTP core import nothing of
    agentbox.review, agentbox.archive or agentbox.desktop."""
    engine = {"engine", "store", "events", "config", "http", "apps"}
    assert not {(name, target) for name, targets in graph().items() if room(name) in engine
                for target in targets if room(target) in APPS}


def test_the_apps_answers_are_light() -> None:
    """The apps' answer models import agentbox.models alone of the package."""
    assert {name: sorted(graph()[name]) for name in ANSWERS} == {
        name: ["agentbox.models"] for name in ANSWERS}


def test_the_store_imports_nothing_of_the_configuration() -> None:
    """The store is told where it is (store.engines.Location); it reads no settings."""
    store = {name: targets for name, targets in graph().items()
             if room(name) == "store"}
    assert not {(name, target) for name, targets in store.items() for target in targets
                if target == "agentbox.config"}


def test_every_module_is_in_a_known_room() -> None:
    unknown = {room(name) for name in modules()} - ANYTHING
    assert not unknown, f"{sorted(unknown)}: name their room here (CORE, ROOMS or SHELLS)"


# -- the checker itself, on graphs made up for it ----------------------------------------------


def test_a_circle_is_found_however_long() -> None:
    edges = {"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}),
             "d": frozenset({"a"})}
    assert circles(edges) == [["a", "b", "c"]]
    assert circles({"a": frozenset({"b"}), "b": frozenset()}) == []


def test_an_import_the_wrong_way_is_found() -> None:
    made_up = {"agentbox.engine.dispatcher": frozenset({"agentbox.http.app",
                                                        "agentbox.store"}),
               "agentbox.store.ingest": frozenset({"agentbox.config", "agentbox.events"}),
               "agentbox.runs": frozenset({"agentbox.client"}),
               "agentbox.config": frozenset({"agentbox.review.profiles"})}
    assert wrong_way(made_up) == {("agentbox.engine.dispatcher", "agentbox.http.app"),
                                  ("agentbox.store.ingest", "agentbox.config"),
                                  ("agentbox.runs", "agentbox.client"),
                                  ("agentbox.config", "agentbox.review.profiles")}


def test_lazy_relative_and_package_imports_are_resolved() -> None:
    """The graph has the cli's lazy imports (inside its commands), `from agentbox.store
    import X` as the store package; relative imports are resolved from the module's
    package (a package's __init__ is in that package)."""
    def resolved(name: str, source: str) -> list[str]:
        node = ast.parse(source).body[0]
        assert isinstance(node, ast.Import | ast.ImportFrom)
        return list(imported(name, node))

    assert resolved("agentbox.store.ingest", "from ..events import Event") == [
        "agentbox.events"]
    assert resolved("agentbox.store.ingest", "from .sqlite import X") == [
        "agentbox.store.sqlite"]
    assert resolved("agentbox.store", "from . import sqlite") == ["agentbox.store.sqlite"]
    assert resolved("agentbox.http.api", "import agentbox.review.digest") == [
        "agentbox.review.digest"]
    assert "agentbox.desktop.folders" in graph()["agentbox.cli"]  # inside `watch`
    assert "agentbox.store" in graph()["agentbox.http.api"]
    assert "agentbox.signing" in graph()["agentbox.client"]
    assert "agentbox.review.web.pages" in graph()["agentbox.review.app"]  # in setup
    assert all(target.startswith("agentbox") for targets in graph().values()
               for target in targets)
