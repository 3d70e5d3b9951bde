"""What another account can change is not trusted (as OpenSSH's StrictModes).

A configuration file names the config and data folders, the apps to import, the
callbacks allowed; the token and secret files are the keys to the page and the
receiver. Where another account of the machine owns one of them, or may write it
(a group- or world-writable file or folder), it could hand this user its own
configuration, token or code: `agentbox serve` and every client refuse to go on,
naming the path and its mode. POSIX only: on Windows the files' ACLs are not read
(agentbox makes its files under the user's profile, private by default there).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

from agentbox import config as cfg
from agentbox import portable


class Untrusted(Exception):
    """A file or folder agentbox reads its settings or keys from can be changed by
    another account: the sentence names it, its mode and what to do."""


def config_file(config_file: Path | None = None,
                environ: Mapping[str, str] | None = None) -> Path:
    """The configuration file load_settings reads (whether it exists or not)."""
    environ = os.environ if environ is None else environ
    given = config_file or (Path(environ[cfg.env_name("config")])
                            if environ.get(cfg.env_name("config")) else None)
    return given or cfg.default_config_dir() / cfg.CONFIG_FILE_NAME


def trusted_paths(settings: cfg.Settings, config: Path) -> Iterator[Path]:
    """What agentbox trusts: the config file, the config and data folders, and the token
    and secret files kept in the config folder."""
    yield config
    yield settings.config_dir
    for name in (cfg.ADMIN_TOKEN_FILE, cfg.WEBHOOK_SECRET_FILE, cfg.CALLBACK_SECRET_FILE,
                 cfg.PAGE_NAME_FILE):
        yield settings.config_dir / name
    yield settings.data_dir


def check(settings: cfg.Settings, config_file_used: Path | None = None,
          environ: Mapping[str, str] | None = None) -> None:
    """Untrusted for the first of `trusted_paths` another account can change."""
    for path in trusted_paths(settings, config_file(config_file_used, environ)):
        check_path(path)


def check_path(path: Path) -> None:
    why = portable.others_may_change(path)
    if why is not None:
        fix = "chmod 700" if path.is_dir() else "chmod 600"
        raise Untrusted(f"{path} is {why}, so another account could change what agentbox "
                        f"trusts: make it yours alone ({fix} {path}, and chown it to you)")
