"""`agentbox serve` starting, as a person sees it: what keeps it from starting in one
sentence and no traceback, nothing saying it listens before it does, and a window
of readable lines (not JSON) on a terminal."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, SECRET, Server, free_port, wait_until
from tests.test_client import tone

pytestmark = pytest.mark.slow  # agentbox serve in a process of its own


def serve(tmp_path: Path, *args: str, **environ: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path),
           "XDG_CONFIG_HOME": str(tmp_path / "config"),
           "AGENTBOX_DATA_DIR": str(tmp_path / "data"), "AGENTBOX_WEBHOOK_SECRET": SECRET,
           "AGENTBOX_NOTIFY": "0", "AGENTBOX_LOG_FORMAT": "text", **environ}
    return subprocess.run([sys.executable, "-m", "agentbox", "serve", *args], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def refused(done: subprocess.CompletedProcess[str]) -> str:
    """What a refused start said (in a terminal's text lines): one line on stderr,
    nothing else anywhere."""
    assert done.stdout == ""
    lines = [line for line in done.stderr.splitlines()
             if not line.startswith("agentbox: webhook secret is in ")]  # (a first start)
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr and "is ready" not in done.stderr
    assert "listening" not in done.stderr
    return lines[0]


def test_a_port_in_use_is_said_with_the_fix(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = serve(tmp_path, "--port", str(port))
    assert done.returncode == 1
    assert refused(done) == (f"agentbox: port {port} is in use (by another agentbox? then "
                             "it is already running); choose another with --port")


def test_a_second_agentbox_on_the_same_data_directory_is_said(server: Server,
                                                              tmp_path: Path) -> None:
    server.env["AGENTBOX_LOG_FORMAT"] = "text"  # as in a terminal's window
    done = subprocess.run(
        [sys.executable, "-m", "agentbox", "serve", "--port", str(free_port())],
        env=server.env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert refused(done) == (f"agentbox: another agentbox process is already serving "
                             f"{server.home / 'data'}; stop it or use another --data-dir")
    same_port = subprocess.run(  # a second scripts/run: the port is the first thing said
        [sys.executable, "-m", "agentbox", "serve", "--port", str(server.port)],
        env=server.env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert same_port.returncode == 1
    assert refused(same_port).startswith(f"agentbox: port {server.port} is in use")
    assert server.client.get("/healthz").status_code == 200  # the first goes on


def test_configuration_that_cannot_serve_is_exit_status_2(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    no_dir = serve(tmp_path, "--port", str(free_port()),
                   AGENTBOX_DATA_DIR=str(tmp_path / "a-file" / "data"))
    assert no_dir.returncode == 2
    assert refused(no_dir) == (f"agentbox: the data directory {tmp_path / 'a-file' / 'data'} "
                               "cannot be made (Not a directory); choose another with "
                               "--data-dir or AGENTBOX_DATA_DIR")
    toml = tmp_path / "agentbox.toml"
    toml.write_text("port = \n")
    bad_toml = serve(tmp_path, "--config", str(toml))
    assert bad_toml.returncode == 2
    assert refused(bad_toml).startswith(f"agentbox: config file {toml} cannot be read: ")
    assert "at line 1" in bad_toml.stderr and "fix it there" in bad_toml.stderr
    # The format itself refused: auto's, a JSON line where stderr is no terminal.
    bad_format = serve(tmp_path, AGENTBOX_LOG_FORMAT="xml")
    assert bad_format.returncode == 2
    said = json.loads(refused(bad_format))
    assert said["msg"] == "AGENTBOX_LOG_FORMAT must be one of auto, text, json, not 'xml'"
    assert said["exit_status"] == 2 and said["level"] == "error"


def test_the_window_says_ready_then_each_review_with_its_verdict(server_factory: Any,
                                                                 tmp_path: Path) -> None:
    server = server_factory({"AGENTBOX_AGENTS": "", "AGENTBOX_LOG_FORMAT": "text"}).start()
    mix = tone(tmp_path / "night-drive.wav", seconds=1.0)
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    for path in (mix, empty):
        assert server.post({"schema_version": "v1", "event_id": path.stem,
                            "idempotency_key": f"t:session.exported:{path.stem}",
                            "event_type": "session.exported", "source": "t",
                            "timestamp": "2026-07-27T14:02:00Z",
                            "payload": {"project_id": "Night Drive",
                                        "mix_url": str(path)}}).status_code == 202

    def window() -> list[str]:
        return [line[9:] for line in server.log_path.read_text().splitlines()]

    wait_until(lambda: any(line.startswith("empty.wav: ") for line in window()) and any(
        line.startswith("night-drive.wav: ") for line in window()), 60, "both reviews")
    said = window()
    assert said[0].startswith(f"agentbox is ready at {server.url} (data in "
                              f"{server.home / 'data' / 'agentbox.sqlite3'}); open the page, "
                              f"logged in, at http://{server.page_name()}:{server.port}"
                              "/ui/login?code=")
    verdict = server.client.get("/runs").json()["runs"]
    review = next(r for r in verdict if r["file"] == "night-drive.wav")["result"]
    assert any(line.startswith(f"night-drive.wav: {review['verdict']} · ") and "LUFS" in line
               for line in said)
    assert "empty.wav: couldn't review: the file is empty — export it again" in said
    assert not any(line.lstrip().startswith("{") for line in said)  # no JSON
    assert not any("run state changed" in line or "succeeded" in line for line in said)
    assert len(said) <= 6, said


def test_json_lines_when_not_on_a_terminal(server: Server) -> None:
    """The fixture's server writes to a file: JSON lines, as always, and the ready line
    once it listens, with where."""
    wait_until(lambda: "agentbox is ready" in server.log_path.read_text(), 30, "ready")
    ready = next(json.loads(line) for line in server.log_path.read_text().splitlines()
                 if "agentbox is ready" in line)
    assert ready["url"] == server.url and ready["database"].endswith("agentbox.sqlite3")


def test_json_logs_are_json_on_every_line_from_the_first(server_factory: Any) -> None:
    """A first start that makes the webhook secret and tightens a database file left
    readable by others: what it says of both is a JSON line too (plain lines there
    stopped `jq` reading the stream), and so is every other line."""
    server = server_factory()
    del server.env["AGENTBOX_WEBHOOK_SECRET"]  # made at this start
    (server.home / "data").mkdir(mode=0o700)
    database = server.home / "data" / "agentbox.sqlite3"
    database.touch()
    database.chmod(0o644)
    server.start()
    wait_until(lambda: "agentbox is ready" in server.log_path.read_text(), 30, "ready")
    lines = [json.loads(line) for line in server.log_path.read_text().splitlines()]
    said = {line["msg"]: line["level"] for line in lines}
    assert said[f"{database} could be read by other users (644); now 600"] == "warning"
    assert any(msg.startswith("webhook secret is in ") for msg in said), said
