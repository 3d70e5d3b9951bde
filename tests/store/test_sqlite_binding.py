"""What the SQLite store changes of sqlite3's process-wide state, and its writer's
hand-over to its thread (agentbox/store/sqlite.py, store/writer.py: `on_thread`):
None and bytes parameters get an adapter that answers them as they are, so binding
them skips sqlite3's slow search for one, and binds the same NULL and BLOB; an
adapter the process registered first stays."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given
from hypothesis import strategies as st

import agentbox.store.sqlite  # noqa: F401  (registers its adapters)
from agentbox.store.writer import on_thread


@given(st.one_of(st.none(), st.binary(max_size=64)))
def test_none_and_bytes_bind_as_null_and_blob(value: bytes | None) -> None:
    assert sqlite3.adapters[(type(None), sqlite3.PrepareProtocol)] is not None
    assert sqlite3.adapters[(bytes, sqlite3.PrepareProtocol)] is not None
    conn = sqlite3.connect(":memory:")
    try:
        kind, back = conn.execute("SELECT typeof(?1), ?1", (value,)).fetchone()
    finally:
        conn.close()
    assert kind == ("null" if value is None else "blob")
    assert back == value


def test_an_adapter_the_process_registered_first_stays() -> None:
    """An agent's own adapter for bytes, registered before agentbox's store is
    imported, is the one sqlite3 uses after it."""
    code = (
        "import sqlite3\n"
        "sqlite3.register_adapter(bytes, lambda b: b.hex())\n"
        "import agentbox.store.sqlite\n"
        "conn = sqlite3.connect(':memory:')\n"
        "print(conn.execute('SELECT ?', (b'ab',)).fetchone()[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out.strip() == "6162"


def test_on_thread_answers_the_calls_value_or_raises_its_exception() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(1, thread_name_prefix="writer") as thread:
            assert await on_thread(loop, thread, sum, [1, 2, 3]) == 6
            with pytest.raises(ZeroDivisionError):
                await on_thread(loop, thread, divmod, 1, 0)

    asyncio.run(scenario())
