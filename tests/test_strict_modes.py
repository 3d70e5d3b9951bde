"""What another account can change is refused (agentbox.ownership, as OpenSSH's
StrictModes): a group- or world-writable config file, token or secret file, or a
config, data or runtime folder another account owns, stops `agentbox serve` and
every client with exit status 2 and one sentence naming the path and its mode."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from agentbox.client import Client, NotTrusted
from tests.conftest import Server, free_port

NOBODY = 65534  # another account


def agentbox(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentbox", *args], env=server.env,
                          capture_output=True, text=True, timeout=60, cwd=server.home)


@pytest.fixture
def user(server_factory: Callable[..., Server], tmp_path: Path) -> Server:
    """A user's agentbox, not started: its config folder made, its runtime folder set."""
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    server = server_factory({"XDG_RUNTIME_DIR": str(run)})
    config = Path(server.env["XDG_CONFIG_HOME"]) / "agentbox"
    config.mkdir(parents=True, mode=0o700)
    (config / "admin_token").write_text("the-users-own-token-0123456789\n")
    (config / "admin_token").chmod(0o600)
    return server


def refused_everywhere(server: Server, path: Path, mode: str,
                       commands: tuple[str, ...] = ("serve", "runs", "token", "open")
                       ) -> None:
    for command in commands:
        args = {"serve": ["serve", "--port", str(free_port())],
                "open": ["open", "--print"]}.get(command, [command])
        found = agentbox(server, *args)
        assert found.returncode == 2, (args, found.stderr)
        assert found.stderr.count("\n") == 1 and "Traceback" not in found.stderr, found.stderr
        assert f"{path} is " in found.stderr and f"mode {mode}" in found.stderr, found.stderr
        assert "another account could change what agentbox trusts" in found.stderr
        assert "the-users-own-token" not in found.stdout + found.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes (Windows: not checked)")
@pytest.mark.parametrize("mode", [0o666, 0o664], ids=["world-writable", "group-writable"])
def test_a_writable_config_file_is_refused(user: Server, mode: int,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    toml = Path(user.env["XDG_CONFIG_HOME"]) / "agentbox" / "agentbox.toml"
    toml.write_text('log_level = "info"\n')
    toml.chmod(mode)
    refused_everywhere(user, toml, f"{mode:04o}")
    monkeypatch.setenv("XDG_CONFIG_HOME", user.env["XDG_CONFIG_HOME"])
    with pytest.raises(NotTrusted, match="writable by"):
        Client()
    toml.chmod(0o600)  # made the user's alone: served
    user.start()
    assert agentbox(user, "runs").returncode == 0


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes (Windows: not checked)")
def test_a_token_file_or_folder_of_another_account_is_refused(user: Server) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another account needs root")
    token = Path(user.env["XDG_CONFIG_HOME"]) / "agentbox" / "admin_token"
    token.chmod(0o622)
    refused_everywhere(user, token, "0622")
    token.chmod(0o600)
    data = Path(user.env["AGENTBOX_DATA_DIR"])
    data.mkdir(mode=0o700)
    os.chown(data, NOBODY, NOBODY)
    refused_everywhere(user, data, "0700")
    os.chown(data, os.getuid(), os.getgid())


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes (Windows: not checked)")
def test_a_runtime_folder_of_another_account_is_one_sentence_and_no_guess(
        user: Server) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a folder to another account needs root")
    folder = Path(user.env["XDG_RUNTIME_DIR"]) / "agentbox"
    folder.mkdir(mode=0o700)
    os.chown(folder, NOBODY, NOBODY)
    # (`agentbox token` reads no address: it goes on)
    refused_everywhere(user, folder, "0700", ("serve", "runs", "open"))
