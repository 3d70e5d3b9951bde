"""agentbox's folders and files are its user's alone on POSIX (agentbox.files,
agentbox.portable): made so whatever the umask, and tightened at start where an
older version or a copy left them open. Real files in a temporary folder."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentbox import files
from agentbox.config import admin_token, ensure_webhook_secret, load_settings
from agentbox.store.sqlite import migrate_file
from tests.conftest import in_process, make_event

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes: on Windows "
                                "the profile folders' ACL keeps other users out")


@pytest.fixture
def loose_umask() -> Iterator[None]:
    """The umask most systems start programs with (files 644, folders 755)."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_everything_agentbox_makes_is_its_users_alone(tmp_path: Path, loose_umask: None,
                                                      anyio_backend: str) -> None:
    import anyio

    async def exercise() -> None:
        async with in_process(tmp_path / "home") as box:
            response = await box.post(make_event())
            assert response.status_code == 202
            settings = box.settings
            admin_token(settings, environ={})
            made = [settings.data_dir, settings.config_dir,
                    *settings.data_dir.rglob("*"), *settings.config_dir.rglob("*")]
            assert {p.name for p in made} >= {"agentbox.sqlite3", "agentbox.sqlite3-wal",
                                              "agentbox.sqlite3-shm", "agentbox.lock",
                                              "admin_token"}
            for path in made:
                expected = 0o700 if path.is_dir() else 0o600
                assert mode(path) == expected, (path, oct(mode(path)))

    anyio.run(exercise)


def test_loose_files_are_tightened_at_start_and_named(tmp_path: Path,
                                                       loose_umask: None) -> None:
    data, config = tmp_path / "agentbox-data", tmp_path / "agentbox-config"
    data.mkdir(mode=0o755)
    config.mkdir(mode=0o755)
    settings = load_settings(environ={}, overrides={"data_dir": data, "config_dir": config})
    ensure_webhook_secret(settings)
    migrate_file(settings.database_path)
    for path in (data / "agentbox.sqlite3", config / "webhook_secret"):
        path.chmod(0o644)  # as an older version, or a copy, left them
    (data / "watch").mkdir(mode=0o755)
    (data / "watch" / "abc.json").write_text("{}")
    os.chmod(data / "watch" / "abc.json", 0o644)
    (data / "archive").mkdir(mode=0o755)  # the archive of exports, as a copy left it
    said = files.tighten(settings)
    assert mode(data) == mode(config) == 0o700
    assert mode(data / "agentbox.sqlite3") == mode(config / "webhook_secret") == 0o600
    assert mode(data / "watch") == 0o700 and mode(data / "watch" / "abc.json") == 0o600
    assert mode(data / "archive") == 0o700
    assert any("agentbox.sqlite3" in line and "644" in line for line in said), said
    assert files.tighten(settings) == []  # once tight, nothing more to say


def test_a_folder_of_the_users_own_is_named_not_changed(tmp_path: Path,
                                                         loose_umask: None) -> None:
    shared = tmp_path / "music"
    shared.mkdir(mode=0o755)
    (shared / "mix.wav").write_bytes(b"RIFF")
    os.chmod(shared / "mix.wav", 0o644)
    settings = load_settings(environ={}, overrides={"data_dir": shared,
                                                    "config_dir": tmp_path / "config"})
    migrate_file(settings.database_path)
    os.chmod(settings.database_path, 0o644)
    said = files.tighten(settings)
    assert mode(shared) == 0o755 and mode(shared / "mix.wav") == 0o644  # the user's
    assert mode(settings.database_path) == 0o600  # agentbox's, in it
    assert any("chmod 700" in line and str(shared) in line for line in said), said


def test_the_store_keeps_its_files_private(tmp_path: Path, loose_umask: None) -> None:
    path = tmp_path / "deep" / "agentbox.sqlite3"
    migrate_file(path)  # as the store's open() does
    assert mode(path.parent) == 0o700 and mode(path) == 0o600
