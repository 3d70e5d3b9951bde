"""The manual's examples as files: what a reader of docs/apps.md or docs/agents.md
would type, taken from the Markdown itself.

Each fenced block (python, sql, html) whose first line names a file (`# pkg/mod.py`,
`-- pkg/tables/sqlite/001_x.sql`, `{# pkg/templates/x.html #}`) is that file, or
more of it when an earlier block named it too; a block that names none continues
the file of the block before it. Read in order, so an example may use what an
earlier one defined, never what a later one does.
"""

from __future__ import annotations

import builtins
import re
import symtable
from pathlib import Path

from agentbox import manual

FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)
NAMED = re.compile(r"^(?:#|--|\{#)\s*([\w./-]+\.(?:py|sql|html|css|js))\b")
KINDS = {"python", "sql", "html"}


def blocks(topic: str) -> list[tuple[str, str]]:
    """The topic's fenced blocks of code, in order: (language, text)."""
    return [(kind, text) for kind, text in FENCE.findall(manual.text(topic))
            if kind in KINDS]


def files(topic: str) -> dict[str, str]:
    """Each file the topic's examples make, by its path, in the order first named."""
    made: dict[str, str] = {}
    current: str | None = None
    for _, text in blocks(topic):
        named = NAMED.match(text)
        if named:
            current = named.group(1)
        if current is None:
            raise AssertionError(f"{topic}.md: a block before any names its file:\n{text}")
        made[current] = made.get(current, "") + ("\n" if current in made else "") + text
    return made


def write(topic: str, root: Path) -> list[Path]:
    """The topic's files under `root`, and nothing else (a package's __init__.py only
    where the manual gives it, as a reader would have it); the paths."""
    written = []
    for name, text in files(topic).items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def undefined(source: str, name: str = "<example>") -> set[str]:
    """The names a module's code uses that it neither defines nor imports (nor are
    builtins): what a reader copying the example would find missing."""
    table = symtable.symtable(source, name, "exec")
    known = set(dir(builtins)) | {"__file__", "__name__"}
    defined = {s.get_name() for s in table.get_symbols()
               if s.is_assigned() or s.is_imported() or s.is_namespace()}
    missing: set[str] = set()

    def visit(scope: symtable.SymbolTable) -> None:
        for symbol in scope.get_symbols():
            at_module = scope.get_type() == "module"
            global_use = at_module or symbol.is_global()
            if (symbol.is_referenced() and global_use and symbol.get_name() not in defined
                    and symbol.get_name() not in known):
                missing.add(symbol.get_name())
        for child in scope.get_children():
            visit(child)

    visit(table)
    return missing
