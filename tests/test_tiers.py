"""The two test tiers: a test of the fast tier (`-m "not slow"`) cannot start a
server subprocess, Chromium or PostgreSQL; if it tries, it fails and says to
mark it slow (see tests/conftest.py). So the marks stay right as tests are added."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, SLOW_FIXTURES, Server, slow_command


def test_a_fast_test_that_starts_a_server_fails_asking_for_the_mark(tmp_path: Path) -> None:
    server = Server(tmp_path)
    try:
        with pytest.raises(pytest.fail.Exception, match=r"mark it @pytest\.mark\.slow"):
            server.start()
        assert server.process is None  # refused before anything started
    finally:
        server.close()


def test_a_fast_test_may_start_other_programs() -> None:
    done = subprocess.run([sys.executable, "-c", "print('ok')"], capture_output=True,
                          text=True, timeout=60, check=True)
    assert done.stdout == "ok\n"


@pytest.mark.parametrize(("command", "started"), [
    ([sys.executable, "-m", "agentbox", "serve", "--port", "1"], "agentbox serve"),
    (["/usr/bin/chromium", "--headless"], "chromium"),
    (["/usr/lib/postgresql/15/bin/initdb", "-D", "/tmp/x"], "initdb"),
    (["runuser", "-u", "nobody", "--", "/usr/lib/postgresql/15/bin/pg_ctl", "start"], "pg_ctl"),
    (["/venv/lib/playwright/driver/node", "cli.js", "run-driver"],
     "the Playwright driver (Chromium)"),
    ([sys.executable, "-m", "agentbox", "send", "mix.wav"], None),
    (["openssl", "req", "-x509"], None),
    ("openssl version", None),
    ([], None),
])
def test_what_counts_as_a_slow_process(command: list[str] | str, started: str | None) -> None:
    assert slow_command(command) == started


@pytest.mark.slow
def test_a_slow_test_may_start_a_server(tmp_path: Path) -> None:
    server = Server(tmp_path)
    try:
        assert server.start().client.get("/healthz").status_code == 200
    finally:
        server.close()


def test_the_fixtures_that_mark_a_test_slow_exist() -> None:
    """A renamed fixture would leave its tests in the fast tier (until the guard above
    failed each one)."""
    from tests import conftest, test_page, test_page_reviews

    for name in SLOW_FIXTURES:
        assert any(hasattr(module, name) for module in (conftest, test_page,
                                                         test_page_reviews)), name


def test_each_shared_module_runs_whole_in_one_worker() -> None:
    """With the tests in several processes, a module whose module-scoped fixture is
    costly (a build, Chromium, reviewed exports) goes whole to one, so the fixture is
    made once; every other test is a unit of its own."""
    pytest.importorskip("xdist")
    from types import SimpleNamespace

    from tests.conftest import SHARED_MODULES, pytest_xdist_make_scheduler

    for module in SHARED_MODULES:
        assert (ROOT / module).is_file(), module
    config = SimpleNamespace(getvalue=lambda name: "load",
                             option=SimpleNamespace(tx=["popen"] * 2, numprocesses=2,
                                                    dist="load"))
    scheduler = pytest_xdist_make_scheduler(config, None)  # type: ignore[arg-type]
    assert scheduler._split_scope("tests/test_build.py::test_a") == "tests/test_build.py"
    assert scheduler._split_scope("tests/test_page.py::test_b[x]") == "tests/test_page.py"
    assert scheduler._split_scope("tests/test_server.py::test_c") == (
        "tests/test_server.py::test_c")
    each = SimpleNamespace(getvalue=lambda name: "each")
    assert pytest_xdist_make_scheduler(each, None) is None  # type: ignore[arg-type]
