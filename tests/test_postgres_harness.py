"""The PostgreSQL test harness itself: a real server, durable settings, loopback only,
one fresh database per test, and AGENTBOX_TEST_REQUIRE_POSTGRES turning skips into
failures."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psycopg
import pytest

from tests import postgres

ROOT = Path(__file__).resolve().parents[1]
EXTERNAL = bool(os.environ.get(postgres.DATABASE_URL_ENV))


def show(url: str, setting: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute(f"SHOW {setting}").fetchone()
    assert row is not None
    return str(row[0])


@pytest.mark.postgres
def test_fresh_database_is_empty_and_durable(postgres_url: str) -> None:
    assert postgres.database_name(postgres_url).startswith("agentbox_t_")
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute("SELECT current_database(), count(*) FROM pg_tables "
                           "WHERE schemaname = 'public'").fetchone()
        assert row == (postgres.database_name(postgres_url), 0)
    assert show(postgres_url, "fsync") == "on"
    assert show(postgres_url, "synchronous_commit") == "on"


@pytest.mark.postgres
@pytest.mark.skipif(EXTERNAL, reason=f"{postgres.DATABASE_URL_ENV} names someone else's server")
def test_started_server_listens_on_loopback_only(postgres_admin_url: str) -> None:
    port = int(postgres_admin_url.rsplit(":", 1)[1].split("/")[0])
    with psycopg.connect(postgres_admin_url) as conn:
        row = conn.execute("SELECT host(inet_server_addr()), inet_server_port(), "
                           "current_setting('listen_addresses'), "
                           "current_setting('unix_socket_directories'), "
                           "current_setting('data_directory'), "
                           "current_setting('max_connections'), "
                           "current_setting('shared_buffers')").fetchone()
    assert row is not None
    address, server_port, listen, sockets, data, max_connections, shared_buffers = row
    assert (address, server_port, listen) == ("127.0.0.1", port, "127.0.0.1")
    # the socket lives beside the data, in the server's own temporary directory
    assert Path(sockets).parent == Path(data).parent
    assert Path(data).parent.name.startswith("agentbox-pg-")
    assert (max_connections, shared_buffers) == ("200", "128MB")


@pytest.mark.postgres
def test_two_fresh_databases_are_distinct(postgres_admin_url: str, postgres_url: str) -> None:
    other = postgres.fresh_database(postgres_admin_url)
    try:
        assert postgres.database_name(other) != postgres.database_name(postgres_url)
        with psycopg.connect(postgres_url) as conn:
            conn.execute("CREATE TABLE only_here (x int)")
        with psycopg.connect(other) as conn:
            row = conn.execute("SELECT to_regclass('only_here')").fetchone()
            assert row == (None,)
    finally:
        postgres.drop_database(postgres_admin_url, other)


@pytest.mark.postgres
def test_drop_database_ends_open_sessions(postgres_admin_url: str) -> None:
    url = postgres.fresh_database(postgres_admin_url)
    with psycopg.connect(url) as idle:
        postgres.drop_database(postgres_admin_url, url)
        with pytest.raises(psycopg.OperationalError):
            idle.execute("SELECT 1")
    with psycopg.connect(postgres_admin_url) as conn:
        row = conn.execute("SELECT count(*) FROM pg_database WHERE datname = %s",
                           (postgres.database_name(url),)).fetchone()
    assert row == (0,)


INNER_CONFTEST = """
from tests.conftest import (  # noqa: F401
    postgres_admin_url,
    postgres_url,
    pytest_terminal_summary,
)
"""
INNER_TEST = """
def test_needs_postgres(postgres_url):
    pass
"""


@pytest.mark.parametrize("required", [False, True])
def test_require_postgres_turns_the_skip_into_a_failure(tmp_path: Path, required: bool) -> None:
    """Without PostgreSQL the test is skipped; with AGENTBOX_TEST_REQUIRE_POSTGRES=1 the
    run fails and says why. (A pytest run in a subprocess; needs no PostgreSQL.)"""
    (tmp_path / "conftest.py").write_text(textwrap.dedent(INNER_CONFTEST))
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER_TEST))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTBOX_")}
    env.update(PYTHONPATH=str(ROOT), AGENTBOX_TEST_PG_BINDIR=str(tmp_path / "no-such-dir"),
               PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    if required:
        env[postgres.REQUIRE_ENV] = "1"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-ra", "-p", "no:cacheprovider", "test_inner.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False)
    output = result.stdout + result.stderr
    if required:
        assert result.returncode == 1, output
        assert "1 error" in output, output
        assert f"{postgres.REQUIRE_ENV}=1 makes a missing PostgreSQL a failure" in output, output
        assert "PostgreSQL required but unavailable" in output, output
    else:
        assert result.returncode == 0, output
        assert "1 skipped" in output, output
        assert "install Debian's `postgresql` package" in output, output


def test_require_postgres_fails_a_run_in_worker_processes_and_says_why(tmp_path: Path) -> None:
    """scripts/test runs the tests in worker processes (pytest-xdist): the failure
    happens in a worker, and the main process's summary still says why."""
    conftest = INNER_CONFTEST.replace("    pytest_terminal_summary,",
                                      "    pytest_runtest_logreport,\n    pytest_terminal_summary,")
    (tmp_path / "conftest.py").write_text(textwrap.dedent(conftest))
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER_TEST))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTBOX_")}
    env.update(PYTHONPATH=str(ROOT), AGENTBOX_TEST_PG_BINDIR=str(tmp_path / "no-such-dir"),
               PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", **{postgres.REQUIRE_ENV: "1"})
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-ra", "-p", "no:cacheprovider", "-p", "xdist",
         "-n", "1", "test_inner.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    output = result.stdout + result.stderr
    assert "1 worker" in output, output  # it did run in a worker process
    assert result.returncode == 1, output
    assert "1 error" in output, output
    assert "PostgreSQL required but unavailable" in output, output
