"""The store's boundary: `Store` is the whole interface, each engine writes its own
SQL under the same statement names, and nothing outside agentbox/store/ sees an
engine, a connection or a line of SQL. Read from the source, no database needed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from agentbox.store import Store
from agentbox.store.queries import area_files, load, operations, parse
from agentbox.store.schema import migrations

PACKAGE = Path(__file__).resolve().parents[2] / "agentbox"
# What the rest of agentbox may import of the store: the interface and the choice
# of engine by the settings.
PUBLIC = {"agentbox.store", "agentbox.store.engines"}
DRIVERS = {"sqlite3", "psycopg", "psycopg_pool"}


def modules_outside_the_store() -> list[Path]:
    return [path for path in sorted(PACKAGE.rglob("*.py"))
            if PACKAGE / "store" not in path.parents]


def imported(tree: ast.AST) -> set[str]:
    """Every module an AST imports (a `from a.b import c` also as `a.b.c`)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def test_both_engines_define_the_same_statements() -> None:
    sqlite, postgres = load("sqlite"), load("postgres")
    assert operations(sqlite) == operations(postgres)
    # ... in files of the same areas, each area the same operations
    files = {engine: {path.name: operations(parse(path.read_text(encoding="utf-8")))
                      for path in area_files(engine)} for engine in ("sqlite", "postgres")}
    assert files["sqlite"] == files["postgres"] and len(files["sqlite"]) >= 8
    assert len(sqlite) > 50 and all(text.strip() for text in (*sqlite.values(),
                                                              *postgres.values()))
    # Each engine in its own words: nothing of the other's dialect.
    assert not any("%(" in text or "SKIP LOCKED" in text for text in sqlite.values())
    assert not any(re.search(r"(?<![:\w]):\w", text) or "INDEXED BY" in text
                   for text in postgres.values())


def test_both_engines_have_the_same_migrations_as_numbered_files() -> None:
    folder = PACKAGE / "store" / "migrations"
    sqlite, postgres = ([path.name for path in sorted((folder / engine).glob("*.sql"))]
                        for engine in ("sqlite", "postgres"))
    assert sqlite == postgres  # version N brings the same on each engine
    assert [int(name[:3]) for name in sqlite] == list(range(1, len(sqlite) + 1))
    assert len(migrations("sqlite")) == len(migrations("postgres")) == len(sqlite) >= 5


def test_the_statement_file_format() -> None:
    found = parse("-- file comment\n\n-- name: a\n-- about a\nSELECT 1\n\n-- name: b.c\n"
                  "SELECT 2\n-- the next section\n")
    assert found == {"a": "-- about a\nSELECT 1", "b.c": "SELECT 2"}
    assert operations(found) == {"a", "b"}


def test_a_rule_is_written_once_as_a_part_and_put_in_where_it_is_used() -> None:
    found = parse("-- part: after(at)\n-- about after\nt > {at}\n\n"
                  "-- part: kept(at)\nNOT {after(:at)} AND {at} IS NOT NULL\n\n"
                  "-- name: a\nSELECT 1 WHERE {after(:now)} AND {kept(:then)} AND {where}\n")
    assert found == {"a": "SELECT 1 WHERE (t > :now) AND (NOT (t > :at) AND :then IS NOT NULL)"
                          " AND {where}"}
    with pytest.raises(ValueError, match="no part named before"):
        parse("-- name: a\nSELECT {before(1)}\n")
    with pytest.raises(ValueError, match="takes"):
        parse("-- part: after(at)\nt > {at}\n-- name: a\nSELECT {after()}\n")


def test_what_may_be_pruned_is_written_once_per_engine() -> None:
    for engine in ("sqlite", "postgres"):
        text = (PACKAGE / "store" / "queries" / engine / "retention.sql").read_text()
        rule = "r.status IN ('succeeded', 'failed_permanent')"
        assert text.count(rule) == 1 and text.count("FROM outbox o") == 1, engine
        statements = load(engine)
        for name in ("prune_runs.due", "remove_bodies.update", "prune_preview"):
            assert rule in statements[name], (engine, name)


def test_no_module_outside_the_store_sees_an_engine_or_a_connection() -> None:
    offenders = []
    for path in modules_outside_the_store():
        for name in imported(ast.parse(path.read_text(encoding="utf-8"))):
            store_module = name.startswith("agentbox.store.") and ".".join(
                name.split(".")[:3]) not in PUBLIC
            if store_module and not _a_name_of(name, "agentbox.store"):
                offenders.append(f"{path.name}: {name}")
            if name.split(".")[0] in DRIVERS:
                offenders.append(f"{path.name}: {name}")
    assert offenders == []


def _a_name_of(name: str, module: str) -> bool:
    """`agentbox.store.Store` (a name the interface exports), not a submodule."""
    head, _, last = name.rpartition(".")
    return head == module and not (PACKAGE / "store" / f"{last}.py").exists()


def test_every_store_attribute_the_rest_of_agentbox_uses_is_declared_on_store() -> None:
    used: set[tuple[str, str]] = set()
    for path in modules_outside_the_store():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and _is_the_store(node.value):
                used.add((path.name, node.attr))
    assert len(used) > 30  # the walk found the callers
    undeclared = sorted((module, attr) for module, attr in used if not hasattr(Store, attr)
                        and attr not in Store.__init__.__code__.co_names)
    assert undeclared == []


def _is_the_store(node: ast.expr) -> bool:
    """`store` or `self.store`."""
    return (isinstance(node, ast.Name) and node.id == "store") or (
        isinstance(node, ast.Attribute) and node.attr == "store")


APP_WORDS = re.compile(r"project|export|review|reference|kept_audio|mix_", re.IGNORECASE)


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value,
                                                                     ast.Constant):
                found.add(id(body[0].value))
    return found


def test_no_app_word_in_the_stores_code_or_statements() -> None:
    """The store knows no app: no app's noun in its names, non-docstring strings or
    named statements (an app's tables, its migration line and statements, are the
    app's; the store's released versions 3, 4 and 7 made the review's, and version 9
    drops what of them held nothing)."""
    found = []
    for path in sorted((PACKAGE / "store").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            text = (node.id if isinstance(node, ast.Name) else node.attr
                    if isinstance(node, ast.Attribute) else node.name
                    if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else node.value
                    if isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and id(node) not in docstrings else "")
            words = [w for w in APP_WORDS.findall(text) if "preview" not in text.lower()]
            if words:
                found.append(f"{path.name}: {text[:60]!r}")
    for engine in ("sqlite", "postgres"):
        for name, text in load(engine).items():
            if APP_WORDS.search(text.replace("prune_preview", "")):
                found.append(f"{engine} {name}")
    assert found == []
