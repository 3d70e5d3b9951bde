"""Apps' tables on every engine (store/tables.py): a line is migrated once and
recorded by name, and a newer line refuses to start. The review's line on a release's
database: test_release_schema.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agentbox.archive.history import SCHEMA
from agentbox.store import SchemaTooNew
from tests.review_tables.test_release_schema import run
from tests.store.conftest import Engine


def test_a_line_newer_than_the_code_refuses_to_open(engine: Engine,
                                                    aio: Callable[..., Any]) -> None:
    store = engine.new_store()
    store.add_tables(SCHEMA)
    aio(store.open())
    aio(store.close())
    run(engine, "INSERT INTO agentbox_lines (line, version, applied_at) VALUES ('review', 9, 0)")
    again = engine.new_store()
    again.add_tables(SCHEMA)
    with pytest.raises(SchemaTooNew, match=r"\(review\) has schema version 9"):
        aio(again.open())
