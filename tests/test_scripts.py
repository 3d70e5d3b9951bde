"""scripts/run, scripts/test and scripts/_setup: the two commands the README
gives, as a person runs them (stdlib-only Python, so Windows runs them too)."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from importlib.machinery import SourceFileLoader
from pathlib import Path
from types import ModuleType

import httpx
import pytest

from agentbox import config
from tests.conftest import ROOT, free_port, wait_until

SCRIPTS = ROOT / "scripts"


def load_setup() -> ModuleType:
    loader = SourceFileLoader("_setup", str(SCRIPTS / "_setup"))
    spec = importlib.util.spec_from_loader("_setup", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def fresh_home(home: Path) -> dict[str, str]:
    """A person's environment with nothing of agentbox's yet."""
    keep = {k: v for k, v in os.environ.items()
            if not k.startswith(("AGENTBOX_", "XDG_", "VIRTUAL_ENV", "PYTHON"))}
    return {**keep, "HOME": str(home)}


def test_scripts_are_python_with_a_shebang_and_no_bash() -> None:
    for name in ("run", "test", "check", "_setup"):
        text = (SCRIPTS / name).read_text(encoding="utf-8")
        assert text.startswith("#!/usr/bin/env python3\n"), name
        compile(text, name, "exec")
        assert os.access(SCRIPTS / name, os.X_OK), name


def test_each_os_venv_layout() -> None:
    setup = load_setup()
    venv = Path("checkout") / ".venv"
    assert setup.venv_python(venv, windows=False) == venv / "bin" / "python"
    assert setup.venv_python(venv, windows=True) == venv / "Scripts" / "python.exe"
    assert setup.venv_bin(venv, "agentbox", windows=True) == venv / "Scripts" / "agentbox.exe"


def test_an_install_with_more_extras_counts_until_pyproject_changes(tmp_path: Path) -> None:
    setup = load_setup()
    (tmp_path / ".agentbox-installed-test-dev").touch()
    assert setup._installed(tmp_path, "") and setup._installed(tmp_path, "dev,test")
    assert not setup._installed(tmp_path, "postgres")
    changed = (ROOT / "pyproject.toml").stat().st_mtime
    os.utime(tmp_path / ".agentbox-installed-test-dev", (changed - 1, changed - 1))
    assert not setup._installed(tmp_path, "")  # pyproject.toml is newer: install again


def test_picks_a_python_new_enough() -> None:
    command = load_setup().pick_python()
    done = subprocess.run([*command, "-c", "import sys; print(sys.version_info >= (3, 11))"],
                          capture_output=True, text=True)
    assert done.stdout == "True\n"


@pytest.mark.slow
def test_scripts_run_starts_agentbox_with_a_secret_made_in_the_config_dir(
        tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "run.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([str(SCRIPTS / "run"), "--port", str(port)],
                                   env=fresh_home(tmp_path), cwd=tmp_path, stdout=out,
                                   stderr=out)

    def healthy() -> bool:
        assert process.poll() is None, log.read_text()
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
        except httpx.TransportError:
            return False

    try:
        # the first run may install agentbox into .venv: minutes on a slow machine
        wait_until(healthy, 300, "scripts/run to answer /healthz")
        secret = tmp_path / ".config" / "agentbox" / config.WEBHOOK_SECRET_FILE
        assert len(config.secrets_in_file(secret)[0]) >= 32
        assert (tmp_path / ".local" / "share" / "agentbox").is_dir()  # the data dir
    finally:
        process.send_signal(signal.SIGTERM)  # scripts/run became agentbox (exec)
        status = process.wait(60)
    assert status in (0, -signal.SIGTERM), log.read_text()
    assert "agentbox stopped" in log.read_text()


def test_scripts_test_hands_its_arguments_to_pytest(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPTS / "test"), "--collect-only", "-q",
                           "tests/test_signing.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "tests collected" in done.stdout


def test_scripts_test_runs_two_workers_unless_the_arguments_choose(
        monkeypatch: pytest.MonkeyPatch) -> None:
    loader = SourceFileLoader("scripts_test", str(SCRIPTS / "test"))
    spec = importlib.util.spec_from_loader("scripts_test", loader)
    assert spec is not None
    script = importlib.util.module_from_spec(spec)
    loader.exec_module(script)
    monkeypatch.delenv("AGENTBOX_TEST_WORKERS", raising=False)
    assert script.with_workers(["-k", "signing"]) == ["-n", "2", "-k", "signing"]
    for chosen in (["-n", "0"], ["-n4"], ["--numprocesses=3"], ["--dist", "load"], ["--pdb"],
                   ["-x", "-p", "no:xdist"], ["--trace"]):
        assert script.with_workers(chosen) == chosen
    assert script.with_workers(["-p", "no:cacheprovider"])[:2] == ["-n", "2"]
    monkeypatch.setenv("AGENTBOX_TEST_WORKERS", "3")
    assert script.with_workers([])[:2] == ["-n", "3"]


def test_the_benchmark_seeds_a_store_of_the_current_schema(tmp_path: Path) -> None:
    """scripts/bench's seeded phases write with SQL: the store they make must be the
    one agentbox opens today (it once imported a schema constant that had gone)."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        import bench
    finally:
        sys.path.remove(str(SCRIPTS))
    for name, backlog in (("history", False), ("backlog", True)):
        bench.seed(tmp_path / name, 300, backlog=backlog)
        checked = subprocess.run(
            [sys.executable, "-m", "agentbox", "verify", "--data-dir", str(tmp_path / name)],
            capture_output=True, text=True, timeout=60)
        assert checked.returncode == 0 and checked.stdout.strip().endswith(": ok"), checked


def test_a_floor_server_answers_without_the_parts_it_takes_out(tmp_path: Path) -> None:
    """scripts/floors measures agentbox with parts taken out (bench_floor.py): the
    server must still answer every event 202, and what was taken out must be gone:
    with no SQL the store holds no event, with no runs none is claimed."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        import bench
        import bench_floor
    finally:
        sys.path.remove(str(SCRIPTS))
    with pytest.raises(SystemExit, match="unknown"):
        bench_floor.take_out({"no-fsync"})
    events = bench.write_events(tmp_path, "floor", 20)
    for floor, events_stored in (("no-sql,no-runs", 0), ("no-runs", 20)):
        server = bench.Server("agentbox", tmp_path / floor, floor=floor)
        try:
            answered = [httpx.post(f"{server.url}/webhooks/events", content=body, headers={
                "Content-Type": "application/json", "X-Webhook-Timestamp": ts,
                "X-Webhook-Signature": signature}).status_code
                for ts, signature, body in (line.split("\t", 2) for line in
                                            events.read_text().splitlines())]
        finally:
            server.stop()
        assert answered == [202] * 20, floor
        rows = bench.store_rows(tmp_path / floor, None, "SELECT count(*) FROM events", ())
        statuses = bench.store_rows(tmp_path / floor, None,
                                    "SELECT DISTINCT status FROM runs", ())
        assert rows[0][0] == events_stored, floor
        assert [tuple(row) for row in statuses] == ([("accepted",)] if events_stored else [])
