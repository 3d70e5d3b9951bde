"""The CLI finds the server on whatever port it was started: the running server
records where it listens in a file of the user's alone, and the clients read it
after --url and AGENTBOX_URL, before the configuration."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentbox.client import recorded_url, runtime_file
from tests.conftest import Server, wait_until


def agentbox(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentbox", *args], env=env,
                          capture_output=True, text=True, timeout=60, cwd=cwd)


@pytest.mark.parametrize("runtime_dir", [True, False], ids=["runtime-dir", "data-dir"])
def test_the_cli_finds_a_server_on_another_port(server_factory: Any, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                runtime_dir: bool) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    env = {"XDG_RUNTIME_DIR": str(run)} if runtime_dir else {}
    server: Server = server_factory(env)
    if not runtime_dir:
        server.env.pop("XDG_RUNTIME_DIR", None)
    server.start()
    data_dir = Path(server.env["AGENTBOX_DATA_DIR"])
    for name in ("XDG_RUNTIME_DIR", "AGENTBOX_URL", "AGENTBOX_PORT", "AGENTBOX_HOST"):
        monkeypatch.delenv(name, raising=False)
    if runtime_dir:
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    recorded = runtime_file(data_dir)
    assert (recorded.parent.parent == run) if runtime_dir else (recorded.parent == data_dir)
    assert stat.S_IMODE(recorded.stat().st_mode) == 0o600
    assert json.loads(recorded.read_text())["url"] == server.url
    assert recorded_url(data_dir) == server.url != "http://127.0.0.1:8000"

    sent = agentbox(server.env, server.home, "send", "session.exported", "project_id=ok",
                    "mix_url=/mixes/a.wav", "--wait", "--json")  # no --url: found
    assert sent.returncode == 0, sent.stderr
    assert json.loads(sent.stdout.split("\n", 1)[1])["status"] == "succeeded"
    elsewhere = agentbox({**server.env, "AGENTBOX_URL": "http://127.0.0.1:1"}, server.home,
                         "send", "session.exported", "project_id=ok", "mix_url=/m.wav",
                         "--retries", "0")  # AGENTBOX_URL comes before the file
    assert elsewhere.returncode == 3 and "127.0.0.1:1" in elsewhere.stderr

    server.kill9()  # its file stays behind, naming a port nothing listens on
    assert recorded.exists() and recorded_url(data_dir) is None
    server.start()
    wait_until(lambda: recorded_url(data_dir) == server.url, 10, "the new server's address")
    server.stop()  # a file left behind (SIGTERM ends the process) is passed over
    assert recorded_url(data_dir) is None
