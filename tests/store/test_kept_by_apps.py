"""What an app keeps of each event stored (Schema.keeps), on every engine: its
statements run in the ingest's transaction, for each run of an event that gave a
value, with what the engine binds (docs/apps.md: SQLite once per run with :run_id,
:source, :accepted_at and :value or the object's fields; PostgreSQL once with
%(rows)s)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentbox.store import Store
from agentbox.store.sqlite import _keeping, _kept_rows, _numbered, _parameters
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


def test_a_statement_that_takes_runs_counts_a_transaction_s_runs_once_per_name(
        engine: Engine, keeping: Store, aio: Callable[..., Any]) -> None:
    """`:runs` (SQLite): the statement runs once per distinct set of its other values,
    bound to the latest of those runs (by accepted_at, then run id); PostgreSQL's
    statement counts set-wise. Either way the counts and the latest are the same."""
    async def write(ids: list[str], now: float) -> list[Any]:
        return await asyncio.gather(*(ingest(keeping, i, now=now) for i in ids))

    first = aio(write(["object-a", "quote-a", "object-b", "scalar-a", "object-c"], T0))
    later = aio(write(["object-d"], T0 + 5))
    earlier = aio(write(["quote-b"], T0 - 5))  # counted, but not the latest
    counts = {row[0]: tuple(row[1:]) for row in raw_rows(
        engine, "SELECT name, runs, latest, accepted_at FROM kept_counts")}
    objects = [r.runs[0].run_id for r in first if r.runs[0].run_id in kept_rows(engine)
               and kept_rows(engine)[r.runs[0].run_id][1] == "n/n"]
    assert len(objects) == 3
    assert counts["n"] == (4, later[0].runs[0].run_id, T0 + 5)
    quote = first[1].runs[0].run_id
    assert counts["it's"] == (2, quote, T0)
    assert earlier[0].runs[0].run_id != quote and set(counts) == {"n", "it's"}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", None]), st.sampled_from(["s", "t"]),
                          st.sampled_from([1.0, 2.0, 3.0])), max_size=12))
def test_grouped_rows_are_one_per_set_of_values_with_the_latest_run_and_the_count(
        given_rows: list[tuple[str | None, str, float]]) -> None:
    """SQLite's `:runs` grouping (sqlite._kept_rows), against counting each run."""
    keeping = _keeping("INSERT INTO t VALUES (:name, :source, :runs, :run_id, :accepted_at)")
    rows = [(f"run_{i:03d}", {"name": name}, source, accepted_at)
            for i, (name, source, accepted_at) in enumerate(given_rows)]
    expected: dict[tuple[Any, ...], list[Any]] = {}
    for run_id, value, source, accepted_at in rows:
        key = (value["name"], source)
        count, latest = expected.get(key, (0, (0.0, "")))
        expected[key] = [count + 1, max(latest, (accepted_at, run_id))]
    grouped = _kept_rows(rows, keeping)
    assert {(name, source): [runs, (accepted_at, run_id)]
            for name, source, runs, run_id, accepted_at in grouped} == expected
    assert len(grouped) == len(expected)


_NAMES = st.sampled_from(["a", "b", "run_id", "x1"])
_TEXT = st.text(alphabet=":'\"ab -*/", max_size=8)
_ITEMS = st.lists(st.one_of(
    st.tuples(st.just("parameter"), _NAMES),
    st.tuples(st.just("literal"), _TEXT.map(lambda text: text.replace("\n", " ")))),
    min_size=1, max_size=6)
_COMMENTS = st.sampled_from(["", " /* :c 'x */ ", " -- :d ' \n", "\n-- :a\n"])


@settings(max_examples=200, deadline=None)
@given(_ITEMS, st.lists(_COMMENTS, min_size=7, max_size=7))
def test_named_parameters_are_found_outside_literals_and_comments_alone(
        items: list[tuple[str, str]], comments: list[str]) -> None:
    """The writer's statements are bound by position (sqlite._numbered): SQLite, given
    the numbered text, answers each parameter's value and each literal as written."""
    columns, expected = [], []
    for kind, value in items:
        if kind == "parameter":
            columns.append(f":{value}")
            expected.append(f"value of {value}")
        else:
            columns.append("'" + value.replace("'", "''") + "'")
            expected.append(value)
    sql = "SELECT " + ", ".join(f"{comments[i]}{column}" for i, column in enumerate(columns))
    names = list(dict.fromkeys(_parameters(sql)))
    assert names == list(dict.fromkeys(v for k, v in items if k == "parameter"))
    with sqlite3.connect(":memory:") as conn:
        row = conn.execute(_numbered(sql, names), [f"value of {n}" for n in names]).fetchone()
    assert list(row) == expected
