"""The engine knows no app in its words either (DESIGN.md, 18): no name and no string
of the engine's code speaks of the review or the desktop side, as tests/test_imports.py
holds that no engine module imports them.

The engine's code: agentbox/engine/, agentbox/store/, agentbox/http/, and the core
modules events.py, config.py, models.py, runs.py and signing.py. Counted: every name
(variables, attributes, functions, classes, parameters, keywords, imported names) and
every string that is not a docstring, each split into words (`mix_profile`:
mix, profile; `"session.exported"`: session, exported). Comments and docstrings are
free to say what the engine serves. An app's word is one of APP_WORDS in any of its
forms (exports, exported, reviewer...).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "agentbox"
ENGINE_ROOMS = ("engine", "store", "http")
ENGINE_MODULES = ("events.py", "config.py", "models.py", "runs.py", "signing.py")

# The review's and the desktop side's nouns: what they do, what they keep, their settings.
APP_WORDS = ("review", "desktop", "tray", "mix", "master", "stage", "profile", "genre",
             "llm", "watch", "archive", "project", "export", "reference", "song", "loudness",
             "lufs", "daw")
FORMS = re.compile(r"(?:" + "|".join(APP_WORDS) + r")(?:s|es|d|ed|er|ers|ing)?")
# Names that say one of those words in another sense: SQLite's catalogue, and the store
# keeping an eye on its write-ahead log.
OTHER_SENSES = {"sqlite_master", "_watch_wal"}

# Offenders, by file: each app word it may still say, and how often (a file's count may
# only fall). Issue #51 emptied it; a file of the engine not listed here says none.
ALLOWED: dict[str, dict[str, int]] = {}


def engine_files() -> Iterator[Path]:
    for room in ENGINE_ROOMS:
        yield from sorted((PACKAGE / room).rglob("*.py"))
    for name in ENGINE_MODULES:
        yield PACKAGE / name


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef
                      | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                found.add(id(body[0].value))
    return found


def texts(tree: ast.AST) -> Iterator[str]:
    """Every name and every non-docstring string of a module."""
    skip = docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.Attribute):
            yield node.attr
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield node.name
        elif isinstance(node, ast.arg) or (isinstance(node, ast.keyword) and node.arg):
            yield node.arg
        elif isinstance(node, ast.alias):
            yield node.asname or node.name
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in skip:
            yield node.value


def words(text: str) -> Iterator[str]:
    """A name's or a string's words: split at anything not a letter, and at camelCase."""
    for part in re.split(r"[^A-Za-z]+", text):
        yield from (w.lower() for w in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])", part))


def app_words(path: Path) -> Counter[str]:
    """The app words a module of the engine says, by word as APP_WORDS spell it."""
    found: Counter[str] = Counter()
    for text in texts(ast.parse(path.read_text(encoding="utf-8"))):
        for other in OTHER_SENSES:
            text = text.replace(other, " ")
        for word in words(text):
            if FORMS.fullmatch(word):
                found[next(w for w in APP_WORDS if word.startswith(w))] += 1
    return found


def test_the_words_are_found() -> None:
    """The check can fail: a module of app words is caught, its docstring is not."""
    tree = ast.parse('"""Exports and reviews."""\nmix_profile = "session.exported"\n'
                     "def watchedFolders(project): return {'kind': 'archive'}\n")
    found = Counter(w for text in texts(tree) for w in words(text) if FORMS.fullmatch(w))
    assert found == Counter({"mix": 1, "profile": 1, "exported": 1, "watched": 1,
                             "project": 1, "archive": 1})


def test_no_app_word_in_the_engine() -> None:
    problems = []
    for path in engine_files():
        name = path.relative_to(ROOT).as_posix()
        allowed = ALLOWED.get(name, {})
        for word, count in sorted(app_words(path).items()):
            if count > allowed.get(word, 0):
                problems.append(f"{name}: {word!r} {count} times (allowed {allowed.get(word, 0)})")
    assert not problems, "app words in the engine's code:\n" + "\n".join(problems)


def test_config_and_events_say_no_app_word() -> None:
    """The settings' and the contract's modules are the engine's alone: no allowance."""
    for name in ("config.py", "events.py"):
        assert f"agentbox/{name}" not in ALLOWED
        assert not app_words(PACKAGE / name), name
