"""A client proves the server before the admin token leaves (agentbox.proof), and the
running server's address file goes at every stop. Another account is played for
real: a program run as another uid (`setpriv`) listens on the port of a stopped
agentbox, or relays to a running one from another port, and records what it gets."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from agentbox.client import Client, NotProven, runtime_file
from tests.conftest import Server, free_port, wait_until

NOBODY = "65534"  # another account: not the server's user, no group of its
IMPOSTOR = Path(__file__).parent / "support" / "impostor.py"


class Impostor:
    """tests/support/impostor.py run as another account; `lines`, what it printed."""

    def __init__(self, port: int, relay_to: int | None = None) -> None:
        python = shutil.which("python3", path="/usr/bin:/bin")
        if os.geteuid() != 0 or shutil.which("setpriv") is None or python is None:
            pytest.skip("playing another account needs root, setpriv and python3")
        self.port = port
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python,
             "-I", "-c", IMPOSTOR.read_text(), str(port),
             *([str(relay_to)] if relay_to else [])],
            stdout=subprocess.PIPE, text=True, cwd="/")
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        wait_until(lambda: "listening" in self.lines, 30, "the impostor to listen")

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def received(self) -> str:
        """Everything clients sent, once every connection it accepted has closed."""
        wait_until(lambda: self.lines.count("closed") == self.lines.count("accepted"), 30,
                   "the impostor's connections to close")
        return "\n".join(line for line in self.lines if line.startswith("got "))

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(10)
        self._reader.join(10)
        assert self.process.stdout is not None
        self.process.stdout.close()


def agentbox(server: Server, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentbox", *args],
                          env={**server.env, **env}, capture_output=True, text=True,
                          timeout=60, cwd=server.home)


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    return run


def test_an_impostor_on_a_stopped_servers_port_gets_nothing(
        server_factory: Any, runtime: Path) -> None:
    server: Server = server_factory({"XDG_RUNTIME_DIR": str(runtime)})
    server.start()
    recorded = runtime_file(Path(server.env["AGENTBOX_DATA_DIR"]))
    assert json.loads(recorded.read_text())["url"] == server.url
    assert server.stop() == -signal.SIGTERM
    assert not recorded.exists()  # a clean stop takes its address with it
    token = server.admin_token()
    assert token

    impostor = Impostor(server.port)
    try:
        # No address file: the CLI goes by the configured port, where the impostor is.
        for args in (["runs"], ["open", "--print"], ["show", "run_0123"]):
            found = agentbox(server, *args, AGENTBOX_PORT=str(server.port))
            assert found.returncode == 3, (args, found.stdout, found.stderr)
            assert found.stderr.count("\n") == 1, found.stderr  # one sentence
            assert f"something else listens at {server.url}, not your agentbox" in \
                found.stderr and "nothing was sent to it" in found.stderr
            assert "code=" not in found.stdout
        with Client(server.url, admin_token=token) as box, pytest.raises(NotProven):
            box.runs()
        got = impostor.received()
    finally:
        impostor.stop()
    assert "agentbox-proof" in got  # it was asked to prove itself: and nothing else
    assert token not in got and "uthorization" not in got and "login-links" not in got \
        and "/runs" not in got, got


def test_an_impostor_relaying_to_the_real_agentbox_gets_nothing(server: Server) -> None:
    token = server.admin_token()
    assert token
    impostor = Impostor(free_port(), relay_to=server.port)
    try:
        url = f"http://127.0.0.1:{impostor.port}"
        found = agentbox(server, "runs", "--url", url)
        assert found.returncode == 3, found.stderr
        assert f"it answered for agentbox at 127.0.0.1:{server.port}, not for itself" in \
            found.stderr
        opened = agentbox(server, "open", "--print", "--url", url)
        assert opened.returncode == 3 and "code=" not in opened.stdout
        got = impostor.received()
    finally:
        impostor.stop()
    assert "agentbox-proof" in got
    assert token not in got and "uthorization" not in got and "login-links" not in got
    with Client(server.url, admin_token=token) as box:  # the real one, reached directly
        assert box.runs().runs == []


def test_a_proof_from_the_wrong_token_is_refused(server: Server) -> None:
    with Client(server.url, admin_token="another-token-of-32-characters!!") as box, \
            pytest.raises(NotProven, match="not made with your admin token"):
        box.runs()


def test_the_address_file_goes_at_ctrl_c_and_a_refused_serve_leaves_it(
        server_factory: Any, runtime: Path) -> None:
    server: Server = server_factory({"XDG_RUNTIME_DIR": str(runtime)})
    server.start()
    recorded = runtime_file(Path(server.env["AGENTBOX_DATA_DIR"]))
    before = recorded.read_text()
    second = agentbox(server, "serve", "--port", str(free_port()))  # the same data directory
    assert second.returncode == 1 and "agentbox" in second.stderr
    assert "Traceback" not in second.stderr
    assert recorded.read_text() == before  # the running server's, untouched
    server.stop(signal.SIGINT)
    assert not recorded.exists()


PROCESS_READER = """
import os, sys
seen = set()
while True:
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    line = f.read().replace(b"\\0", b" ").decode("utf-8", "replace")
            except OSError:
                continue
            if line not in seen:
                seen.add(line)
                print(line, flush=True)
