"""What an app keeps of each event stored (Schema.keeps), on every engine: its
statements run in the ingest's transaction, for each run of an event that gave a
value, with what the engine binds (docs/apps.md: SQLite once per run with :run_id,
:source, :accepted_at and :value or the object's fields; PostgreSQL once with
%(rows)s)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agentbox.store import Store
from tests.store.conftest import Engine
from tests.store.support import T0, ingest, raw_rows
from tests.support.keeper import SCHEMA


@pytest.fixture
def keeping(engine: Engine, aio: Callable[..., Any]) -> Iterator[Store]:
    store = engine.new_store()
    store.add_tables(SCHEMA)
    aio(store.open())
    yield store
    aio(store.close())


def kept_rows(engine: Engine) -> dict[str, tuple[Any, ...]]:
    rows = raw_rows(engine, "SELECT run_id, value, name, tags, size, source, accepted_at "
                            "FROM kept_values")
    return {row[0]: tuple(row[1:]) for row in rows}


def test_each_run_of_an_event_that_gave_a_value_is_kept_with_its_fields(
        engine: Engine, keeping: Store, aio: Callable[..., Any]) -> None:
    async def write() -> list[Any]:
        # Sent at once: the writer gathers them into one transaction, as under load.
        return await asyncio.gather(
            ingest(keeping, "object-1", agents=("a1", "a2")),
            ingest(keeping, "scalar-1"), ingest(keeping, "none-1"),
            ingest(keeping, "quote-1"))

    obj, scalar, nothing, quote = aio(write())
    kept = kept_rows(engine)
    assert set(kept) == {*(r.run_id for r in obj.runs), scalar.runs[0].run_id,
                         quote.runs[0].run_id}  # "none": its event gave no value
    for run in obj.runs:  # both agents' runs; the field it lacks (size) is NULL
        value, name, tags, size, source, accepted_at = kept[run.run_id]
        assert json.loads(value) == {"name": "n", "tags": [1, "two"]}
        assert (name, json.loads(tags), size, source, accepted_at) == (
            "n/n", [1, "two"], None, "studio", T0)
    assert kept[scalar.runs[0].run_id] == ("a text", None, None, None, "studio", T0)
    assert kept[quote.runs[0].run_id][1:] == ("it's/it's", None, None, "studio", T0)
    assert nothing.runs and not nothing.duplicate


def test_a_duplicate_keeps_nothing_more(engine: Engine, keeping: Store,
                                        aio: Callable[..., Any]) -> None:
    first = aio(ingest(keeping, "object-2"))
    again = aio(ingest(keeping, "object-2"))
    assert again.duplicate and list(kept_rows(engine)) == [first.runs[0].run_id]