"""


def test_agentbox_open_gives_chromium_no_secret_in_its_arguments(
        server_factory: Any, runtime: Path, tmp_path: Path) -> None:
    """The process list, read by another account while `agentbox open` runs with
    Chromium as the browser, shows the file it was given, never the login link; the
    link is used, the browser logged in, and the file gone."""
    from tests.support.browser import CHROMIUM, QUIET

    python = shutil.which("python3", path="/usr/bin:/bin")
    if os.geteuid() != 0 or shutil.which("setpriv") is None or python is None:
        pytest.skip("playing another account needs root, setpriv and python3")
    server: Server = server_factory({"XDG_RUNTIME_DIR": str(runtime)})
    server.start()
    dumped = tmp_path / "dom.html"
    browser = tmp_path / "browser.sh"  # what BROWSER names: headless Chromium
    browser.write_text(  # started in the background, as a desktop's browser is
        "#!/bin/sh\n"
        f"{CHROMIUM} --headless {' '.join(QUIET)} --user-data-dir={tmp_path}/profile "
        f"--timeout=30000 --dump-dom \"$1\" > {dumped} 2>/dev/null &\n")
    browser.chmod(0o700)
    reader = subprocess.Popen(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python,
         "-I", "-c", PROCESS_READER], stdout=subprocess.PIPE, text=True, cwd="/")
    seen: list[str] = []
    threading.Thread(target=lambda: seen.extend(reader.stdout or ()), daemon=True).start()
    try:
        wait_until(lambda: any("PROCESS_READER" in s or "/proc" in s for s in seen) or seen,
                   30, "the process list to be read")
        opened = agentbox(server, "open", BROWSER=f"{browser} %s")
        assert opened.returncode == 0, opened.stderr
        assert opened.stdout == ""  # nothing printed: the browser was opened
        wait_until(lambda: any("--dump-dom" in s for s in seen), 30,
                   "the reader to see Chromium's arguments")
    finally:
        reader.kill()
        reader.wait(10)
        if reader.stdout is not None:
            reader.stdout.close()
    handed = [s for s in seen if "--dump-dom" in s]
    assert any("file://" in s and "/open-" in s for s in handed), handed
    # no link to this server's login in any argument list (the reader sees every process
    # of the machine, the other test worker's too: a line is this test's when it names
    # this server's port)
    leaked = [s for s in seen if f":{server.port}/" in s and "code=" in s]
    assert leaked == []
    assert "code=" not in opened.stderr
    assert list(runtime.rglob("open-*.html")) == []  # the file gone after use
    # `agentbox open` returned 0 only once the server saw the link used (it waits for
    # that, GET /login-links/{id}): Chromium followed the file to the link. What
    # Chromium's --dump-dom prints after the move is not waited for: on a loaded
    # machine it may dump before the logged-in page has loaded.


def test_a_proxy_of_the_environment_never_gets_a_loopback_call(
        server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTP_PROXY would take the token unproved: to loopback, no proxy is used."""
    impostor = Impostor(free_port())  # as a proxy: it would answer, and record the token
    try:
        for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
            monkeypatch.setenv(name, f"http://127.0.0.1:{impostor.port}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        with Client(server.url, admin_token=server.admin_token()) as box:
            assert box.runs().runs == []
        assert impostor.received() == ""
    finally:
        impostor.stop()
